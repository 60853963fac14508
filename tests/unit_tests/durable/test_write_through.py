"""The write-through, in process around a stand-in app: every session a request names is taken up from the
store before the app runs, the MCP token's as well as the cookie's."""

from __future__ import annotations

import json

import pytest
from starlette.responses import JSONResponse
from starlette.routing import Route, Router

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.adoption import Adopter
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.store import StoredSession
from nemo_gym.durable.tombstones import ended_detail
from nemo_gym.durable.write_through import WriteThrough
from nemo_gym.lifecycle.cap import LiveCount
from nemo_gym.lifecycle.ending import SessionLifecycle
from nemo_gym.lifecycle.middleware import Lifecycle
from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.routing.request_id import ID_HEADER_NAME
from nemo_gym.sessions.cookie import NEW_SESSION_SCOPE_KEY
from nemo_gym.sessions.token import TOKEN_HEADER_KEY, mint_token, token_serializer
from tests.full_filesystem import full, needs_mount
from tests.unit_tests.durable.filling import commit_until_refused
from tests.unit_tests.durable.test_adoption import no_hook

pytestmark = pytest.mark.anyio

ME = "a" * 16


async def test_a_tool_call_whose_token_names_a_session_the_store_holds_for_no_live_worker_takes_it_up_before_the_app_runs(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    lifecycle = SessionLifecycle(no_hook, None, LiveCount(None, None), [], sessions, ME)
    tokens = token_serializer("secret")
    seen = []

    async def app(scope, receive, send):
        seen.append(counters.get("t"))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    store.import_sessions([StoredSession("t", None, 1, "41", 4e9)])  # restored, or left by a lease that lapsed
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(TOKEN_HEADER_KEY, mint_token(tokens, "t", ME).encode())],
        "session": {SESSION_ID_KEY: "new"},
        NEW_SESSION_SCOPE_KEY: True,  # the tool call carries the token alone: its cookie session is new
    }
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await WriteThrough(app, Adopter(sessions, lifecycle, lambda worker: False), tokens)(scope, receive, send)
    assert sent[0]["status"] == 200 and seen == [41]
    assert sessions.holds("t") and lifecycle.registry.is_live("t") and (await store.read("t")).owner == ME


def verifying(sessions: DurableSessions, lifecycle: SessionLifecycle, during=None):
    """The write-through and the lifecycle around an app whose ``/verify`` answers the session's count as its
    reward (after awaiting ``during()``, if given): as a durable server stacks them. Returns a call that
    posts ``/verify`` for session "s" (under the Idempotency-Key ``key``, if given) and returns (status, JSON body)."""
    tokens = token_serializer("secret")

    async def verify(request):
        if during is not None:
            await during()
        return JSONResponse({"reward": sessions.states.get(request.scope["session"][SESSION_ID_KEY])})

    routes = [Route("/verify", verify, methods=["POST"])]
    app = Lifecycle(Router(routes), lifecycle, frozenset(), frozenset({"/verify"}), tokens, routes)
    stack = WriteThrough(app, Adopter(sessions, lifecycle, lambda worker: False), tokens)

    async def post_verify(key: str | None = None) -> tuple[int, dict]:
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            sent.append(message)

        headers = [] if key is None else [(ID_HEADER_NAME.lower().encode(), key.encode())]
        scope = {"type": "http", "method": "POST", "path": "/verify", "root_path": "", "query_string": b"", "headers": headers, "session": {SESSION_ID_KEY: "s"}}
        await stack(scope, receive, send)
        return sent[0]["status"], json.loads(b"".join(message.get("body", b"") for message in sent[1:]))

    return post_verify


@needs_mount
async def test_a_verify_the_full_store_refused_leaves_its_session_live_as_stored_and_only_its_retry_ends_it(tmpfs, tmpfs_store):
    """503 "did not take effect" is true of the session's end too: the verify whose commit the full disk refused
    ended nothing (no hook, no tombstone, the state held as stored), and its retry, once there is room, is
    served, scores, and ends the session once through the hook, which sees the state it ends."""
    counters = SessionStates(int)
    sessions = DurableSessions(tmpfs_store, counters, ME)
    hooked = []

    async def hook(session_id, reason):
        hooked.append((session_id, reason, counters.get(session_id)))

    lifecycle = SessionLifecycle(hook, None, LiveCount(None, None), [], sessions, ME)
    assert lifecycle.admit("s") is None
    counters["s"] = 5
    await sessions.save(["s"])
    post_verify = verifying(sessions, lifecycle)
    with full(tmpfs):
        await commit_until_refused(tmpfs_store)
        status, body = await post_verify()
        assert status == 503 and "did not take effect" in body["detail"], body
    assert hooked == [] and lifecycle.registry.is_live("s") and counters.get("s") == 5
    assert (await tmpfs_store.read("s")).state == sessions.written["s"]
    status, body = await post_verify()
    assert (status, body) == (200, {"reward": 5})
    assert hooked == [("s", EndReason.VERIFY, 5)] and not lifecycle.registry.is_live("s") and "s" not in counters
    assert "ended with its /verify" in ended_detail((await tmpfs_store.read("s")).state)
    await lifecycle.close()
