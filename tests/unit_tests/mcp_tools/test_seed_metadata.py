"""The mcp block of /seed_session replies (nemo_gym.mcp_tools.seed_metadata): where the tools are, and a token naming the session and its owner."""

from __future__ import annotations

import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym import config as gym_config
from nemo_gym.sessions.worker import OWNER_KEY, is_worker_id
from nemo_gym.routing.transport.unix import make_socket_dir, remove_socket_dir
from nemo_gym.sessions.token import TOKEN_HEADER, read_token
from resources_servers.example_session_state_mgmt.app import CounterServer
from tests.unit_tests.mcp_tools.mcp_servers import NAME, SessionEchoServer, http_client, make_server, seed, serving

@pytest.mark.anyio
async def test_seed_session_replies_carry_the_mcp_metadata_without_the_handler_changing():
    server = make_server()
    async with serving(server), http_client(server) as client:
        reply = await client.post(NAME, "/seed_session", json={"initial_count": 5})

    assert reply.status == 200
    mcp = reply.body["mcp"]
    assert set(mcp) == {"server_name", "url_path", "transport", "headers"}
    assert (mcp["server_name"], mcp["url_path"], mcp["transport"]) == (NAME, "/mcp", "http")
    assert set(mcp["headers"]) == {TOKEN_HEADER}
    assert read_token(server.tokens, mcp["headers"][TOKEN_HEADER]) is not None


@pytest.mark.anyio
async def test_a_single_worker_server_mints_tokens_without_an_owner():
    server = make_server(SessionEchoServer)
    async with serving(server), http_client(server) as client:
        cookies, mcp = await seed(client)
        session_id = (await client.post(NAME, "/echo", json={"text": "who"}, cookies=cookies)).body["session_id"]

    assert server.worker_id is None
    assert read_token(server.tokens, mcp["headers"][TOKEN_HEADER]) == {SESSION_ID_KEY: session_id}


@pytest.mark.anyio
async def test_a_multi_worker_server_puts_this_workers_id_in_the_token():
    socket_dir = make_socket_dir()
    try:
        instances = gym_config.parse(
            {NAME: {"resources_servers": {"example_session_state_mgmt": {"port": gym_config.free_port(), "num_workers": 2, "expose_tools_over_mcp": True}}}}
        )
        server = CounterServer.for_instance(NAME, instances)
        async with serving(server, socket_dir), http_client(server) as client:
            _, mcp = await seed(client)
    finally:
        remove_socket_dir(socket_dir)

    payload = read_token(server.tokens, mcp["headers"][TOKEN_HEADER])
    assert is_worker_id(server.worker_id)
    assert payload[OWNER_KEY] == server.worker_id


