"""Worker identity: each worker of a multi-worker server has a random ID, and names of its own derived from it.

A worker's private socket, and the name that says it lives (``liveness``), are names in Linux's abstract
Unix socket namespace, not files: a cleaner of old files in /tmp cannot delete them, and the kernel frees
one when the process holding it ends. Each is ``"\\0nemo_gym" + socket_dir + "/" + worker + suffix``, so
the socket directory's path tells one server's workers from another's. Abstract names have no file
permissions, so both ends of a private connection check that the other runs as the same user.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import struct
import tempfile

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


ABSTRACT_PREFIX = "\0nemo_gym"
# The credentials of a Unix socket's peer: pid, uid, gid.
PEER_CREDENTIALS = struct.Struct("3i")


def abstract_name(socket_dir: str, worker_id: str, suffix: str) -> str:
    return f"{ABSTRACT_PREFIX}{socket_dir}/{worker_id}{suffix}"


def socket_address(socket_dir: str, worker_id: str) -> str:
    """Where the worker's private server listens."""
    return abstract_name(socket_dir, worker_id, ".sock")


def same_user(sock: socket.socket) -> bool:
    """Whether the process at the other end of a connected Unix socket runs as this process's user."""
    _, uid, _ = PEER_CREDENTIALS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER_CREDENTIALS.size))
    return uid == os.getuid()


def make_socket_dir() -> str:
    """A 0700 directory under /tmp (the placement counters' folder, and in its path the server's names),
    short enough that every abstract name fits AF_UNIX's 108 bytes."""
    return tempfile.mkdtemp(prefix="ngw-", dir="/tmp")


def remove_socket_dir(socket_dir: str) -> None:
    shutil.rmtree(socket_dir, ignore_errors=True)
