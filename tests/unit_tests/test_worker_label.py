"""Every routed reply names the worker whose public socket accepted the connection: X-NeMo-Gym-Worker."""

from __future__ import annotations

import uuid

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from nemo_gym.sessions.worker import WORKER_HEADER
from tests.unit_tests.routing_workers import Caller, EchoServer, Worker, two_workers

pytestmark = pytest.mark.anyio


class ForgingServer(EchoServer):
    """Its handler sets the worker header itself, as if to mislabel the connection."""

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/forge")(self.forge)
        return app

    async def forge(self) -> JSONResponse:
        return JSONResponse({"worker": self.worker_id}, headers={WORKER_HEADER: "0123456789abcdef"})


@pytest.fixture
async def pair():
    async with two_workers(ForgingServer) as workers:
        yield workers


async def test_a_local_reply_names_the_worker_that_served_it(pair):
    a, b, caller = pair
    response = await caller.post(a, "/increment")
    assert (await response.json())["worker"] == a.server.worker_id
    assert response.headers.getall(WORKER_HEADER) == [a.server.worker_id]


async def test_a_forwarded_reply_names_the_receiving_worker_not_the_owner(pair):
    a, b, caller = pair
    first = await caller.post(a, "/increment")
    cookies = {key: morsel.value for key, morsel in first.cookies.items()}
    response = await caller.post(b, "/increment", cookies)
    assert await response.json() == {"worker": a.server.worker_id, "count": 2}
    assert response.headers.getall(WORKER_HEADER) == [b.server.worker_id]


async def test_a_worker_header_set_by_the_app_is_replaced_locally_and_after_a_forward(pair):
    a, b, caller = pair
    local = await caller.post(a, "/forge")
    cookies = {key: morsel.value for key, morsel in local.cookies.items()}
    assert local.headers.getall(WORKER_HEADER) == [a.server.worker_id]
    forwarded = await caller.post(b, "/forge", cookies)
    assert (await forwarded.json())["worker"] == a.server.worker_id
    assert forwarded.headers.getall(WORKER_HEADER) == [b.server.worker_id]


async def test_error_replies_of_the_router_name_the_worker_too(pair):
    a, b, caller = pair
    first = await caller.post(a, "/increment")
    cookie = f"{a.server.session_cookie}={first.cookies[a.server.session_cookie].value}"
    response = await caller.post(b, "/increment", headers=[("Cookie", cookie + "; " + a.server.session_cookie + "=other")])
    assert response.status == 400
    assert response.headers.getall(WORKER_HEADER) == [b.server.worker_id]


async def test_a_single_worker_server_adds_no_worker_header():
    worker = await Worker(f"label_{uuid.uuid4().hex[:8]}", 1, None).start()
    caller = Caller()
    try:
        response = await caller.post(worker, "/increment")
        assert response.status == 200 and WORKER_HEADER not in response.headers
    finally:
        await caller.close()
        await worker.stop()
