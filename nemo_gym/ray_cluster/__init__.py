"""Ray, an optional extra (``pip install -e '.[ray]'``): which servers need it, the one cluster a
``gym env start`` joins or starts, and the replicas it places on the cluster's nodes (docs/ray.md)."""
