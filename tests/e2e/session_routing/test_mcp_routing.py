"""Tools over MCP end to end: 200 official MCP clients that keep only the session token, counter at 4 workers."""

from __future__ import annotations

import asyncio
import json

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from nemo_gym.client import ServerClient
from nemo_gym.session_token import TOKEN_HEADER

COUNTER = "example_session_state_mgmt"
CLIENTS = 200


def counter_config(route_sessions: bool) -> dict:
    settings = {"num_workers": 4, "expose_tools_over_mcp": True, "route_sessions": route_sessions}
    return {COUNTER: {"resources_servers": {COUNTER: settings}}}


async def one_sequence(client: ServerClient, url: str, start: int) -> int:
    """Seed over HTTP keeping only the token, then +1 and +2 and a read over /mcp; returns the count."""
    seed = await client.post(COUNTER, "/seed_session", json={"initial_count": start})
    assert seed.ok, seed.text
    token = seed.body["mcp"]["headers"][TOKEN_HEADER]
    async with (
        create_mcp_http_client(headers={TOKEN_HEADER: token}) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await session.call_tool("increment_counter", {"count": 1})
        await asyncio.sleep(0.02)
        await session.call_tool("increment_counter", {"count": 2})
        result = await session.call_tool("get_counter_value", {})
    assert not result.is_error, result
    return json.loads(result.content[0].text)["count"]


async def all_sequences(instances) -> list[int]:
    client = ServerClient(instances)
    url = instances[COUNTER].url
    try:
        return await asyncio.gather(*(one_sequence(client, url, 100 + i) for i in range(CLIENTS)))
    finally:
        await client.close()


def test_mcp_sequences_all_end_right_at_four_workers(start_servers):
    launcher = start_servers(counter_config(route_sessions=True))
    counts = asyncio.run(all_sequences(launcher.instances))
    assert counts == [100 + i + 3 for i in range(CLIENTS)]


def test_mcp_sequences_go_wrong_with_routing_switched_off(start_servers):
    launcher = start_servers(counter_config(route_sessions=False))
    counts = asyncio.run(all_sequences(launcher.instances))
    assert sum(count == 100 + i + 3 for i, count in enumerate(counts)) < CLIENTS
