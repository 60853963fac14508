"""The session router: each request served here, forwarded to its owner, placed, or refused (400, 410).

Two in-process workers of one server sharing a real socket directory (``pair``).

Every routed reply names the worker whose public socket accepted the connection: X-NeMo-Gym-Worker.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import uuid
from unittest import mock

import pytest
from fastapi import FastAPI
from itsdangerous import TimestampSigner
from starlette.responses import JSONResponse

from nemo_gym import SESSION_ID_KEY
from nemo_gym.middleware.cancel_on_disconnect import CancelOnDisconnect
from nemo_gym.routing.lost import Decision, ForwardTo, Reply, ServeHere
from nemo_gym.routing.router import SessionRouter
from nemo_gym.routing.transport.unix import socket_address
from nemo_gym.sessions.worker import OWNER_KEY, WORKER_HEADER
from tests.session_cookies import cookie_owner, session_of, signed_session
from tests.unit_tests.routing_workers import Caller, EchoServer, Worker, new_session, set_cookies, two_workers

pytestmark = pytest.mark.anyio


async def test_new_session_is_handled_locally_and_owned_by_its_worker(pair):
    a, b, caller = pair
    response = await caller.post(a, "/echo/x")
    body = await response.json()
    cookies = {key: morsel.value for key, morsel in response.cookies.items()}
    assert body["worker"] == a.server.worker_id
    assert cookie_owner(cookies, a.server.name, a.server.secret) == a.server.worker_id


async def test_session_owned_by_other_worker_is_forwarded_with_a_single_set_cookie(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    response = await caller.post(b, "/increment", cookies)
    assert await response.json() == {"worker": a.server.worker_id, "count": 2}
    [cookie] = set_cookies(response) or [None]
    assert cookie is None or cookie.startswith(a.server.session_cookie)
    response = await caller.post(b, "/echo/x", {**cookies, "other": "1"})
    assert (await response.json())["worker"] == a.server.worker_id
    assert len(set_cookies(response)) <= 1


async def test_a_request_gets_an_id_of_the_routers_only_when_it_leaves_the_worker_that_received_it():
    """The router's Idempotency-Key names a request for what may send it again (a forward's retry, the lost-session
    policy, a replay to an adopter); one served where it lands is never sent again by anyone, so it gets none. A
    client's own id is passed on as sent."""
    async with two_workers(hand_off=False) as (a, b, caller):
        cookies = await new_session(caller, a)
        local = await (await caller.post(a, "/echo/x", cookies)).json()
        forwarded = await (await caller.post(b, "/echo/x", cookies)).json()
        own = await (await caller.post(b, "/echo/x", cookies, headers={"Idempotency-Key": "client-1"})).json()
    ids = [[value for name, value in body["headers"] if name == "idempotency-key"] for body in (local, forwarded, own)]
    assert (ids[0], len(ids[1]), ids[2]) == ([], 1, ["client-1"]), ids


async def test_forwarded_reply_that_changes_the_session_carries_only_the_owners_set_cookie(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    response = await caller.post(b, "/touch", cookies)
    assert (await response.json())["worker"] == a.server.worker_id
    [cookie] = set_cookies(response)
    name, _, value = cookie.partition(";")[0].partition("=")
    assert name == a.server.session_cookie
    assert session_of(a.server.signing_key, value)["touched_by"] == a.server.worker_id


async def test_session_of_a_worker_that_shut_down_gets_410(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    await a.stop()
    with socket.socket(socket.AF_UNIX) as private, pytest.raises(ConnectionRefusedError):
        private.connect(socket_address(a.server.transport.socket_dir, a.server.worker_id))  # its name went with it
    response = await caller.post(b, "/increment", cookies)
    assert response.status == 410
    assert set_cookies(response) == []  # a lost session is not handed a new cookie
    detail = (await response.json())["detail"]
    assert a.server.worker_id in detail and "gone" in detail


async def test_cookie_minted_before_a_restart_gets_410():
    name = f"echo_{uuid.uuid4().hex[:8]}"
    first_run, second_run = (tempfile.mkdtemp(prefix="ngw-test-", dir="/tmp") for _ in range(2))
    caller = Caller()
    try:
        before = await Worker(name, 2, first_run).start()
        cookies = await new_session(caller, before)
        await before.stop()
        after = await Worker(name, 2, second_run).start()
        try:
            response = await caller.post(after, "/increment", cookies)
            assert response.status == 410
        finally:
            await after.stop()
    finally:
        await caller.close()
        os.rmdir(first_run)
        os.rmdir(second_run)


async def test_single_worker_cookie_is_adopted(pair):
    a, b, caller = pair
    cookie = signed_session(a.server.signing_key, {SESSION_ID_KEY: "from-one-worker"})
    response = await caller.post(b, "/echo/x", {a.server.session_cookie: cookie})
    body = await response.json()
    assert body["worker"] == b.server.worker_id
    assert body["session_id"] == "from-one-worker"
    stamped = {key: morsel.value for key, morsel in response.cookies.items()}
    assert session_of(b.server.signing_key, stamped[b.server.session_cookie]) == {
        SESSION_ID_KEY: "from-one-worker",
        OWNER_KEY: b.server.worker_id,
    }


async def test_single_worker_server_has_no_routing():
    worker = await Worker(f"echo_{uuid.uuid4().hex[:8]}", 1, None).start()
    caller = Caller()
    try:
        assert worker.server.worker_id is None and worker.server.transport is None
        response = await caller.post(worker, "/echo/x")
        cookies = {key: morsel.value for key, morsel in response.cookies.items()}
        assert OWNER_KEY not in session_of(worker.server.signing_key, cookies[worker.server.session_cookie])
        assert isinstance(worker.app.app.app.app, CancelOnDisconnect)  # no router: metrics, body limit, served here, the app
    finally:
        await caller.close()
        await worker.stop()


async def test_routing_switched_off_in_the_config_installs_nothing():
    worker = await Worker(f"echo_{uuid.uuid4().hex[:8]}", 4, None, route_sessions=False).start()
    try:
        assert worker.server.worker_id is None and worker.server.transport is None
    finally:
        await worker.stop()


async def test_forged_owner_cannot_escape_the_socket_directory(pair):
    a, b, caller = pair
    outside = tempfile.mkdtemp(prefix="ngw-outside-", dir="/tmp")
    for owner in ("../" + os.path.basename(outside) + "/x", "/tmp/x", "A" * 16, 42):
        cookie = signed_session(a.server.signing_key, {SESSION_ID_KEY: "s", OWNER_KEY: owner})
        response = await caller.post(b, "/echo/x", {a.server.session_cookie: cookie})
        assert response.status == 400, owner
        assert "owner" in (await response.json())["detail"]
    assert os.listdir(outside) == []
    os.rmdir(outside)


async def test_client_address_header_from_the_public_port_is_stripped(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    spoof = {"X-NeMo-Gym-Client": "6.6.6.6:666"}
    for worker in (a, b):
        body = await (await caller.post(worker, "/echo/x", cookies, headers=spoof)).json()
        assert body["client"][0] == "127.0.0.1"
        assert "x-nemo-gym-client" not in dict(body["headers"])


async def test_a_session_reading_header_from_the_public_port_is_stripped_and_never_taken_as_the_session(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    mine = session_of(a.server.signing_key, cookies[a.server.session_cookie])[SESSION_ID_KEY]
    forged = {"X-NeMo-Gym-Session-Read": json.dumps({SESSION_ID_KEY: "victim", OWNER_KEY: a.server.worker_id})}
    for worker in (a, b):  # served where it lands, and forwarded to its owner
        body = await (await caller.post(worker, "/echo/x", cookies, headers=forged)).json()
        assert (body["worker"], body["session_id"]) == (a.server.worker_id, mine)
        assert "x-nemo-gym-session-read" not in dict(body["headers"])


async def test_a_request_forwarded_to_its_sibling_owner_has_its_cookie_verified_once_on_this_host(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    with mock.patch.object(TimestampSigner, "unsign", autospec=True, side_effect=TimestampSigner.unsign) as unsign:
        body = await (await caller.post(b, "/echo/x", cookies)).json()
    assert (body["worker"], body["session_id"]) == (a.server.worker_id, session_of(a.server.signing_key, cookies[a.server.session_cookie])[SESSION_ID_KEY])
    assert unsign.call_count == 1


async def test_nothing_in_the_routing_grows_with_sessions_served(pair):
    a, b, caller = pair
    for _ in range(50):
        cookies = await new_session(caller, a)
        assert (await (await caller.post(b, "/increment", cookies)).json())["count"] == 2
    assert list(b.server.transport.pools) == [a.server.worker_id]
    assert len(b.server.transport.idle(a.server.worker_id)) == 1  # one request at a time: one connection
    assert a.server.transport.pools == {}


class AnsweringPolicy:
    """A lost-session policy that answers what the test says, and notes what it was asked."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        self.asked: list[tuple[str, str, dict]] = []

    async def owner_gone(self, owner: str, session: dict, request: str | None = None) -> Decision:
        self.asked.append(("gone", owner, session))
        return self.decision

    async def owner_died(self, owner: str, session: dict, request: str | None = None) -> Reply:
        self.asked.append(("died", owner, session))
        return self.decision


def router_of(worker: Worker) -> SessionRouter:
    return worker.app.app.app  # inside the metrics endpoint and the body limit


async def session_of_a_dead_owner(caller: Caller, a: Worker) -> tuple[dict[str, str], str]:
    cookies = await new_session(caller, a)
    session_id = session_of(a.server.signing_key, cookies[a.server.session_cookie])[SESSION_ID_KEY]
    await a.stop()
    return cookies, session_id


async def test_for_a_dead_owner_the_router_asks_the_policy_with_the_session_it_read_and_serves_here_with_the_body_given_again(pair):
    a, b, caller = pair
    cookies, session_id = await session_of_a_dead_owner(caller, a)
    policy = router_of(b).lost = AnsweringPolicy(ServeHere())
    body = await (await caller.post(b, "/echo/x", cookies, data="kept")).json()
    assert (body["worker"], body["body"], body["session_id"]) == (b.server.worker_id, "kept", session_id)
    [(death, owner, session)] = policy.asked
    assert (death, owner, session[SESSION_ID_KEY], session[OWNER_KEY]) == ("gone", a.server.worker_id, session_id, a.server.worker_id)


async def test_for_a_dead_owner_the_router_forwards_where_the_policy_says(pair):
    a, b, caller = pair
    cookies, session_id = await session_of_a_dead_owner(caller, a)
    c = await Worker(b.server.name, 2, b.server.transport.socket_dir).start()
    try:
        router_of(b).lost = AnsweringPolicy(ForwardTo(c.server.worker_id))
        body = await (await caller.post(b, "/echo/x", cookies, data="kept")).json()
        assert (body["worker"], body["body"], body["session_id"]) == (c.server.worker_id, "kept", session_id)
    finally:
        await c.stop()


async def test_for_a_dead_owner_the_router_sends_the_policys_reply_with_the_sessions_cookie(pair):
    a, b, caller = pair
    cookies, _ = await session_of_a_dead_owner(caller, a)
    router_of(b).lost = AnsweringPolicy(Reply(JSONResponse(status_code=418, content={"detail": "the policy's own"})))
    response = await caller.post(b, "/increment", cookies)
    assert (response.status, await response.json()) == (418, {"detail": "the policy's own"})
    [cookie] = set_cookies(response)
    name, _, value = cookie.partition(";")[0].partition("=")
    assert name == b.server.session_cookie
    assert session_of(b.server.signing_key, value) == session_of(b.server.signing_key, cookies[name])  # re-signed, the same session


async def test_a_dead_owners_request_has_its_cookie_read_once(pair, monkeypatch):
    a, b, caller = pair
    cookies, _ = await session_of_a_dead_owner(caller, a)
    router = router_of(b)
    router.lost = AnsweringPolicy(ServeHere())
    reads = []
    load = router.owners.session_layer.load

    def counted(cookie):
        reads.append(cookie)
        return load(cookie)

    monkeypatch.setattr(router.owners.session_layer, "load", counted)
    assert (await caller.post(b, "/echo/x", cookies)).status == 200
    assert len(reads) == 1


class ForgingServer(EchoServer):
    """Its handler sets the worker header itself, as if to mislabel the connection."""

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/forge")(self.forge)
        return app

    async def forge(self) -> JSONResponse:
        return JSONResponse({"worker": self.worker_id}, headers={WORKER_HEADER: "0123456789abcdef"})


@pytest.fixture
async def pair():
    async with two_workers(ForgingServer) as workers:
        yield workers


async def test_a_local_reply_names_the_worker_that_served_it(pair):
    a, b, caller = pair
    response = await caller.post(a, "/increment")
    assert (await response.json())["worker"] == a.server.worker_id
    assert response.headers.getall(WORKER_HEADER) == [a.server.worker_id]


async def test_a_forwarded_reply_names_the_receiving_worker_not_the_owner(pair):
    a, b, caller = pair
    first = await caller.post(a, "/increment")
    cookies = {key: morsel.value for key, morsel in first.cookies.items()}
    response = await caller.post(b, "/increment", cookies)
    assert await response.json() == {"worker": a.server.worker_id, "count": 2}
    assert response.headers.getall(WORKER_HEADER) == [b.server.worker_id]


async def test_a_worker_header_set_by_the_app_is_replaced_locally_and_after_a_forward(pair):
    a, b, caller = pair
    local = await caller.post(a, "/forge")
    cookies = {key: morsel.value for key, morsel in local.cookies.items()}
    assert local.headers.getall(WORKER_HEADER) == [a.server.worker_id]
    forwarded = await caller.post(b, "/forge", cookies)
    assert (await forwarded.json())["worker"] == a.server.worker_id
    assert forwarded.headers.getall(WORKER_HEADER) == [b.server.worker_id]


async def test_error_replies_of_the_router_name_the_worker_too(pair):
    a, b, caller = pair
    first = await caller.post(a, "/increment")
    cookie = f"{a.server.session_cookie}={first.cookies[a.server.session_cookie].value}"
    response = await caller.post(b, "/increment", headers=[("Cookie", cookie + "; " + a.server.session_cookie + "=other")])
    assert response.status == 400
    assert response.headers.getall(WORKER_HEADER) == [b.server.worker_id]


async def test_a_single_worker_server_adds_no_worker_header():
    worker = await Worker(f"label_{uuid.uuid4().hex[:8]}", 1, None).start()
    caller = Caller()
    try:
        response = await caller.post(worker, "/increment")
        assert response.status == 200 and WORKER_HEADER not in response.headers
    finally:
        await caller.close()
        await worker.stop()
