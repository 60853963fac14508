"""How a worker reaches its siblings: the ``Transport`` protocol and its implementations, chosen by name.

- ``base``: the protocol, over peers (connect to a peer, whether it is alive or proves dead, forget it,
  stamp its credential, name it in replies, serve the peers' forwarded requests and be alive meanwhile).
- ``connection``: HTTP/1.1 connections to a peer, and the pool that keeps them alive (every transport's).
- ``private_server``: the worker's app served again on a listener of the transport's.
- ``unix``: today's transport, the workers of one host over private Unix sockets with abstract names.
- ``tcp``: the replicas of a replica set, each on its host, over their forwarding ports; used beside
  ``unix`` (a replica's own workers still reach each other over it), built by the server, not by name.
- ``credentials``: what a request to a forwarding port carries to prove it comes from a replica.
- ``replica_port``: a replica's forwarding port, which admits only requests with a valid credential.
- ``hand_off``: on one host, a client's connection passed whole to the worker that owns its session, beside
  the ``unix`` transport's private sockets (a descriptor cannot cross hosts): the exchange, and its sender.
- ``hand_off_receiver``: the worker's hand-off socket, which serves what it is handed as its public port would.

A new transport is one module that implements ``Transport`` (on ``connection.PooledTransport``) and one
line in ``TRANSPORTS``.
"""

from __future__ import annotations

from uvicorn.importer import import_from_string

from nemo_gym.routing.transport.base import Transport

# Each is built with a directory of this host that only the server's workers share (the launcher's).
TRANSPORTS = {"unix": "nemo_gym.routing.transport.unix:UnixTransport"}
DEFAULT_TRANSPORT = "unix"


def transport_class(name: str = DEFAULT_TRANSPORT) -> type[Transport]:
    """The implementation ``TRANSPORTS`` names, imported only when chosen."""
    return import_from_string(TRANSPORTS[name])
