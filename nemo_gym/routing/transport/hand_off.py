"""Connections handed between the workers of one host: a client's socket and the bytes read from it, passed whole.

Each worker takes hand-offs on a socket of its own beside its private one (``<worker>.hand`` in the same
abstract namespace, ``unix``): a SOCK_SEQPACKET listener, so that one message is one hand-off, the descriptor
(SCM_RIGHTS) and the bytes together or not at all. A sender keeps one connection per sibling and never waits
on it: a sibling whose queue is full, or that takes no connection, is told apart at once (``send`` says why),
and the router forwards the request instead. Both ends check that the other runs as this process's user, as
on the private socket. The receiver serves what it takes as its public port would (``adopt``): uvicorn's own
protocol, with the bytes fed before anything read from the socket here.

The sender decides who serves a connection, in two steps: the receiver answers each hand-off it reads
(``RECEIVED``), and serves it only once the sender replies that it is its own (``YOURS``); the sender keeps its own
descriptor until then. A receiver that does not answer within ``ANSWER_SECONDS`` (stopped, or its loop held) has
the hand-off taken back: the sender forwards the request, and answers ``TAKEN_BACK`` when the receiver reads it
later, which then closes its copy unserved. A receiver that dies first leaves the request to the sender, one that
dies after ends the client's connection (never answers it from the wrong state), and a sender that dies before
its reply leaves the receiver's copies closed unserved.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import socket
import struct

from nemo_gym.metrics.meters import METERS
from nemo_gym.process.public_server import PublicServer
from nemo_gym.routing.transport.unix import abstract_name, same_user

HAND_OFF_SUFFIX = ".hand"
# The most a hand-off carries (a head at its limit and the body kept with it, ``protocols.handing_off``); a
# receiver reads every message into one buffer of this size.
MAX_MESSAGE_BYTES = 1 << 20
# The control message of one descriptor.
ONE_FD_SPACE = socket.CMSG_SPACE(struct.calcsize("i"))
# What a receiver answers each hand-off with once it holds the connection, and the sender's reply to that answer.
RECEIVED = YOURS = b"\x01"
TAKEN_BACK = b"\x00"
# How long a sender waits for the receiver's answer before it takes the hand-off back and forwards the request.
ANSWER_SECONDS = 1.0
# Hand-offs queued at a listener that has not accepted them yet.
BACKLOG = 64

logger = logging.getLogger(__name__)


def hand_off_address(socket_dir: str, worker_id: str) -> str:
    return abstract_name(socket_dir, worker_id, HAND_OFF_SUFFIX)


class HandOffs:
    """A worker's connections to its siblings' hand-off sockets, one each, made when first needed; the sender's
    side of the exchange the module describes (its answers arrive one byte per hand-off, in order)."""

    def __init__(self, socket_dir: str) -> None:
        self.socket_dir = socket_dir
        self.sockets: dict[str, socket.socket] = {}
        # Per sibling, the hand-offs sent and not yet answered, oldest first (done: taken back).
        self.waiting: dict[str, collections.deque[asyncio.Future]] = {}

    async def send(self, worker_id: str, fd: int, data: bytes) -> str | None:
        """Pass ``fd`` and ``data`` to ``worker_id``; None once it took them, else why not. Never blocks the loop:
        a queue that is full or a sibling without a hand-off socket is told at once."""
        reason, taken = self.post(worker_id, fd, data)
        if taken is None:
            return reason
        late = asyncio.get_running_loop().call_later(ANSWER_SECONDS, taken_back, taken, "unanswered")
        try:
            return await taken  # cancelled with its request: taken back too
        finally:
            late.cancel()

    def post(self, worker_id: str, fd: int, data: bytes) -> tuple[str | None, asyncio.Future | None]:
        """Send a hand-off without waiting: (why not, None), or (None, what the receiver's answer resolves to)."""
        if len(data) > MAX_MESSAGE_BYTES:
            return "large", None
        sock = self.sockets.get(worker_id)
        if sock is None:
            try:
                sock = connected(hand_off_address(self.socket_dir, worker_id))
            except OSError:
                return "refused", None
            self.sockets[worker_id] = sock
            self.waiting[worker_id] = collections.deque()
            asyncio.get_running_loop().add_reader(sock.fileno(), self.answered, worker_id)
        try:
            socket.send_fds(sock, [data], [fd])
        except BlockingIOError:
            return "full", None
        except OSError as error:
            if error.errno == errno.EMSGSIZE:
                return "large", None
            self.forget(worker_id)  # gone or going: the forward finds out which
            return "refused", None
        taken = asyncio.get_running_loop().create_future()
        self.waiting[worker_id].append(taken)
        return None, taken

    def answered(self, worker_id: str) -> None:
        """The receiver's answers, each to the oldest hand-off waiting: it is the receiver's unless taken back."""
        sock, waiting = self.sockets[worker_id], self.waiting[worker_id]
        while True:
            try:
                answer = sock.recv(1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                answer = b""
            if not answer or not waiting:  # the receiver is gone (or speaks out of turn): what it has not taken is not taken
                self.forget(worker_id)
                return
            taken = waiting.popleft()
            yours = not taken.done()
            if yours:
                # Counted before the receiver may serve it: a client that reads the reply sees it counted.
                METERS.hand_offs_sent.inc()
            try:
                sock.send(YOURS if yours else TAKEN_BACK)
            except OSError:  # unsent: once this connection is closed, the receiver closes what it was not told is its own
                taken_back(taken, "refused")
                self.forget(worker_id)
                return
            if yours:
                taken.set_result(None)

    def forget(self, worker_id: str) -> None:
        sock = self.sockets.pop(worker_id, None)
        if sock is not None:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        for taken in self.waiting.pop(worker_id, ()):
            taken_back(taken, "refused")

    def close(self) -> None:
        for worker_id in list(self.sockets):
            self.forget(worker_id)


def taken_back(taken: asyncio.Future, reason: str) -> None:
    if not taken.done():
        taken.set_result(reason)


def connected(address: str) -> socket.socket:
    """A non-blocking connection to the hand-off socket at ``address``, of a process of this user; ``OSError`` if none."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        sock.connect(address)
        if not same_user(sock):  # someone else took a dead worker's name
            raise ConnectionRefusedError(f"the process at {address!r} runs as another user")
    except BaseException:
        sock.close()
        raise
    return sock


class HandOffReceiver:
    """A worker's hand-off socket: takes its siblings' connections and serves each as its public server would."""

    def __init__(self, socket_dir: str, worker_id: str, server: PublicServer) -> None:
        self.address = hand_off_address(socket_dir, worker_id)
        self.server = server
        self.listener: socket.socket | None = None
        # Per sibling's connection, the hand-offs answered and not yet replied to, oldest first: (descriptor, bytes).
        self.peers: dict[socket.socket, collections.deque[tuple[int, bytes]]] = {}
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
        while True:
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
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) > 1 or (not fds and size != 1):
                for fd in fds:
                    os_close(fd)
                self.drop(peer)  # unanswered: its sender forwards what it sent
                return
            if not fds:  # the sender's reply to the oldest hand-off answered
                if not self.peers[peer]:
                    self.drop(peer)
                    return
                self.settle(peer)
                continue
            self.peers[peer].append((fds[0], bytes(self.buffer[:size])))
            self.owed[peer] = self.owed.get(peer, 0) + 1
            if not self.answer(peer):
                return

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

    def adopt(self, fd: int, data: bytes) -> None:
        """Serve the connection ``fd`` as if the public port had accepted it, ``data`` as its first bytes read."""
        try:
            client = socket.socket(fileno=fd)
        except OSError:
            os_close(fd)
            return
        if client.type != socket.SOCK_STREAM or client.family not in (socket.AF_INET, socket.AF_INET6):
            client.close()
            return
        client.setblocking(False)
        METERS.hand_offs_received.inc()
        server = self.server

        def protocol() -> asyncio.Protocol:
            made = server.protocol(received=data)
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
        for fd, _ in self.peers.pop(peer, ()):
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
        fd, data = self.peers[peer].popleft()
        if self.buffer[0] == YOURS[0]:
            self.adopt(fd, data)
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


def os_close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
