"""Connections handed between the workers of one host: a client's socket and the bytes read from it, passed whole.

Each worker takes hand-offs on a socket of its own beside its private one (``<worker>.hand`` in the same
abstract namespace, ``unix``): a SOCK_SEQPACKET listener, so that one message is one hand-off, the descriptor
(SCM_RIGHTS) and the bytes together or not at all. The bytes are the sender's reading of the request's session
(JSON, after its length; none: length 0), which the receiver takes as read as it takes a forwarding sibling's, then
every byte read from the connection. A sender keeps one connection per sibling and never waits
on it: a sibling whose queue is full, or that takes no connection, is told apart at once (``send`` says why),
and the router forwards the request instead. Both ends check that the other runs as this process's user, as
on the private socket. The receiver (``hand_off_receiver``) serves what it takes as its public port would (``adopt``): uvicorn's own
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
import errno
import socket
import struct

from nemo_gym.metrics.meters import METERS
from nemo_gym.routing.transport.unix import abstract_name, connect_same_user

HAND_OFF_SUFFIX = ".hand"
# The most a hand-off carries (a head at its limit and the body kept with it, ``protocols.handing_off``); a
# receiver reads every message into one buffer of this size.
MAX_MESSAGE_BYTES = 1 << 20
# The length of the reading that starts a hand-off's bytes.
READING_LENGTH = struct.Struct("!I")
# What a receiver answers each hand-off with once it holds the connection, and the sender's reply to that answer.
RECEIVED = YOURS = b"\x01"
TAKEN_BACK = b"\x00"
# How long a sender waits for the receiver's answer before it takes the hand-off back and forwards the request.
ANSWER_SECONDS = 1.0


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
        """Pass ``fd`` and ``data`` to ``worker_id``; None once it took them, else why not (``offer``)."""
        taken = self.offer(worker_id, fd, data)
        if isinstance(taken, str):
            return taken
        return await taken  # cancelled with its request: taken back too

    def offer(self, worker_id: str, fd: int, data: bytes, reading: bytes = b"") -> str | asyncio.Future:
        """Pass ``fd`` and ``data`` (and ``reading``, this worker's reading of the request's session, JSON) to
        ``worker_id``: why not at once (a queue that is full, a sibling without a hand-off socket: never blocks the
        loop), or what resolves to None once the sibling took them, or to why not (taken back: unanswered within
        ``ANSWER_SECONDS``, or the sibling gone)."""
        reason, taken = self.post(worker_id, fd, READING_LENGTH.pack(len(reading)) + reading + data)
        if taken is None:
            return reason
        late = asyncio.get_running_loop().call_later(ANSWER_SECONDS, taken_back, taken, "unanswered")
        taken.add_done_callback(lambda _: late.cancel())
        return taken

    def post(self, worker_id: str, fd: int, data: bytes) -> tuple[str | None, asyncio.Future | None]:
        """Send a hand-off's message without waiting: (why not, None), or (None, what the receiver's answer resolves to)."""
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
        # One answer a call: the loop calls again while more wait (a read that finds none costs a system call and an exception).
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
    return connect_same_user(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC), address)
