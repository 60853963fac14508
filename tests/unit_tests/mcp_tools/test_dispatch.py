"""A tool call dispatched in-process (nemo_gym.mcp_tools.dispatch): the route's own handler, once, in the token's session, with its own errors."""

from __future__ import annotations

import pytest

from tests.unit_tests.mcp_tools.mcp_servers import NAME, SessionEchoServer, http_client, make_server, mcp_session, seed, serving, text_of

@pytest.mark.anyio
async def test_a_tool_call_runs_the_handler_once_in_the_session_it_would_see_over_http():
    server = make_server(SessionEchoServer)
    async with serving(server) as url, http_client(server) as client:
        cookies, mcp = await seed(client)
        over_http = await client.post(NAME, "/echo", json={"text": "http"}, cookies=cookies)
        async with mcp_session(url, mcp["headers"]) as session:
            over_mcp = await session.call_tool("echo", {"text": "mcp"})

    session_id = over_http.body["session_id"]
    assert over_mcp.structured_content == {"text": "mcp", "session_id": session_id}
    assert server.calls == [session_id, session_id]


@pytest.mark.anyio
async def test_bad_arguments_get_the_routes_own_validation_error_and_a_failing_handler_its_500():
    server = make_server(SessionEchoServer)
    async with serving(server) as url, http_client(server) as client:
        _, mcp = await seed(client)
        async with mcp_session(url, mcp["headers"]) as session:
            invalid = await session.call_tool("increment_counter", {"count": "three"})
            failed = await session.call_tool("boom", {"text": "bang"})

    assert invalid.is_error and "HTTP 422" in text_of(invalid) and '"loc":["body","count"]' in text_of(invalid)
    assert failed.is_error and "HTTP 500" in text_of(failed) and "boom: bang" in text_of(failed)


