"""The write-through, in process around a stand-in app: every session a request names is taken up from the
store before the app runs, the MCP token's as well as the cookie's."""

from __future__ import annotations

import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.adoption import Adopter
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.store import StoredSession
from nemo_gym.durable.write_through import WriteThrough
from nemo_gym.lifecycle.cap import LiveCount
from nemo_gym.lifecycle.ending import SessionLifecycle
from nemo_gym.sessions.cookie import NEW_SESSION_SCOPE_KEY
from nemo_gym.sessions.token import TOKEN_HEADER_KEY, mint_token, token_serializer
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
