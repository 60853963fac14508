"""Ports for servers: a free one to give a server that names none, and whether one is taken.

``free_port`` draws a port at random below the kernel's ephemeral range: a port of that range (what binding
port 0 gives) may be taken next as the source port of any outgoing connection, and a server started on it then
fails with "address already in use". A port it hands out is one nothing holds now, and one no process of this
user was handed in the last ``RESERVED_SECONDS``: each is reserved by a file named after it in a directory every
drawing process reads under one lock (``NEMO_GYM_PORT_RESERVATIONS``, else ``nemo_gym_ports_<uid>`` in the
temporary directory). A port given to a server that has not bound it yet is so never given to another: two
tests, or a test and the ``gym env start`` it runs, drawing at once on a loaded machine did. Where the directory
cannot be kept, ports are drawn without it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from nemo_gym.env import DEFAULT_HOST

# Where ``free_port`` draws from (above the well-known services, below Linux's default ephemeral range), and how often.
FREE_PORTS = (10000, 32767)
FREE_PORT_TRIES = 100
EPHEMERAL_PORTS_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
# The system's randomness, not the module's: forked processes and tests that seed ``random`` would draw alike.
PORT_DRAW = random.SystemRandom()
RESERVATIONS_ENV = "NEMO_GYM_PORT_RESERVATIONS"
# How long a port handed out is not handed out again: longer than a server takes to bind it on a loaded machine.
RESERVED_SECONDS = 120


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port of ``host`` that nothing holds now and no process was handed lately (the module says why); the
    kernel's choice where none is left below the ephemeral range."""
    low, high = FREE_PORTS
    ephemeral = ephemeral_ports()
    if ephemeral is not None:
        high = min(high, ephemeral[0] - 1)
    with reservations() as directory:
        for _ in range(FREE_PORT_TRIES if low <= high else 0):
            port = PORT_DRAW.randint(low, high)
            if (directory is not None and reserved(directory, port)) or not bindable(host, port):
                continue
            if directory is not None:
                with contextlib.suppress(OSError):
                    (directory / str(port)).touch()
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def reservations() -> Iterator[Path | None]:
    """The reservations directory, locked for this process until the block ends; None where it cannot be kept."""
    directory = Path(os.environ.get(RESERVATIONS_ENV) or Path(tempfile.gettempdir()) / f"nemo_gym_ports_{os.getuid()}")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        yield None
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield directory
    finally:
        os.close(lock)


def reserved(directory: Path, port: int) -> bool:
    """Whether ``port`` was handed out in the last ``RESERVED_SECONDS``."""
    try:
        return time.time() - (directory / str(port)).stat().st_mtime < RESERVED_SECONDS
    except OSError:
        return False


def bindable(host: str, port: int, reuse_address: bool = False) -> bool:
    """Whether a socket could bind ``host:port`` now; without ``reuse_address`` (SO_REUSEADDR) a port with connections
    still closing is taken too. Failures other than the port being in use (a host not on this machine) raise OSError."""
    with socket.socket() as sock:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def ephemeral_ports() -> tuple[int, int] | None:
    """The kernel's range of source ports for outgoing connections (Linux), or None where it cannot be read."""
    try:
        low, high = (int(bound) for bound in Path(EPHEMERAL_PORTS_FILE).read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on ``host:port``; other failures (a host not on this machine) raise OSError."""
    return not bindable(host, port, reuse_address=True)
