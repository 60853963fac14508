"""A worker's hand-off socket: the receiver's side of the exchange ``hand_off`` describes.

It takes its siblings' connections, answers each, and serves those its sender says are its own as the server of
the port that accepted it would (the public port's; in a replica set, the forwarding port's): uvicorn's own protocol,
with the bytes handed fed before anything read from the socket here, and the sender's reading of the session of the
request they begin taken as read for that request (as a forwarding sibling's is, ``transport.private_server``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import struct

from nemo_gym.metrics.meters import METERS
from nemo_gym.process.public_server import TakesConnections
from nemo_gym.routing.transport.hand_off import MAX_MESSAGE_BYTES, READING_LENGTH, RECEIVED, YOURS, hand_off_address
from nemo_gym.routing.transport.unix import same_user
from nemo_gym.sessions.cookie import SESSION_READ_SCOPE_KEY, decoded_reading

# The control message of one descriptor.
ONE_FD_SPACE = socket.CMSG_SPACE(struct.calcsize("i"))
# Hand-offs queued at a listener that has not accepted them yet.
BACKLOG = 64

logger = logging.getLogger(__name__)


class HandOffReceiver:
    """A worker's hand-off socket: takes its siblings' connections and serves each as the server of its port would:
    ``public`` (None: one that is none of this worker's), or the one of ``ports`` (port -> server) that accepted it."""

    def __init__(self, socket_dir: str, worker_id: str, public: TakesConnections | None, ports: dict[int, TakesConnections] | None = None) -> None:
        self.address = hand_off_address(socket_dir, worker_id)
        self.public = public
        self.ports = ports or {}
        self.listener: socket.socket | None = None
        # Per sibling's connection, the hand-offs answered and not yet replied to, oldest first: (descriptor, the bytes
        # read from it, what its first request's scope is to hold: the sender's reading of its session, or None).
        self.peers: dict[socket.socket, collections.deque[tuple[int, bytes, dict | None]]] = {}
        # Per sibling's connection, the answers read and not yet sent (its socket had no room).
        self.owed: dict[socket.socket, int] = {}
        self.adopting: set[asyncio.Task] = set()
        self.buffer = bytearray(MAX_MESSAGE_BYTES)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            listener.bind(self.address)
            listener.listen(BACKLOG)
        except BaseException:
            listener.close()
            raise
        self.listener = listener
        loop.add_reader(listener.fileno(), self.accept)

    def accept(self) -> None:
        while True:
            try:
                peer, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # out of descriptors, say: the sender's queued hand-offs wait, or it forwards
                logger.warning("hand-off socket accept failed: %s", error)
                return
            if not same_user(peer):
                peer.close()
                continue
            peer.setblocking(False)
            self.peers[peer] = collections.deque()
            asyncio.get_running_loop().add_reader(peer.fileno(), self.read, peer)

    def read(self, peer: socket.socket) -> None:
        """One message from ``peer``: the loop calls again while more wait (a read that finds none costs a system call
        and an exception, on every hand-off)."""
        try:
            size, ancillary, flags, _ = peer.recvmsg_into([self.buffer], ONE_FD_SPACE, socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            logger.warning("hand-off socket read failed: %s", error)
            self.drop(peer)
            return
        fds = [fd for level, kind, data in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS for fd in descriptors(data)]
        if not size and not fds:
            self.drop(peer)
            return
        handed = split(self.buffer, size) if fds else None
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) > 1 or (not fds and size != 1) or (fds and handed is None):
            for fd in fds:
                os_close(fd)
            self.drop(peer)  # unanswered: its sender forwards what it sent
            return
        if not fds:  # the sender's reply to the oldest hand-off answered
            if not self.peers[peer]:
                self.drop(peer)
                return
            self.settle(peer)
            return
        self.peers[peer].append((fds[0], *handed))
        self.owed[peer] = self.owed.get(peer, 0) + 1
        self.answer(peer)

    def answer(self, peer: socket.socket) -> bool:
        """Send the answers owed to ``peer``; whether all went. Where its socket has no room (a flood answered at
        once), reading from it pauses until they went: a hand-off whose sender already replied "yours" must never
        be closed unserved, as dropping the sibling would do."""
        loop = asyncio.get_running_loop()
        while self.owed.get(peer):
            try:
                peer.send(RECEIVED)
            except BlockingIOError:
                loop.remove_reader(peer.fileno())
                loop.add_writer(peer.fileno(), self.resume, peer)
                return False
            except OSError:
                self.drop(peer)
                return False
            self.owed[peer] -= 1
        return True

    def resume(self, peer: socket.socket) -> None:
        if self.answer(peer):
            loop = asyncio.get_running_loop()
            loop.remove_writer(peer.fileno())
            loop.add_reader(peer.fileno(), self.read, peer)

    def adopt(self, fd: int, data: bytes, handed_scope: dict | None) -> None:
        """Serve the connection ``fd`` as if this worker's server of its port had accepted it, ``data`` as its first bytes
        read, its first request's scope holding ``handed_scope`` too."""
        try:
            client = socket.socket(fileno=fd)
        except OSError:
            os_close(fd)
            return
        if client.type != socket.SOCK_STREAM or client.family not in (socket.AF_INET, socket.AF_INET6):
            client.close()
            return
        server = self.ports.get(client.getsockname()[1], self.public)
        if server is None:
            client.close()
            return
        client.setblocking(False)
        METERS.hand_offs_received.inc()

        def protocol() -> asyncio.Protocol:
            made = server.protocol(received=data, handed_scope=handed_scope)
            if server.should_exit:
                # Taken during a graceful stop, after uvicorn asked its connections to finish: this one finishes its request too.
                asyncio.get_running_loop().call_soon(made.shutdown)
            return made

        task = asyncio.get_running_loop().create_task(self.connect(protocol, client))
        self.adopting.add(task)
        task.add_done_callback(self.adopting.discard)

    @staticmethod
    async def connect(protocol, client: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(protocol, client)
        except OSError as error:
            logger.warning("a handed-off connection could not be served: %s", error)
            client.close()

    def drop(self, peer: socket.socket) -> None:
        """Close a sibling's connection, and every connection it handed here that it did not say was this worker's.
        What it said before is read first: a sender that let go of a connection it called this worker's left it here."""
        self.drain(peer)
        loop = asyncio.get_running_loop()
        loop.remove_reader(peer.fileno())
        loop.remove_writer(peer.fileno())
        self.owed.pop(peer, None)
        for fd, *_ in self.peers.pop(peer, ()):
            os_close(fd)
        peer.close()

    def drain(self, peer: socket.socket) -> None:
        """Act on the sender's replies still queued on ``peer``, in order; a hand-off behind them is closed unanswered."""
        while self.peers.get(peer):
            try:
                size, ancillary, _, _ = peer.recvmsg_into([self.buffer], ONE_FD_SPACE, socket.MSG_CMSG_CLOEXEC)
            except OSError:
                return
            fds = [fd for level, kind, data in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS for fd in descriptors(data)]
            if fds or size != 1:
                for fd in fds:
                    os_close(fd)
                if not size:
                    return
                continue
            self.settle(peer)

    def settle(self, peer: socket.socket) -> None:
        """The sender's reply just read, to the oldest hand-off answered: serve it, or close it (taken back)."""
        fd, data, handed_scope = self.peers[peer].popleft()
        if self.buffer[0] == YOURS[0]:
            self.adopt(fd, data, handed_scope)
        else:
            os_close(fd)

    async def stop(self) -> None:
        if self.listener is not None:
            asyncio.get_running_loop().remove_reader(self.listener.fileno())
            self.listener.close()
            self.listener = None
        for peer in list(self.peers):
            self.drop(peer)
        for task in list(self.adopting):
            with contextlib.suppress(Exception):
                await task


def descriptors(data: bytes) -> list[int]:
    """The descriptors an SCM_RIGHTS control message carries (whole ints only)."""
    whole = len(data) - len(data) % struct.calcsize("i")
    return list(struct.unpack(f"{whole // struct.calcsize('i')}i", data[:whole]))


def split(buffer: bytearray, size: int) -> tuple[bytes, dict | None] | None:
    """A hand-off's message of ``size`` bytes (``hand_off``): the bytes read from its connection, and what its first
    request's scope is to hold (the sender's reading of its session; None: it sent none); None if it is not one."""
    if size < READING_LENGTH.size:
        return None
    (length,) = READING_LENGTH.unpack_from(buffer)
    start = READING_LENGTH.size + length
    if start > size:
        return None
    if not length:
        return bytes(buffer[start:size]), None
    try:
        reading = decoded_reading(bytes(buffer[READING_LENGTH.size : start]))
    except ValueError:
        return None
    return bytes(buffer[start:size]), {SESSION_READ_SCOPE_KEY: reading}


def os_close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
