"""Worker identity: each worker of a multi-worker server has a random ID, which its sessions name as their owner.

Shared by whoever reads a session's owner: the router, the durable store, the lifecycle, the client.
Only values of a worker ID's exact form are ever routed to, so a forged owner can name no other place
(a transport derives its names and addresses from the ID, ``nemo_gym.routing.transport``).
"""

from __future__ import annotations

import re
import secrets

OWNER_KEY = "nemo_gym_worker"
# On every routed reply: the worker whose public socket accepted the connection, which it stays with.
WORKER_HEADER = "X-NeMo-Gym-Worker"
WORKER_ID_PATTERN = re.compile(r"[0-9a-f]{16}")


def new_worker_id() -> str:
    """Random, so a worker that uvicorn starts in place of a dead one is never mistaken for it."""
    return secrets.token_hex(8)


def is_worker_id(value: object) -> bool:
    """Only values of this exact form ever become part of a socket path."""
    return isinstance(value, str) and WORKER_ID_PATTERN.fullmatch(value) is not None
