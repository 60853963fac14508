"""Whether a worker is alive, as the kernel vouches for it, never as a failed connect or a missing file suggests.

Each worker holds a name of its own in the abstract Unix socket namespace (``<worker>.life``, see
``worker``) for as long as it serves. The kernel frees the name when the process ends, however it ends,
and no file stands for it, so a cleaner of /tmp cannot free it early: a name that can be taken means the
worker is dead; a worker that is merely busy (its socket's backlog full) still holds it. Names are per
network namespace, so liveness is per host.
"""

from __future__ import annotations

import socket

from nemo_gym.routing.worker import abstract_name

LIFE_SUFFIX = ".life"
# One line per Unix socket of this network namespace, and the type column's value for SOCK_STREAM.
UNIX_SOCKETS = "/proc/net/unix"
STREAM_TYPE = "0001"


def life_name(socket_dir: str, worker_id: str) -> str:
    return abstract_name(socket_dir, worker_id, LIFE_SUFFIX)


class LifeName:
    """The name a worker holds from the moment it serves its sessions until it stops."""

    def __init__(self, socket_dir: str, worker_id: str) -> None:
        self.name = life_name(socket_dir, worker_id)
        self.socket: socket.socket | None = None

    def hold(self) -> None:
        """Take the name; ``OSError`` (address in use) if a process holds it already."""
        held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            held.bind(self.name)
        except BaseException:
            held.close()
            raise
        self.socket = held

    def release(self) -> None:
        if self.socket is not None:
            self.socket.close()
            self.socket = None


def is_alive(socket_dir: str, worker_id: str) -> bool:
    """True while the worker's process lives and serves (its name is held); False once it is gone.

    Asking takes the name for the time of a ``bind`` when it is free, which only a dead worker's is.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(life_name(socket_dir, worker_id))
        except OSError:  # in use; or, failing for any other reason, not known dead: never adopt on a doubt
            return True
    return False


def life_sockets(socket_dir: str) -> dict[str, str]:
    """The live workers of the server whose socket directory this is: worker ID -> socket inode."""
    prefix = "@" + abstract_name(socket_dir, "", "")[1:]  # the table shows the leading NUL as "@"
    held = {}
    with open(UNIX_SOCKETS) as table:
        next(table)
        for line in table:
            fields = line.split()
            if len(fields) == 8 and fields[4] == STREAM_TYPE and fields[7].startswith(prefix) and fields[7].endswith(LIFE_SUFFIX):
                held[fields[7][len(prefix) : -len(LIFE_SUFFIX)]] = fields[6]
    return held


def live_workers(socket_dir: str) -> int:
    """How many workers serve from this socket directory now: the launcher's readiness check."""
    return len(life_sockets(socket_dir))
