"""Replica credentials: what proves that a request to a replica's forwarding port comes from another replica.

The sender puts one ``X-NeMo-Gym-Replica-Auth`` header on each forwarded request:
``<unix time> <worker> <mac>``, where the mac is HMAC-SHA256, under a key derived from the shared
``session_secret`` (never the secret itself), of the method, the request target (path and query, as
sent), the replica the request is for, the worker it is for and the time. The receiver recomputes it
for the request it got and for itself as the replica, and accepts it only within its window of its
own clock either way: such a header cannot be sent to another path, replica or worker, nor used
later. A replica's window is ``WINDOW_SECONDS`` (how well the clocks agree) plus its
``peer_dead_after_seconds``: a replica frozen (SIGSTOP, a stalled VM) reads what its peers sent it
when it resumes, and they wait that long before they count it dead, so what it reads then is still
served. Within the window a header can be replayed to the same target by whoever saw it on the wire,
which TLS between the replicas prevents (README, "A replica set").
"""

from __future__ import annotations

import hashlib
import hmac
import time

from nemo_gym.routing.worker import is_worker_id

AUTH_HEADER = "X-NeMo-Gym-Replica-Auth"
AUTH_HEADER_KEY = AUTH_HEADER.lower().encode()
# How far a credential's time may be from the receiver's clock: the replicas' clocks must agree this well.
WINDOW_SECONDS = 10
KEY_CONTEXT = b"nemo-gym replica forwarding v1"


def request_target(scope: dict) -> bytes:
    """The request line's target as the forwarder sends it and the receiver's server parses it."""
    target = scope.get("raw_path") or scope["path"].encode()
    return target + b"?" + scope["query_string"] if scope["query_string"] else target


class ReplicaCredentials:
    def __init__(self, secret: str, window_seconds: float = WINDOW_SECONDS, context: bytes = KEY_CONTEXT) -> None:
        """``context``: what the key is derived for; another one's credentials are not valid here."""
        self.key = hmac.new(secret.encode(), context, hashlib.sha256).digest()
        self.window_seconds = window_seconds

    def mac(self, method: bytes, target: bytes, replica: str, worker: str, stamp: int) -> str:
        message = b"\n".join([method, target, replica.encode(), worker.encode(), b"%d" % stamp])
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def header(self, scope: dict, replica: str, worker: str) -> tuple[bytes, bytes]:
        """The credential for forwarding ``scope``'s request to ``worker`` of ``replica``, now."""
        stamp = int(time.time())
        mac = self.mac(scope["method"].encode(), request_target(scope), replica, worker, stamp)
        return AUTH_HEADER_KEY, f"{stamp} {worker} {mac}".encode()

    def worker(self, value: bytes, scope: dict, replica: str) -> str | None:
        """The worker a credential sends ``scope``'s request to on ``replica`` (this one); None if it is not valid."""
        try:
            stamp_text, worker, mac = value.decode("ascii").split(" ")
            stamp = int(stamp_text)
        except ValueError:
            return None
        if not is_worker_id(worker) or abs(time.time() - stamp) > self.window_seconds:
            return None
        expected = self.mac(scope["method"].encode(), request_target(scope), replica, worker, stamp)
        return worker if hmac.compare_digest(expected, mac) else None
