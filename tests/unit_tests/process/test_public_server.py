"""A worker's uvicorn server is known to the worker's parts from before its app starts, and makes its public port's protocol."""

from __future__ import annotations

import asyncio

import pytest
import uvicorn

from nemo_gym.config import free_port
from nemo_gym.process import public_server
from nemo_gym.process.public_server import PublicServer
from nemo_gym.protocols.handing_off import HandingOffProtocol
from nemo_gym.protocols.input_limits import InputLimits

pytestmark = pytest.mark.anyio
TIMEOUT_SECONDS = 10


async def test_the_server_is_current_from_when_its_app_starts_until_it_stops_and_makes_the_protocol_its_connections_get():
    seen = []

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await receive()
            seen.append(public_server.current())
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})

    limits = InputLimits(max_header_bytes=1234)
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), lifespan="on", log_level="warning", http=limits.protocol(HandingOffProtocol))
    server = PublicServer(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(TIMEOUT_SECONDS):
            while not server.started:
                await asyncio.sleep(0.01)
        assert seen == [server]
        protocol = server.protocol(received=b"GET / HTTP/1.1\r\n\r\n")
        assert isinstance(protocol, HandingOffProtocol)
        assert (protocol.limits, protocol.server_state, protocol.app_state, protocol.received) == (limits, server.server_state, server.lifespan.state, b"GET / HTTP/1.1\r\n\r\n")
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, TIMEOUT_SECONDS)
    assert public_server.current() is None  # stopped: a later app in this process finds no server that is gone
