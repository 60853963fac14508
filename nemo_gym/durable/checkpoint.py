"""A checkpoint of a live run: a server's workers stop admitting requests, those in flight finish, the store is exported, and the workers go on.

Each host's workers of a server share one gate file, ``checkpoint.gate`` in the directory they share
(the socket directory). It is empty while requests are admitted; a pause writes into it the time (unix
seconds) until which no request is admitted, so a pause whose checkpoint command died ends by itself.
While a worker has a request in flight it holds a shared ``flock`` on its own open of the file. The
pause writes the time first, then waits until it can take the exclusive lock: every request admitted
before it has finished then, on every worker of the host, and any admitted later saw the time (it reads
the file after taking its shared lock) and was refused: ``503`` with ``Retry-After``, before it touched
anything.

``CheckpointAdmin`` answers the checkpoint's requests on the public port, before the session router,
under ``ADMIN_PREFIX``: ``pause`` (returns once the host's requests in flight are done), ``export`` (every
live row of the store, while paused) and ``resume``. Each needs one ``X-NeMo-Gym-Admin-Auth`` header,
``<unix time> <HMAC-SHA256>`` over the method, the request target, the instance and the time, under a
key derived from the server's ``session_secret`` (the replicas' scheme with a key of its own, so neither
credential serves as the other), within ``WINDOW_SECONDS`` of the server's clock; anything else is 401.
``gym sessions checkpoint`` (``nemo_gym.cli.sessions``) drives them on every replica.
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
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.durable.store import open_store
from nemo_gym.routing.lost import retry_later
from nemo_gym.routing.placement import COUNT_SUFFIX
from nemo_gym.routing.transport.credentials import WINDOW_SECONDS, ReplicaCredentials, request_target

GATE_FILE = "checkpoint.gate"
UNTIL = struct.Struct("d")
ADMIN_PREFIX = "/_nemo_gym/checkpoint/"
ADMIN_AUTH_HEADER = "X-NeMo-Gym-Admin-Auth"
ADMIN_AUTH_KEY = ADMIN_AUTH_HEADER.lower().encode()
ADMIN_CONTEXT = b"nemo-gym checkpoint admin v1"
# What a credential is for, in place of the replicas' worker.
ADMIN_ROLE = "checkpoint"
# A pause ends by itself this long after it began, unless its request says otherwise.
DEFAULT_PAUSE_SECONDS = 60
# How long a pause waits for the requests in flight, unless its request says otherwise.
DEFAULT_DRAIN_SECONDS = 30
DRAIN_POLL_SECONDS = 0.01


class Gate:
    """One worker's side of the host's gate file (see the module's docstring)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, GATE_FILE)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        self.in_flight = 0

    def paused_until(self) -> float:
        """Until when requests are refused (unix time), or 0: admitted."""
        data = os.pread(self.fd, UNTIL.size, 0)
        until = UNTIL.unpack(data)[0] if len(data) == UNTIL.size else 0.0
        return until if until > time.time() else 0.0

    def enter(self) -> bool:
        """Admit a request (True), or refuse it: a pause is on, or waits for the requests in flight."""
        if self.in_flight == 0:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        if self.paused_until():
            if self.in_flight == 0:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    async def pause(self, seconds: float, drain_seconds: float) -> bool:
        """Refuse requests for ``seconds`` from now, and wait (at most ``drain_seconds``) until every request
        in flight on the host is done. False, and the pause is off again, if they were not done in time."""
        os.pwrite(self.fd, UNTIL.pack(time.time() + seconds), 0)
        exclusive = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            deadline = time.monotonic() + drain_seconds
            while True:
                try:
                    fcntl.flock(exclusive, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        self.resume()
                        return False
                    await asyncio.sleep(DRAIN_POLL_SECONDS)
        finally:
            os.close(exclusive)

    def resume(self) -> None:
        os.ftruncate(self.fd, 0)

    def close(self) -> None:
        """Let go of the file; a worker that stops with no sibling's session counter left (the last) removes it."""
        os.close(self.fd)
        directory = os.path.dirname(self.path)
        if not any(name.endswith(COUNT_SUFFIX) for name in os.listdir(directory)):
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def paused_reply(until: float) -> JSONResponse:
    return retry_later(
        f"The server is taking a checkpoint of its sessions (gym sessions checkpoint) and admits no request until "
        f"it is done, at most {max(until - time.time(), 0):.0f} s more; nothing of this request was done. Retry later."
    )


class CheckpointGate:
    """Inside the session layer, outside the write-through: a request is served only if the gate admits it."""

    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.gate.enter():
            await paused_reply(self.gate.paused_until() or time.time() + DEFAULT_DRAIN_SECONDS)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.leave()


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
        if scope["method"] != "POST" or action not in ("pause", "export", "resume"):
            await JSONResponse(status_code=404, content={"detail": f"no checkpoint action {scope['method']} {action!r}: POST pause, export or resume"})(scope, receive, send)
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

    async def pause(self, query: dict[str, list[str]]) -> JSONResponse:
        seconds = float(query.get("seconds", [DEFAULT_PAUSE_SECONDS])[0])
        drain = float(query.get("drain_seconds", [DEFAULT_DRAIN_SECONDS])[0])
        if not await self.gate.pause(seconds, drain):
            detail = f"requests in flight did not finish within {drain:g} s; the pause is off again"
            return JSONResponse(status_code=503, headers={"Retry-After": "1"}, content={"detail": detail})
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
