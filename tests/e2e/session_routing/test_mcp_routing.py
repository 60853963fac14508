"""Tools over MCP end to end: 200 official MCP clients that keep only the session token, counter at 4 workers."""

from __future__ import annotations

import asyncio

from nemo_gym.client.reading import ReadingClient
from resources_servers.example_session_state_mgmt.mcp_sequences import run_sequences

COUNTER = "example_session_state_mgmt"
CLIENTS = 200
# Without routing, each sequence's seed and tool calls reach the same worker 1 time in 4: 50 sequences all right
# by chance is a 4^-50 event, and a quarter of the clients is a quarter of the test's time.
UNROUTED_CLIENTS = 50


def counter_config(route_sessions: bool) -> dict:
    settings = {"num_workers": 4, "expose_tools_over_mcp": True, "route_sessions": route_sessions}
    return {COUNTER: {"resources_servers": {COUNTER: settings}}}


async def all_sequences(instances, count: int = CLIENTS) -> list[bool]:
    client = ReadingClient(instances)
    try:
        return await run_sequences(client, COUNTER, count)
    finally:
        await client.close()


def test_mcp_sequences_all_end_right_at_four_workers(start_servers):
    launcher = start_servers(counter_config(route_sessions=True))
    assert sum(asyncio.run(all_sequences(launcher.instances))) == CLIENTS


def test_mcp_sequences_go_wrong_with_routing_switched_off(start_servers):
    launcher = start_servers(counter_config(route_sessions=False))
    assert sum(asyncio.run(all_sequences(launcher.instances, UNROUTED_CLIENTS))) < UNROUTED_CLIENTS
