"""The private server: a worker's app served again to its siblings, past the router."""

from __future__ import annotations

import aiohttp
import pytest

from nemo_gym.routing.transport.unix import socket_address
from tests.unit_tests.routing_workers import new_session

pytestmark = pytest.mark.anyio


async def test_private_socket_request_is_handled_locally(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    connector = aiohttp.UnixConnector(socket_address(b.server.transport.socket_dir, b.server.worker_id))
    async with aiohttp.ClientSession(connector=connector) as private:
        header = f"{a.server.session_cookie}={cookies[a.server.session_cookie]}"
        async with private.post("http://worker/echo/x", headers={"Cookie": header}) as response:
            assert (await response.json())["worker"] == b.server.worker_id
