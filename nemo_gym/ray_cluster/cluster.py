"""This process's connection to the one Ray cluster of a ``gym env start``.

``join(address)`` makes this process a driver of the cluster at ``address`` (a GCS address
``host:port``, as upstream's ``ray_head_node_address``), or, given none, starts a local cluster
(one node, its processes children of this process that die with it) and returns its address, which
the launcher hands to every server process it starts: they join it, none starts one of its own.
``leave()`` disconnects (and stops the local cluster, if this process started it). Nothing here runs
``ray stop``, which kills Ray's processes by name across the whole machine.
"""

from __future__ import annotations

from types import ModuleType

from nemo_gym.ray_cluster.need import RayMissing, is_ray_missing


def ray_module(what: str) -> ModuleType:
    """``ray``, or ``RayMissing`` naming ``what`` needs it and the extra that installs it."""
    try:
        import ray
    except ImportError as error:
        if is_ray_missing(error):
            raise RayMissing(what) from None
        raise
    return ray


def join(address: str | None, what: str = "this process") -> tuple[str, bool]:
    """Connect to the cluster at ``address`` or, without one, start a local cluster: its GCS address, and
    whether it was started here. A process already connected stays on its cluster."""
    ray = ray_module(what)
    if ray.is_initialized():
        return ray.get_runtime_context().gcs_address, False
    if address:
        ray.init(address=address, ignore_reinit_error=True)
    else:
        ray.init(ignore_reinit_error=True)
    return ray.get_runtime_context().gcs_address, not address


def leave() -> None:
    """Disconnect this process from its cluster; a local cluster it started stops with it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
