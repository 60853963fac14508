"""Replica identity: which replica of a replica set owns a session, as the session's cookie and token name it.

A replica set is one instance run on several hosts with the same ``session_secret``; each replica
serves a forwarding port that only the other replicas reach (``transport.tcp``). A session names its
owner with two keys: ``nemo_gym_worker`` (the worker ID, as on one host) and ``nemo_gym_replica``,
the address ``host:port`` of its replica's forwarding port, where ``host`` is the instance's
``advertise_host`` or else its ``host``. A session without ``nemo_gym_replica`` (minted by a server
that is no replica set, or before one became one) is this host's, as before.
"""

from __future__ import annotations

import ipaddress
import re

REPLICA_KEY = "nemo_gym_replica"
# Hosts that name every address of a host, none that another host could reach it at.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
# What a host in a replica address may be: a DNS name or an IPv4 address; an IPv6 address in brackets.
HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def replica_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_replica(value: object) -> tuple[str, int] | None:
    """The host and port a replica address names; None for anything that is not one."""
    if not isinstance(value, str):
        return None
    host, colon, port = value.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
        return host[1:-1], int(port)
    return (host, int(port)) if HOST_NAME.fullmatch(host) else None


def replica_of(session: dict | None) -> object | None:
    """The replica a session names as its owner's (None for none: this host's)."""
    return None if session is None else session.get(REPLICA_KEY)


def owner_label(worker: str, replica: str) -> str:
    """How a reply names a worker of another replica."""
    return f"{worker} of replica {replica}"


class ReplicaAddressError(ValueError):
    """No address the other replicas could reach this one at."""


def advertised_host(host: str, advertise_host: str | None) -> str:
    """Where the other replicas reach this one: ``advertise_host``, else ``host`` unless it is a wildcard."""
    if advertise_host:
        return advertise_host
    if host in WILDCARD_HOSTS:
        raise ReplicaAddressError(
            f"host {host!r} is a wildcard, which the other replicas cannot reach: set advertise_host to this host's "
            "address on their network"
        )
    return host
