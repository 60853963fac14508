"""Worker identity: each worker of a multi-worker server has a random ID and a socket named after it."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile

OWNER_KEY = "nemo_gym_worker"
SOCKET_DIR_ENV = "NEMO_GYM_SOCKET_DIR"
# On every routed reply: the worker whose public socket accepted the connection, which it stays with.
WORKER_HEADER = "X-NeMo-Gym-Worker"
WORKER_ID_PATTERN = re.compile(r"[0-9a-f]{16}")


def new_worker_id() -> str:
    """Random, so a worker that uvicorn starts in place of a dead one is never mistaken for it."""
    return secrets.token_hex(8)


def is_worker_id(value: object) -> bool:
    """Only values of this exact form ever become part of a socket path."""
    return isinstance(value, str) and WORKER_ID_PATTERN.fullmatch(value) is not None


def socket_path(socket_dir: str, worker_id: str) -> str:
    return os.path.join(socket_dir, f"{worker_id}.sock")


def make_socket_dir() -> str:
    """A 0700 directory under /tmp, short enough that every socket path fits AF_UNIX's 108 bytes."""
    return tempfile.mkdtemp(prefix="ngw-", dir="/tmp")


def remove_socket_dir(socket_dir: str) -> None:
    shutil.rmtree(socket_dir, ignore_errors=True)
