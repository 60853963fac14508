"""A checkpoint of a live run: a server's workers stop admitting requests, those in flight finish, the store is exported, and the workers go on.

Each host's workers of a server share one gate in the directory they share (the socket directory): the
file ``checkpoint.gate`` holds the time (unix seconds) until which no request is admitted (0 while
requests are admitted), so a pause whose checkpoint command died ends by itself, and the generation new
requests join; ``checkpoint.gate.0`` and ``.1`` are the two generations' locks. While a worker has a
request of a generation in flight it holds a shared ``flock`` on its own open of that generation's lock.

A checkpoint first drains: the generation changes, and the drain waits until it can take the exclusive
lock of the old one, while new requests are admitted (they join the new one): every request in flight
when it began is done then. Then the pause writes the time, and waits (for a short hold) until it can
take both exclusive locks: every request admitted before it has finished then, on every worker of the
host, and any admitted later saw the time (it reads the file after taking its shared lock) and was
refused: ``503`` with ``Retry-After``, before it touched anything. So a request that takes long holds up
the drain, never the host; and a pause that does not drain within its hold is lifted at once.

Its endpoints, which ``gym sessions checkpoint`` drives, are ``durable.checkpoint_admin``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import time

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym.sessions.replies import retry_later
from nemo_gym.routing.placement import COUNT_SUFFIX

GATE_FILE = "checkpoint.gate"
# The gate file: until when requests are refused (unix time, 0: admitted), then the generation new requests join.
UNTIL = struct.Struct("d")
GENERATION = struct.Struct("q")
# How long a pause refuses new requests while waiting for those in flight, unless its request says otherwise.
DEFAULT_HOLD_SECONDS = 2
DRAIN_POLL_SECONDS = 0.01


class Gate:
    """One worker's side of the host's gate (see the module's docstring)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, GATE_FILE)
        self.fd = self.open(self.path)
        self.locks = [self.open(path) for path in self.lock_paths()]
        # This worker's requests in flight, per generation's lock.
        self.in_flight = [0, 0]

    @staticmethod
    def open(path: str) -> int:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)

    def lock_paths(self) -> list[str]:
        return [f"{self.path}.{parity}" for parity in (0, 1)]

    def paused_until(self) -> float:
        """Until when requests are refused (unix time), or 0: admitted."""
        data = os.pread(self.fd, UNTIL.size, 0)
        until = UNTIL.unpack(data)[0] if len(data) == UNTIL.size else 0.0
        return until if until > time.time() else 0.0

    def generation(self) -> int:
        data = os.pread(self.fd, GENERATION.size, UNTIL.size)
        return GENERATION.unpack(data)[0] % 2 if len(data) == GENERATION.size else 0

    def enter(self) -> int | None:
        """Admit a request: the generation it joined, to give ``leave``; or None, refused: a pause is on, or waits
        for the requests in flight. The pause is read after the lock is held, and the generation again: one that
        changed meanwhile (a drain began) is joined instead, so the drain does not wait for this request."""
        while True:
            generation = self.generation()
            if self.in_flight[generation] == 0:
                try:
                    fcntl.flock(self.locks[generation], fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    if self.generation() != generation:
                        continue
                    return None
            self.in_flight[generation] += 1
            if self.paused_until():
                self.leave(generation)
                return None
            if self.generation() == generation:
                return generation
            self.leave(generation)

    def leave(self, generation: int) -> None:
        self.in_flight[generation] -= 1
        if self.in_flight[generation] == 0:
            fcntl.flock(self.locks[generation], fcntl.LOCK_UN)

    async def drain(self, seconds: float) -> bool:
        """Wait (at most ``seconds``) until every request in flight on the host now is done, admitting new ones
        meanwhile: they join the other generation. False if they were not done in time."""
        old = self.generation()
        os.pwrite(self.fd, GENERATION.pack(old + 1), UNTIL.size)
        return await self.exclusive([self.lock_paths()[old]], seconds)

    async def pause(self, seconds: float, hold_seconds: float) -> bool:
        """Refuse requests for ``seconds`` from now, and wait (at most ``hold_seconds``) until every request
        in flight on the host is done. False, and the pause is off again at once, if they were not done in time."""
        os.pwrite(self.fd, UNTIL.pack(time.time() + seconds), 0)
        if await self.exclusive(self.lock_paths(), hold_seconds):
            return True
        self.resume()
        return False

    @staticmethod
    async def exclusive(paths: list[str], seconds: float) -> bool:
        """Whether the exclusive lock of each of ``paths`` was had (then let go) within ``seconds``: no request holds them."""
        fds = [os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW) for path in paths]
        try:
            deadline = time.monotonic() + seconds
            for fd in fds:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            return False
                        await asyncio.sleep(DRAIN_POLL_SECONDS)
            return True
        finally:
            for fd in fds:
                os.close(fd)

    def resume(self) -> None:
        os.pwrite(self.fd, UNTIL.pack(0.0), 0)

    def close(self) -> None:
        """Let go of the files; a worker that stops with no sibling's session counter left (the last) removes them."""
        for fd in (self.fd, *self.locks):
            os.close(fd)
        directory = os.path.dirname(self.path)
        if not any(name.endswith(COUNT_SUFFIX) for name in os.listdir(directory)):
            for path in (self.path, *self.lock_paths()):
                with contextlib.suppress(OSError):
                    os.unlink(path)


def paused_reply(until: float) -> JSONResponse:
    return retry_later(
        f"The server is taking a checkpoint of its sessions (gym sessions checkpoint) and admits no request until "
        f"it is done, at most {max(until - time.time(), 0):.0f} s more; nothing of this request was done. Retry later."
    )


class CheckpointGate:
    """Inside the session layer, outside the write-through: a request is served only if the gate admits it.

    The gate is asked once the request's body has come whole: until then nothing inside has run, so a
    body still arriving (however slowly: the public port's ``min_body_bytes_per_second`` bounds that) is
    not in flight and a pause does not wait for it; a body that ends during a pause is refused as any
    request then is.
    """

    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks = []
        while (message := await receive())["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        else:
            return  # the caller left before its body was whole: nothing of it was done
        generation = self.gate.enter()
        if generation is None:
            await paused_reply(self.gate.paused_until() or time.time() + DEFAULT_HOLD_SECONDS)(scope, receive, send)
            return
        body: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        del chunks

        async def whole_body() -> Message:
            nonlocal body
            if body is None:
                return await receive()
            message, body = body, None
            return message

        try:
            await self.app(scope, whole_body, send)
        finally:
            self.gate.leave(generation)
