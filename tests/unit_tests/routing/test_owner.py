"""Reading a request's owner from its session cookie or MCP token, as the app will read its session.

Two in-process workers of one server sharing a real socket directory (``pair``).

One reading of the session: the owner the router routes by is the owner of the session the app loads.
Property-based: hypothesis writes Cookie and token headers (quoting, escapes, whitespace, other cookies
around the session's, duplicates, empty values, non-ASCII bytes, a second Cookie header), and each is
read twice in this process, once by the router's reader and once by the app behind the router. Served
through the router, a request's cookie is verified once: the app's session layer loads what the router read.
"""

from __future__ import annotations

import asyncio
import http.cookies
import json
import uuid
from typing import Any
from unittest import mock

import aiohttp
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from itsdangerous import TimestampSigner
from starlette.requests import Request, cookie_parser

from nemo_gym import SESSION_ID_KEY
from nemo_gym.client.reading import cookie_header
from nemo_gym.routing.owner import AmbiguousSession
from nemo_gym.sessions.token import TOKEN_HEADER, mint_token, read_token, token_serializer
from nemo_gym.sessions.worker import OWNER_KEY
from tests.session_cookies import session_of, signed_session
from tests.unit_tests.routing_workers import Caller, McpPathEchoServer, Worker, instances, new_session, two_workers, unreachable

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


NAME = f"reading_{uuid.uuid4().hex[:8]}"
SERVER = McpPathEchoServer.for_instance(NAME, instances(NAME, 2, session_secret="s" * 40))
ROUTER = SERVER.build_app(socket_dir="/nonexistent").app.app  # inside the metrics endpoint and the body limit
APP = ROUTER.app  # what the router serves locally: SessionMiddleware and the routes
OWNERS = ["a" * 16, "b" * 16]
COOKIE = SERVER.session_cookie
SERIALIZER = SERVER.tokens

LOCAL_COOKIE = signed_session(SERVER.signing_key, {SESSION_ID_KEY: "s-local", OWNER_KEY: SERVER.worker_id})
valid_cookies = st.sampled_from(
    [signed_session(SERVER.signing_key, {SESSION_ID_KEY: f"s-{owner}", OWNER_KEY: owner}) for owner in OWNERS]
    + [signed_session(SERVER.signing_key, {SESSION_ID_KEY: "s-adopted"}), LOCAL_COOKIE]
)
garbage = st.text(alphabet=st.characters(codec="latin-1", exclude_characters=";"), max_size=12)
cookie_values = st.one_of(valid_cookies, garbage, st.just(""))


@st.composite
def rendered(draw: st.DrawFn, value: str) -> str:
    """A value as clients write it: bare, quoted, quoted with escapes, padded with spaces."""
    form = draw(st.sampled_from(["bare", "quoted", "escaped", "padded"]))
    if form == "quoted":
        return f'"{value}"'
    if form == "escaped":
        return http.cookies._quote(value + draw(st.sampled_from(["", ",", '"', "\\", " x"])))
    if form == "padded":
        return f"  {value} "
    return value


@st.composite
def cookie_pairs(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from([COOKIE, COOKIE, "other", f"x{COOKIE}", f" {COOKIE}", "", "é"]))
    value = draw(rendered(draw(cookie_values)))
    return f"{name}={value}" if name or draw(st.booleans()) else value


@st.composite
def cookie_headers(draw: st.DrawFn) -> list[bytes]:
    headers = []
    for _ in range(draw(st.integers(1, 2))):
        pairs = draw(st.lists(cookie_pairs(), min_size=0, max_size=4))
        separator = draw(st.sampled_from([";", "; ", " ;  "]))
        headers.append(separator.join(pairs).encode(draw(st.sampled_from(["latin-1", "utf-8"])), "replace"))
    return headers


def scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }


async def app_reply(request_scope: dict[str, Any], app: Any = APP) -> dict[str, Any]:
    """Serve the request with the app the router would hand it to locally (or with ``app``); return the JSON reply."""
    sent: list[dict[str, Any]] = []

    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the caller never leaves

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(request_scope, receive, send)
    return json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


def router_owner(request_scope: dict[str, Any]) -> object | None:
    return ROUTER.owners.owner(request_scope)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cookie_headers())
def test_router_owner_is_the_owner_of_the_session_the_app_loads(headers):
    request_scope = scope("/echo/x", [(b"cookie", header) for header in headers])
    try:
        owner = router_owner(request_scope)
    except AmbiguousSession:
        return  # answered 400, the app never sees it
    reply = asyncio.run(app_reply(scope("/echo/x", [(b"cookie", header) for header in headers])))
    # A session that names no owner is stamped with this worker's: the worker that serves it locally.
    assert reply["owner"] == (SERVER.worker_id if owner is None else owner)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(OWNERS + [None]), min_size=1, max_size=3), st.booleans())
def test_router_owner_is_the_owner_of_the_token_the_mcp_endpoint_reads(owners, repeat_first):
    tokens = [mint_token(SERIALIZER, f"s-{owner}", owner) for owner in owners]
    if repeat_first:
        tokens = [tokens[0]] * len(tokens)
    request_scope = scope("/mcp/x", [(TOKEN_HEADER.lower().encode(), token.encode()) for token in tokens])
    if len(set(tokens)) > 1:
        with pytest.raises(AmbiguousSession):
            router_owner(request_scope)
        return
    read_by_endpoint = read_token(SERIALIZER, Request(request_scope).headers[TOKEN_HEADER])
    assert router_owner(request_scope) == read_by_endpoint.get(OWNER_KEY)


@settings(max_examples=200, deadline=None)
@given(valid_cookies, st.lists(cookie_pairs().filter(lambda pair: not pair.strip().startswith(COOKIE + "=")), max_size=3))
def test_one_session_cookie_among_others_is_never_ambiguous(session_cookie, others):
    header = "; ".join([*others, f"{COOKIE}={session_cookie}"]).encode("utf-8")
    owner = router_owner(scope("/echo/x", [(b"cookie", header)]))
    assert owner in (*OWNERS, SERVER.worker_id, None)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([LOCAL_COOKIE, f'"{LOCAL_COOKIE}"', f"  {LOCAL_COOKIE} "]), st.lists(cookie_pairs().filter(lambda pair: not pair.strip().startswith(COOKIE + "=")), max_size=3))
def test_a_request_served_here_has_its_cookie_verified_once_and_the_app_loads_the_session_the_router_read(session_cookie, others):
    header = "; ".join([*others, f"{COOKIE}={session_cookie}"]).encode("utf-8")
    read_by_router = ROUTER.owners.named_session(scope("/echo/x", [(b"cookie", header)]))
    assert read_by_router is not None and read_by_router.get(OWNER_KEY) == SERVER.worker_id
    with mock.patch.object(TimestampSigner, "unsign", autospec=True, side_effect=TimestampSigner.unsign) as unsign:
        reply = asyncio.run(app_reply(scope("/echo/x", [(b"cookie", header)]), ROUTER))
    assert unsign.call_count == 1
    assert (reply["session_id"], reply["owner"]) == (read_by_router[SESSION_ID_KEY], SERVER.worker_id)


def session_cookie_value(cookie_headers: list[str]) -> str | None | type[AmbiguousSession]:
    try:
        return ROUTER.owners.session_cookie_value(cookie_headers)
    except AmbiguousSession:
        return AmbiguousSession


@settings(max_examples=400, deadline=None)
@given(cookie_headers())
def test_one_cookie_header_read_whole_reads_the_value_the_chunk_by_chunk_reading_does(headers):
    header = headers[0].decode("latin-1")
    # An empty second Cookie header names nothing, and sends the reader the chunk-by-chunk way.
    assert session_cookie_value([header]) == session_cookie_value([header, ""])


def test_a_direct_hit_parses_its_cookie_header_once():
    header = f"other=1; {COOKIE}={LOCAL_COOKIE}".encode()
    with mock.patch("nemo_gym.routing.owner.cookie_parser", side_effect=cookie_parser) as by_router, mock.patch("nemo_gym.sessions.cookie.cookie_parser", side_effect=cookie_parser) as by_app:
        reply = asyncio.run(app_reply(scope("/echo/x", [(b"cookie", header)]), ROUTER))
    assert reply["owner"] == SERVER.worker_id
    assert by_router.call_count + by_app.call_count == 1
