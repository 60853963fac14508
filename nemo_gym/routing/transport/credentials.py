"""Replica credentials: what proves that a request to a replica's forwarding port comes from another replica.

The sender puts one ``X-NeMo-Gym-Replica-Auth`` header on each forwarded request:
``<unix time> <worker> <body sha256> <mac>``, where the mac is HMAC-SHA256, under a key derived from
the shared ``session_secret`` (never the secret itself), of the method, the request target (as
sent), the replica the request is for, the worker it is for, the time, the headers that name its
session (every ``Cookie``, ``X-NeMo-Gym-Session-Token`` and ``X-NeMo-Gym-Session-Read``, the sender's
reading of the cookie, as sent, in order), the body's length and
the body's SHA-256. The receiver checks the mac as soon as the head is complete, with the length the
head declares, and the body against its digest before the app sees any of it (``transport.tcp``): a
credential read off the wire is good for the same request only, never for another body, another
session (even one of the same worker), path, replica or worker. It is accepted within the receiver's
window of its own clock either way: ``WINDOW_SECONDS`` (how well the clocks agree) plus its
``peer_dead_after_seconds`` (a replica frozen, by SIGSTOP or a stalled VM, reads what its peers sent
it when it resumes, and they wait that long before they count it dead, so what it reads then is
still served). Within the window the very same request can be sent again by whoever saw it, which TLS
between the replicas prevents (docs/replicas.md).

Bound to the session headers' raw values rather than to the session they name: the receiver checks
them before anything reads the session, and takes the sender's reading of the cookie as read (no second
verification of the cookie's signature: ``transport.private_server``).
The body is bound by its digest, so the sender knows the whole body before it sends the head (a
forward's body is bounded by ``max_body_bytes``; most come whole in one message anyway) and the
receiver refuses a bad credential before it reads any of the body, which cannot then be longer than
the sender's.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from nemo_gym.sessions.cookie import SESSION_READ_HEADER
from nemo_gym.sessions.worker import is_worker_id
from nemo_gym.sessions.token import TOKEN_HEADER_KEY

AUTH_HEADER = "X-NeMo-Gym-Replica-Auth"
AUTH_HEADER_KEY = AUTH_HEADER.lower().encode()
# How far a credential's time may be from the receiver's clock: the replicas' clocks must agree this well.
WINDOW_SECONDS = 10
KEY_CONTEXT = b"nemo-gym replica forwarding v3"
# The headers that name a request's session: the session cookie's, the MCP session token's, and the sending
# worker's reading of the cookie, which the receiver takes as read (so it does not verify the cookie again).
SESSION_HEADERS = (b"cookie", TOKEN_HEADER_KEY, SESSION_READ_HEADER)


def request_target(scope: dict) -> bytes:
    """The request line's target as the forwarder sends it and the receiver's server parses it."""
    target = scope.get("raw_path") or scope["path"].encode()
    return target + b"?" + scope["query_string"] if scope["query_string"] else target


def session_names(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The SHA-256 of the headers that name the request's session, names and values, in order."""
    digest = hashlib.sha256()
    for name, value in headers:
        if name in SESSION_HEADERS:
            digest.update(b"%s: %s\n" % (name, value))
    return digest.hexdigest().encode()


def body_digest(chunks: list[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


class ReplicaCredentials:
    def __init__(self, secret: str, window_seconds: float = WINDOW_SECONDS, context: bytes = KEY_CONTEXT) -> None:
        """``context``: what the key is derived for; another one's credentials are not valid here."""
        self.key = hmac.new(secret.encode(), context, hashlib.sha256).digest()
        self.window_seconds = window_seconds

    def mac(self, method: bytes, target: bytes, replica: str, worker: str, stamp: int, *bound: bytes) -> str:
        """``bound``: what else the mac covers."""
        message = b"\n".join([method, target, replica.encode(), worker.encode(), b"%d" % stamp, *bound])
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def header(
        self,
        method: bytes,
        target: bytes,
        replica: str,
        worker: str,
        headers: list[tuple[bytes, bytes]],
        body: list[bytes],
        stamp: int | None = None,
    ) -> tuple[bytes, bytes]:
        """The credential for sending the request (``headers`` as sent, the whole ``body``) to ``worker`` of ``replica``,
        made now (or at ``stamp``)."""
        stamp = int(time.time()) if stamp is None else stamp
        digest = body_digest(body)
        length = sum(len(chunk) for chunk in body)
        mac = self.mac(method, target, replica, worker, stamp, session_names(headers), b"%d" % length, digest.encode())
        return AUTH_HEADER_KEY, f"{stamp} {worker} {digest} {mac}".encode()

    def admit(self, value: bytes, method: bytes, target: bytes, replica: str, headers: list[tuple[bytes, bytes]], length: int) -> tuple[str, str] | None:
        """For a credential valid for this head (of a body of ``length`` bytes) on ``replica`` (this one): the worker
        it sends the request to, and the SHA-256 its body must have; None if it is not valid."""
        try:
            stamp_text, worker, digest, mac = value.decode("ascii").split(" ")
            stamp = int(stamp_text)
        except ValueError:
            return None
        if not is_worker_id(worker) or abs(time.time() - stamp) > self.window_seconds:
            return None
        expected = self.mac(method, target, replica, worker, stamp, session_names(headers), b"%d" % length, digest.encode())
        return (worker, digest) if hmac.compare_digest(expected, mac) else None
