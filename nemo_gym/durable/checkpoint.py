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

``CheckpointAdmin`` answers the checkpoint's requests on the public port, before the session router,
under ``ADMIN_PREFIX``: ``drain``, ``pause`` (each returns once the host's requests in flight are done),
``export`` (every live row of the store, while paused) and ``resume``. Each needs one
``X-NeMo-Gym-Admin-Auth`` header, ``<unix time> <HMAC-SHA256>`` over the method, the request target, the
instance and the time, under a key derived from the server's ``session_secret`` (the replicas' scheme
with a key of its own, so neither credential serves as the other), within ``WINDOW_SECONDS`` of the
server's clock; anything else is 401. ``gym sessions checkpoint`` (``nemo_gym.cli.sessions``) drives
them on every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hmac
import os
import struct
import time
from dataclasses import asdict
from urllib.parse import parse_qs

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym.durable.store import open_store
from nemo_gym.sessions.replies import retry_later
from nemo_gym.routing.placement import COUNT_SUFFIX
from nemo_gym.routing.transport.credentials import WINDOW_SECONDS, ReplicaCredentials, request_target

GATE_FILE = "checkpoint.gate"
# The gate file: until when requests are refused (unix time, 0: admitted), then the generation new requests join.
UNTIL = struct.Struct("d")
GENERATION = struct.Struct("q")
ADMIN_PREFIX = "/_nemo_gym/checkpoint/"
ADMIN_AUTH_HEADER = "X-NeMo-Gym-Admin-Auth"
ADMIN_AUTH_KEY = ADMIN_AUTH_HEADER.lower().encode()
ADMIN_CONTEXT = b"nemo-gym checkpoint admin v1"
# What a credential is for, in place of the replicas' worker.
ADMIN_ROLE = "checkpoint"
# A pause ends by itself this long after it began, unless its request says otherwise.
DEFAULT_PAUSE_SECONDS = 60
# How long a drain waits for the requests in flight (the host serving meanwhile), unless its request says otherwise.
DEFAULT_DRAIN_SECONDS = 30
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


def admin_credentials(secret: str) -> ReplicaCredentials:
    return ReplicaCredentials(secret, WINDOW_SECONDS, context=ADMIN_CONTEXT)


def admin_header(credentials: ReplicaCredentials, method: str, target: str, instance: str) -> tuple[str, str]:
    """The header that authenticates a checkpoint request (``target``: path and query) to ``instance``, now."""
    stamp = int(time.time())
    return ADMIN_AUTH_HEADER, f"{stamp} {credentials.mac(method.encode(), target.encode(), instance, ADMIN_ROLE, stamp)}"


class CheckpointAdmin:
    """The checkpoint's endpoints under ``ADMIN_PREFIX`` (see the module's docstring); every other request goes on to ``app``."""

    def __init__(self, app: ASGIApp, gate: Gate, instance: str, secret: str, store_location: str | None) -> None:
        self.app = app
        self.gate = gate
        self.instance = instance
        self.credentials = admin_credentials(secret)
        self.store_location = store_location

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(ADMIN_PREFIX):
            await self.app(scope, receive, send)
            return
        if not self.authentic(scope):
            detail = f"A checkpoint request needs exactly one valid {ADMIN_AUTH_HEADER} header (gym sessions checkpoint makes it)."
            await JSONResponse(status_code=401, content={"detail": detail})(scope, receive, send)
            return
        action = scope["path"].removeprefix(ADMIN_PREFIX)
        if scope["method"] != "POST" or action not in ("drain", "pause", "export", "resume"):
            await JSONResponse(status_code=404, content={"detail": f"no checkpoint action {scope['method']} {action!r}: POST drain, pause, export or resume"})(scope, receive, send)
            return
        await (await getattr(self, action)(parse_qs(scope["query_string"].decode())))(scope, receive, send)

    def authentic(self, scope: Scope) -> bool:
        values = [value for name, value in scope["headers"] if name == ADMIN_AUTH_KEY]
        if len(values) != 1:
            return False
        try:
            stamp_text, mac = values[0].decode("ascii").split(" ")
            stamp = int(stamp_text)
        except ValueError:
            return False
        if abs(time.time() - stamp) > self.credentials.window_seconds:
            return False
        expected = self.credentials.mac(scope["method"].encode(), request_target(scope), self.instance, ADMIN_ROLE, stamp)
        return hmac.compare_digest(expected, mac)

    async def drain(self, query: dict[str, list[str]]) -> JSONResponse:
        seconds = float(query.get("seconds", [DEFAULT_DRAIN_SECONDS])[0])
        if not await self.gate.drain(seconds):
            detail = f"requests in flight did not finish within {seconds:g} s (no request was refused meanwhile)"
            return retry_later(detail)
        return JSONResponse({"drained": True})

    async def pause(self, query: dict[str, list[str]]) -> JSONResponse:
        seconds = float(query.get("seconds", [DEFAULT_PAUSE_SECONDS])[0])
        hold = float(query.get("hold_seconds", [DEFAULT_HOLD_SECONDS])[0])
        if not await self.gate.pause(seconds, hold):
            detail = f"requests in flight did not finish within the pause's hold of {hold:g} s; the pause is off again"
            return retry_later(detail)
        return JSONResponse({"paused_until": self.gate.paused_until()})

    async def export(self, query: dict[str, list[str]]) -> JSONResponse:
        if not self.gate.paused_until():
            return JSONResponse(status_code=409, content={"detail": "not paused: a checkpoint exports only while its pause is on"})
        rows = await asyncio.to_thread(self.rows)
        return JSONResponse({"sessions": rows})

    def rows(self) -> list[dict]:
        store = open_store(self.store_location, self.instance, create=False)
        try:
            return [asdict(row) for row in store.export()]
        finally:
            store.close()

    async def resume(self, query: dict[str, list[str]]) -> JSONResponse:
        self.gate.resume()
        return JSONResponse({"resumed": True})


def merged(exports: list[list[dict]]) -> list[dict]:
    """The rows of several stores (a replica set's hosts, or one shared store read by each), one per session:
    the one of the highest revision (a session taken up on one host is older on another that got a copy)."""
    rows: dict[str, dict] = {}
    for export in exports:
        for row in export:
            held = rows.get(row["session_id"])
            if held is None or row["revision"] > held["revision"]:
                rows[row["session_id"]] = row
    return [rows[session_id] for session_id in sorted(rows)]
