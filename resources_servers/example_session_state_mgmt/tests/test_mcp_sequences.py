"""Counter sequences over MCP: what a failed sequence tells about the replies that failed it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from nemo_gym.sessions.token import TOKEN_HEADER
from resources_servers.example_session_state_mgmt.mcp_sequences import run_sequences


class SeedingClient:
    """Seeds answer 200 with a token, as the counter's do; ``/mcp`` is the test server's."""

    def __init__(self, mcp_url: str) -> None:
        self.mcp_url = mcp_url

    async def post(self, server: str, path: str, json: dict) -> SimpleNamespace:
        return SimpleNamespace(ok=True, body={"mcp": {"headers": {TOKEN_HEADER: f"token-{json['initial_count']}"}}})

    def url(self, server: str, path: str) -> str:
        return self.mcp_url


@pytest.mark.anyio
async def test_a_sequence_answered_an_http_error_is_named_with_the_status_and_body_of_that_reply():
    async def busy(request: web.Request) -> web.Response:
        return web.Response(status=503, text="the owner is busy", headers={"Retry-After": "1"})

    app = web.Application()
    app.router.add_post("/mcp", busy)
    async with TestServer(app, host="127.0.0.1") as server:
        with pytest.raises(RuntimeError) as raised:
            await run_sequences(SeedingClient(str(server.make_url("/mcp"))), "counter", 2)
    message = str(raised.value)
    assert message.startswith("2 of 2 sequences raised")
    assert "seeded at 100" in message and "seeded at 101" in message
    assert "POST 503 'the owner is busy'" in message
