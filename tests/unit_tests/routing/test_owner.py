"""Reading a request's owner from its session cookie or MCP token, as the app will read its session.

Two in-process workers of one server sharing a real socket directory (``pair``).
"""

from __future__ import annotations

import aiohttp
import httpx
import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.client.reading import cookie_header
from nemo_gym.sessions.worker import OWNER_KEY
from nemo_gym.sessions.token import TOKEN_HEADER, mint_token, token_serializer
from tests.session_cookies import session_of, signed_session
from tests.unit_tests.routing_workers import Caller, McpPathEchoServer, Worker, new_session, two_workers, unreachable

pytestmark = pytest.mark.anyio


async def test_badly_signed_cookie_is_handled_locally(pair):
    a, b, caller = pair
    forged = signed_session("not the secret", {SESSION_ID_KEY: "x", OWNER_KEY: a.server.worker_id})
    response = await caller.post(b, "/echo/x", {a.server.session_cookie: forged})
    body = await response.json()
    assert body["worker"] == b.server.worker_id
    assert body["session_id"] != "x"


async def test_garbage_cookie_is_handled_locally(pair):
    a, b, caller = pair
    response = await caller.post(b, "/echo/x", {a.server.session_cookie: "%%%garbage"})
    assert response.status == 200
    assert (await response.json())["worker"] == b.server.worker_id


async def test_mcp_token_minted_on_one_worker_routes_a_cookieless_request_to_it(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    session_id = session_of(a.server.signing_key, cookies[a.server.session_cookie])[SESSION_ID_KEY]
    token = mint_token(a.server.tokens, session_id, a.server.worker_id)
    response = await caller.post(b, "/mcp/echo", headers={TOKEN_HEADER: token})
    assert response.status == 404  # no MCP endpoint on this server, but the owner answered
    body = await (await caller.post(b, "/echo/x", headers={TOKEN_HEADER: token})).json()
    assert body["worker"] == a.server.worker_id


async def test_mcp_token_without_owner_is_handled_locally(pair):
    a, b, caller = pair
    token = mint_token(a.server.tokens, "s", None)
    body = await (await caller.post(b, "/echo/x", headers={TOKEN_HEADER: token})).json()
    assert body["worker"] == b.server.worker_id


async def test_badly_signed_mcp_token_is_handled_locally(pair):
    a, b, caller = pair
    token = mint_token(token_serializer("wrong secret"), "s", a.server.worker_id)
    for bad in (token, "garbage"):
        body = await (await caller.post(b, "/echo/x", headers={TOKEN_HEADER: bad})).json()
        assert body["worker"] == b.server.worker_id


async def test_on_the_mcp_path_the_token_outranks_the_cookie_and_elsewhere_the_cookie_does():
    async with two_workers(McpPathEchoServer) as (a, b, caller):
        cookies_of_b = await new_session(caller, b)
        token_of_a = mint_token(a.server.tokens, "s", a.server.worker_id)
        both = {"cookies": cookies_of_b, "headers": {TOKEN_HEADER: token_of_a}}
        assert (await (await caller.post(b, "/mcp/x", **both)).json())["worker"] == a.server.worker_id
        assert (await (await caller.post(a, "/echo/x", **both)).json())["worker"] == b.server.worker_id


async def test_quoted_cookie_from_aiohttps_own_cookie_handling_is_routed_to_its_owner(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    async with aiohttp.ClientSession() as standard:  # aiohttp quotes a value that holds "="
        for _ in range(3):
            async with standard.post(b.url + "/increment", cookies=cookies) as response:
                assert response.status == 200
                body = await response.json()
                assert body["worker"] == a.server.worker_id
    assert body["count"] == 4


async def test_two_different_session_cookies_get_400_naming_the_cookie_header(pair):
    a, b, caller = pair
    name = a.server.session_cookie
    on_a, on_b = await new_session(caller, a), await new_session(caller, b)
    for header in (f"{name}={on_a[name]}; {name}={on_b[name]}", f'{name}="{on_a[name]}"; other=1; {name}={on_b[name]}'):
        response = await caller.post(b, "/increment", headers={"Cookie": header})
        assert response.status == 400
        assert "Cookie" in (await response.json())["detail"]


async def test_the_same_session_cookie_twice_is_not_ambiguous(pair):
    a, b, caller = pair
    name = a.server.session_cookie
    on_a = await new_session(caller, a)
    response = await caller.post(b, "/increment", headers={"Cookie": f'{name}={on_a[name]}; {name}="{on_a[name]}"'})
    assert (await response.json()) == {"worker": a.server.worker_id, "count": 2}


async def test_session_cookie_outside_the_first_cookie_header_gets_400(pair):
    a, b, caller = pair
    name = a.server.session_cookie
    on_a = await new_session(caller, a)
    response = await caller.post(b, "/increment", headers=[("Cookie", "other=1"), ("Cookie", f"{name}={on_a[name]}")])
    assert response.status == 400
    assert "first Cookie header" in (await response.json())["detail"]


async def test_two_different_mcp_tokens_get_400_naming_the_token_header(pair):
    a, b, caller = pair
    serializer = a.server.tokens
    tokens = [mint_token(serializer, "s1", a.server.worker_id), mint_token(serializer, "s2", b.server.worker_id)]
    response = await caller.post(b, "/echo/x", headers=[(TOKEN_HEADER, token) for token in tokens])
    assert response.status == 400
    assert TOKEN_HEADER in (await response.json())["detail"]


async def busy_reply_cookies_by_aiohttp(caller: Caller, worker: Worker, cookies: dict[str, str]) -> dict[str, str]:
    response = await caller.post(worker, "/increment", cookies)
    assert response.status == 503
    return {name: morsel.value for name, morsel in response.cookies.items()}


async def busy_reply_cookies_by_httpx(caller: Caller, worker: Worker, cookies: dict[str, str]) -> dict[str, str]:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(worker.url + "/increment", headers={"Cookie": cookie_header(cookies)})
    assert response.status_code == 503
    return dict(response.cookies)


@pytest.mark.parametrize("read_reply", [busy_reply_cookies_by_aiohttp, busy_reply_cookies_by_httpx], ids=["aiohttp", "httpx"])
async def test_a_503_for_a_busy_owner_sets_the_session_cookie_so_a_client_that_replaces_its_cookies_keeps_the_session(pair, read_reply):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    b.server.forwarder.busy_wait_seconds = 0.5
    with unreachable(b, a):
        cookies = await read_reply(caller, b, cookies)  # the client's own reading of the 503's Set-Cookie, replacing its cookies
    assert session_of(a.server.signing_key, cookies[a.server.session_cookie])[OWNER_KEY] == a.server.worker_id
    assert (await (await caller.post(b, "/increment", cookies)).json())["count"] == 2
