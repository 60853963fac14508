"""The Unix transport: a server's workers on one host, reached over private Unix sockets with abstract names.

Each worker has two names in Linux's abstract Unix socket namespace, not files: its private socket
(``<worker>.sock``, where siblings forward it its sessions' requests) and its life name
(``<worker>.life``, a bound socket that never listens, held for as long as it serves). Each is
``"\\0nemo_gym" + socket_dir + "/" + worker + suffix``, so the socket directory's path tells one
server's workers from another's; the directory itself holds only the placement counters.

Whether a worker is alive is what the kernel vouches for, never what a failed connect or a missing
file suggests: the kernel frees a name when the process ends, however it ends, and no file stands for
it, so a cleaner of /tmp cannot free it early. A life name that can be taken means the worker is
dead; a worker that is merely busy (its socket's backlog full) still holds it. Names are per network
namespace, so liveness is per host. Abstract names have no file permissions, so both ends of a
private connection check that the other runs as the same user.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import AsyncIterator

from starlette.types import ASGIApp

from nemo_gym.protocols.input_limits import InputLimits, LimitedHttpToolsProtocol
from nemo_gym.routing.transport.connection import OwnerConnection, PooledTransport
from nemo_gym.routing.transport.private_server import PrivateServer

ABSTRACT_PREFIX = "\0nemo_gym"
SOCKET_SUFFIX = ".sock"
LIFE_SUFFIX = ".life"
# The credentials of a Unix socket's peer: pid, uid, gid.
PEER_CREDENTIALS = struct.Struct("3i")
# One line per Unix socket of this network namespace, and the type column's value for SOCK_STREAM.
UNIX_SOCKETS = "/proc/net/unix"
STREAM_TYPE = "0001"
# A connection that breaks with no reply is a dead owner's only once its life name is free: the kernel
# closes a killed process's sockets one after the other, so its life name is waited for this long,
# looked at with pauses growing from the first to the last, before the owner counts as alive.
OWNER_DEATH_WAIT_SECONDS = 1
FIRST_PAUSE_SECONDS = 0.005
LAST_PAUSE_SECONDS = 0.25


def abstract_name(socket_dir: str, worker_id: str, suffix: str) -> str:
    return f"{ABSTRACT_PREFIX}{socket_dir}/{worker_id}{suffix}"


def socket_address(socket_dir: str, worker_id: str) -> str:
    """Where the worker's private server listens."""
    return abstract_name(socket_dir, worker_id, SOCKET_SUFFIX)


def life_name(socket_dir: str, worker_id: str) -> str:
    return abstract_name(socket_dir, worker_id, LIFE_SUFFIX)


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


class LifeName:
    """The name a worker holds from the moment it serves its sessions until it stops."""

    def __init__(self, socket_dir: str, worker_id: str) -> None:
        self.name = life_name(socket_dir, worker_id)
        self.socket: socket.socket | None = None

    def hold(self) -> None:
        """Take the name; ``OSError`` (address in use) if a process holds it already."""
        self.socket = bound(self.name)

    def release(self) -> None:
        if self.socket is not None:
            self.socket.close()
            self.socket = None


def bound(name: str) -> socket.socket:
    """A stream socket bound to ``name``; ``OSError`` if it is taken."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)
    except BaseException:
        sock.close()
        raise
    return sock


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


async def open_connection(address: str) -> OwnerConnection:
    """A new connection to the private socket ``address``; ``OSError`` if it takes none."""
    # Connected here: uvloop takes no abstract name (EINVAL). A Unix socket connects at once,
    # or fails at once (BlockingIOError while the owner's backlog is full).
    sock = connect_same_user(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK), address)
    _, connection = await asyncio.get_running_loop().create_unix_connection(OwnerConnection, sock=sock)
    return connection


def connect_same_user(sock: socket.socket, address: str) -> socket.socket:
    """``sock`` connected to ``address``, a socket of a process of this user; closed, and ``OSError``, if not."""
    try:
        sock.connect(address)
        if not same_user(sock):  # someone else took a dead worker's name
            raise ConnectionRefusedError(f"the process at {address!r} runs as another user")
    except BaseException:
        sock.close()
        raise
    return sock


class SameUserOnly(LimitedHttpToolsProtocol):
    """The limited HTTP protocol, for peers of this process's user only (an abstract name has no file mode)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not same_user(transport.get_extra_info("socket")):
            transport.abort()


class UnixTransport(PooledTransport):
    """The ``Transport`` of the workers that share ``socket_dir`` on this host; a peer is a sibling's worker ID."""

    def __init__(self, socket_dir: str) -> None:
        super().__init__()
        self.socket_dir = socket_dir

    def address(self, peer: str) -> str:
        """A sibling's connections are kept under its worker ID (its socket's name follows from it)."""
        return peer

    async def open_connection(self, address: str) -> OwnerConnection:
        return await open_connection(socket_address(self.socket_dir, address))

    def is_alive(self, peer: str) -> bool:
        return is_alive(self.socket_dir, peer)

    async def proves_dead(self, peer: str) -> bool:
        """Its life name is free now or within ``OWNER_DEATH_WAIT_SECONDS``."""
        deadline = asyncio.get_running_loop().time() + OWNER_DEATH_WAIT_SECONDS
        pause = FIRST_PAUSE_SECONDS
        while self.is_alive(peer):
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(pause)
            pause = min(2 * pause, LAST_PAUSE_SECONDS)
        return True

    def stamper(self, peer: str) -> None:
        """Siblings of one host need no credential: the kernel vouches for the user at either end."""
        return None

    def worker_of(self, peer: str) -> str:
        return peer

    def lost_owner(self, peer: str) -> str:
        return peer

    def busy_detail(self, peer: str, waited_seconds: float) -> str:
        return f"Worker {peer}, which owns this session, is alive but took no connection for {waited_seconds:g} s; the session is intact. Retry later."

    @contextlib.asynccontextmanager
    async def serving(self, worker_id: str, app: ASGIApp | None, limits: InputLimits) -> AsyncIterator[None]:
        """The private socket serves first; the life name is held from then until the socket is gone,
        so that while the worker can be reached, it is alive."""
        async with contextlib.AsyncExitStack() as stack:
            life = LifeName(self.socket_dir, worker_id)
            stack.callback(life.release)
            if app is not None:
                # Only this user's processes reach it: the forwarding worker's reading of the session is taken as read.
                private = PrivateServer(app, limits.for_siblings(), SameUserOnly, trusts_readings=True)
                await private.start(bound(socket_address(self.socket_dir, worker_id)))
                stack.push_async_callback(private.stop)
            life.hold()
            yield
