"""Replica identity: which replica of a replica set owns a session, as the session's cookie and token name it.

A replica set is one instance run on several hosts with the same ``session_secret``; each replica
serves a forwarding port that only the other replicas reach (``transport.tcp``). A session names its
owner with three keys: ``nemo_gym_worker`` (the worker ID, as on one host), ``nemo_gym_replica``, the
replica's public address ``host:port`` (its identity: what clients and a 410 name), where ``host`` is
the instance's ``advertise_host`` or else its ``host``, and ``nemo_gym_forward_port``, the port on
that host where the other replicas forward to it. A session without ``nemo_gym_replica`` (minted by a
server that is no replica set, or before one became one) is this host's, as before.

An instance's ``replicas`` setting lists the root URLs of its replicas on other hosts, for clients:
Gym's own client spreads new sessions over the instance's URL and these (``nemo_gym.client.owner_pool``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import urlsplit

REPLICA_KEY = "nemo_gym_replica"
FORWARD_PORT_KEY = "nemo_gym_forward_port"
# Hosts that name every address of a host, none that another host could reach it at.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
# What a host in a replica address may be: a DNS name or an IPv4 address; an IPv6 address in brackets.
HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
# An instance's setting that lists its replicas' root URLs, and the ports those URLs mean without one.
REPLICAS_SETTING = "replicas"
DEFAULT_PORTS = {"http": 80, "https": 443}


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


def replica_url(value: object) -> str:
    """A replica's root URL as ``scheme://host:port`` (its port explicit); ValueError saying why it is none."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a URL")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as error:
        raise ValueError(f"{value!r} is not a URL: {error}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"{value!r} is not an http or https URL")
    if parts.username is not None or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{value!r} is not a server's root URL (only scheme, host and port)")
    host = (parts.hostname or "").lower()
    address = replica_address(host, port or DEFAULT_PORTS[scheme])
    if host in WILDCARD_HOSTS or parse_replica(address) is None:
        raise ValueError(f"{value!r} names no host a client could reach")
    return f"{scheme}://{address}"


def replica_urls(values: list) -> list[str]:
    """The root URLs a ``replicas`` setting lists (``replica_url``); ValueError for a bad one or a duplicate."""
    urls = [replica_url(value) for value in values]
    duplicates = sorted({url for url in urls if urls.count(url) > 1})
    if duplicates:
        raise ValueError(f"lists {', '.join(duplicates)} more than once")
    return urls


def other_replica_urls(settings: Mapping) -> list[str]:
    """The root URLs of an instance's replicas other than itself: its ``replicas``, less any at its own
    address (``host`` or ``advertise_host``, and ``port``), so that one list can serve every host."""
    listed = list(settings.get(REPLICAS_SETTING) or [])
    if not listed:
        return []
    own = {replica_address(str(host).lower(), int(settings["port"])) for host in (settings.get("host"), settings.get("advertise_host")) if host}
    return [url for url in replica_urls(listed) if url.split("://", 1)[1] not in own]


def replica_of(session: dict | None) -> object | None:
    """The replica a session names as its owner's (None for none: this host's)."""
    return None if session is None else session.get(REPLICA_KEY)


def replica_keys(replica: str, forward_port: int) -> dict[str, str | int]:
    """What a session (or token) of this replica carries besides its owner worker."""
    return {REPLICA_KEY: replica, FORWARD_PORT_KEY: forward_port}


def forward_address(session: Mapping) -> str | None:
    """``host:port`` of the forwarding port of the replica a session names; None if it names none validly."""
    parsed = parse_replica(session.get(REPLICA_KEY))
    port = session.get(FORWARD_PORT_KEY)
    if parsed is None or type(port) is not int or not 0 < port < 65536:
        return None
    return replica_address(parsed[0], port)


class ReplicaPeer(NamedTuple):
    """A worker of another replica, as the TCP transport reaches it: its ``worker`` ID, its ``replica`` (the
    replica's public address, which credentials name) and ``address``, the replica's forwarding port."""

    worker: str
    replica: str
    address: str


def replica_peer(worker: str, session: Mapping) -> ReplicaPeer | None:
    """Worker ``worker`` of the replica a session names; None if the session names no replica validly
    (not ``host:port``, or no forwarding port)."""
    address = forward_address(session)
    return None if address is None else ReplicaPeer(worker, session[REPLICA_KEY], address)


def route(owner: str, session: Mapping, replica: str | None) -> str | ReplicaPeer | None:
    """Where worker ``owner`` of the replica ``session`` names is reached from replica ``replica`` (None: no
    replica set): ``owner`` itself, a worker of this host (a session that names no replica, or this one);
    a ``ReplicaPeer``; or None for a session that names another replica, but not validly."""
    named = session.get(REPLICA_KEY)
    if replica is None or named is None or named == replica:
        return owner
    return replica_peer(owner, session)


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
