"""The ASGI layers that count requests: ``MetricsEndpoint`` outermost, ``ServedHere`` in front of the worker's own app.

``MetricsEndpoint`` answers ``GET /metrics`` before anything else sees the request: no router (any worker
answers, with the instance's aggregate), no session layer (no session made, no cookie set). Every other
reply it counts by status as it goes out: each request from the public port once, on the worker that
received it, whoever served it. ``ServedHere`` counts the requests this worker's app serves itself, as the
router (or, unrouted, the server) hands them to it; the requests a sibling forwards here reach the app
through the private socket, counted as forwarded by the sibling.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym.metrics.exposition import Exposition
from nemo_gym.metrics.meters import METERS
from nemo_gym.sessions.worker import WORKER_HEADER

METRICS_PATH = "/metrics"
# Prometheus's text format, version 0.0.4 (what prometheus_client's generate_latest writes).
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


class MetricsEndpoint:
    def __init__(self, app: ASGIApp, exposition: Exposition, worker_id: str | None = None) -> None:
        """``worker_id`` names this worker on the /metrics reply, as the router names it on every other reply."""
        self.app = app
        self.exposition = exposition
        self.headers = {} if worker_id is None else {WORKER_HEADER: worker_id}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == METRICS_PATH:
            await self.answer(scope)(scope, receive, send)
            return

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                METERS.response(message["status"]).inc()
            await send(message)

        await self.app(scope, receive, send_counted)

    def answer(self, scope: Scope) -> Response:
        if scope["method"] not in ("GET", "HEAD"):
            return Response(status_code=405, headers={"Allow": "GET, HEAD", **self.headers})
        return Response(self.exposition.text(), headers=self.headers, media_type=TEXT_FORMAT)


class ServedHere:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            METERS.served_here.inc()
        await self.app(scope, receive, send)
