"""The checkpoint's endpoints (``durable.checkpoint`` is its gate): the requests ``gym sessions checkpoint``
(``nemo_gym.cli.sessions``) sends every replica.

``CheckpointAdmin`` answers them on the public port, before the session router, under ``ADMIN_PREFIX``:
``drain``, ``pause`` (each returns once the host's requests in flight are done), ``export`` (every live
row of the store, while paused) and ``resume``. Each needs one ``X-NeMo-Gym-Admin-Auth`` header,
``<unix time> <HMAC-SHA256>`` over the method, the request target, the instance and the time, under a
key derived from the server's ``session_secret`` (the replicas' scheme with a key of its own, so neither
credential serves as the other), within ``WINDOW_SECONDS`` of the server's clock; anything else is 401.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import asdict
from urllib.parse import parse_qs

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.durable.checkpoint import DEFAULT_HOLD_SECONDS, Gate
from nemo_gym.durable.store import open_store
from nemo_gym.routing.transport.credentials import WINDOW_SECONDS, ReplicaCredentials, request_target
from nemo_gym.sessions.replies import retry_later

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
