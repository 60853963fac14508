"""The /mcp endpoint (nemo_gym.mcp_tools.endpoint): a session token lets the official client's tool calls act on that session, and nothing else does."""

from __future__ import annotations

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from nemo_gym import SESSION_ID_KEY
from nemo_gym.sessions.token import TOKEN_HEADER, token_serializer
from tests.unit_tests.mcp_tools.mcp_servers import NAME, VERIFY_BODY, http_client, make_server, mcp_session, seed, serving, text_of

@pytest.mark.anyio
async def test_the_seed_token_lets_tools_act_on_that_sessions_state_and_verify_over_http_sees_it():
    server = make_server()
    async with serving(server) as url, http_client(server) as client:
        cookies, mcp = await seed(client, initial_count=10)
        other_cookies, other_mcp = await seed(client, initial_count=100)
        async with mcp_session(url, mcp["headers"]) as session:
            first = await session.call_tool("increment_counter", {"count": 1})
            await session.call_tool("increment_counter", {"count": 2})
            count = await session.call_tool("get_counter_value", {})
        verified = await client.post(NAME, "/verify", json={**VERIFY_BODY, "expected_count": 13}, cookies=cookies)
        untouched = await client.post(NAME, "/verify", json={**VERIFY_BODY, "expected_count": 100}, cookies=other_cookies)

    assert not first.is_error and first.structured_content == {"success": True}
    assert count.structured_content == {"count": 13}
    assert text_of(count) == '{"count":13}'
    assert (verified.body["count"], verified.body["reward"]) == (13, 1.0)
    assert (untouched.body["count"], untouched.body["reward"]) == (100, 1.0)


@pytest.mark.anyio
async def test_the_token_works_the_same_on_the_stateless_2026_protocol():
    server = make_server()
    async with serving(server) as url, http_client(server) as client:
        _, mcp = await seed(client, initial_count=7)
        for headers in (mcp["headers"], {}):
            async with (
                create_mcp_http_client(headers=headers) as http,
                streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.discover()
                assert session.protocol_version == "2026-07-28"
                if headers:
                    await session.call_tool("increment_counter", {"count": 1})
                    count = await session.call_tool("get_counter_value", {})
                else:
                    with pytest.raises(MCPError, match=TOKEN_HEADER):
                        await session.call_tool("get_counter_value", {})

    assert count.structured_content == {"count": 8}


@pytest.mark.anyio
async def test_a_tool_call_without_a_token_is_refused_with_a_clear_error():
    server = make_server()
    async with serving(server) as url, mcp_session(url) as session:
        with pytest.raises(MCPError) as refused:
            await session.call_tool("increment_counter", {"count": 1})

    assert TOKEN_HEADER in refused.value.message
    assert "/seed_session" in refused.value.message


@pytest.mark.anyio
async def test_a_badly_signed_token_is_refused_with_a_clear_error():
    server = make_server()
    forged = token_serializer("not this server's secret").dumps({SESSION_ID_KEY: "someone-elses-session"})
    async with serving(server) as url:
        for token in (forged, "garbage"):
            async with mcp_session(url, {TOKEN_HEADER: token}) as session:
                with pytest.raises(MCPError) as refused:
                    await session.call_tool("get_counter_value", {})
            assert "bad signature" in refused.value.message
            assert TOKEN_HEADER in refused.value.message


@pytest.mark.anyio
async def test_an_unknown_tool_gets_an_error_result_listing_the_available_tools():
    server = make_server()
    async with serving(server) as url, http_client(server) as client:
        _, mcp = await seed(client)
        async with mcp_session(url, mcp["headers"]) as session:
            result = await session.call_tool("verify", {})

    assert result.is_error
    assert "Unknown tool 'verify'" in text_of(result)
    assert "Available tools: increment_counter, get_counter_value" in text_of(result)


@pytest.mark.anyio
async def test_mcp_replies_set_no_session_cookie():
    server = make_server()
    async with serving(server) as url, http_client(server) as client:
        _, mcp = await seed(client)
        async with create_mcp_http_client(headers=mcp["headers"]) as http:
            async with streamable_http_client(f"{url}/mcp", http_client=http) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await session.call_tool("increment_counter", {"count": 1})
            assert not http.cookies


