"""Calling servers by name: the reading client, connections labelled by owner worker, and rollout drivers."""
