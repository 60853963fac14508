"""The session layer's cookie is Starlette's SessionMiddleware cookie: each reads the other's, with the same Set-Cookie."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.middleware.sessions import SessionMiddleware

from nemo_gym.sessions.cookie import SESSION_READ_SCOPE_KEY, SessionCookie, decoded_reading, encoded_reading
from tests.session_cookies import session_of, signed_session

SECRET = "a session secret of at least thirty-two bytes"
NAME = "counter_session"
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3), max_leaves=5)
sessions = st.dictionaries(st.text(max_size=8), json_values, max_size=4)


def serve(layer: type, handle: Callable[[dict], None], cookie: str | None, **scope_extra: Any) -> tuple[dict, list[tuple[bytes, bytes]]]:
    """One request through ``layer`` in front of an app that calls ``handle(session)``: the session it saw, the reply's headers."""
    seen: dict = {}

    async def app(scope, receive, send) -> None:
        handle(scope["session"])
        seen.update(scope["session"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    headers = [(b"cookie", f"other=1; {NAME}={cookie}".encode())] if cookie is not None else []
    scope = {"type": "http", "method": "GET", "path": "/", "headers": headers, **scope_extra}
    asyncio.run(layer(app, secret_key=SECRET, session_cookie=NAME)(scope, receive, send))
    return seen, sent[0]["headers"]


def set_cookie(headers: list[tuple[bytes, bytes]]) -> list[str]:
    return [value.decode() for name, value in headers if name == b"set-cookie"]


def without_value(header: str) -> str:
    name, rest = header.split("=", 1)
    return f"{name}=; {rest.split('; ', 1)[1]}"


@settings(max_examples=100, deadline=None)
@given(sessions, sessions)
def test_each_layer_loads_the_session_the_other_signed(first, second):
    def write(values: dict) -> Callable[[dict], None]:
        return lambda session: session.update(values)

    _, from_starlette = serve(SessionMiddleware, write(first), None)
    _, from_ours = serve(SessionCookie, write(second), None)
    cookies = [header.split(";")[0].split("=", 1)[1] for header in set_cookie(from_starlette) + set_cookie(from_ours)]
    expected = [first, second]
    assert [serve(SessionCookie, lambda session: None, cookie)[0] for cookie in cookies] == [s for s in expected if s]
    assert [serve(SessionMiddleware, lambda session: None, cookie)[0] for cookie in cookies] == [s for s in expected if s]


@settings(max_examples=50, deadline=None)
@given(sessions.filter(bool), st.booleans())
def test_set_cookie_and_vary_are_starlettes(session, clear):
    cookie = signed_session(SECRET, session)

    def change(loaded: dict) -> None:
        loaded.clear() if clear else loaded.update({"touched": True})

    _, theirs = serve(SessionMiddleware, change, cookie)
    _, ours = serve(SessionCookie, change, cookie)
    assert [without_value(header) for header in set_cookie(ours)] == [without_value(header) for header in set_cookie(theirs)]
    assert [value for name, value in ours if name == b"vary"] == [value for name, value in theirs if name == b"vary"]
    if clear:
        assert set_cookie(ours) == set_cookie(theirs)  # the deletion, byte for byte
    else:
        assert session_of(SECRET, set_cookie(ours)[0].split(";")[0].split("=", 1)[1]) == {**session, "touched": True}


def test_a_bad_signature_or_no_cookie_is_an_empty_session_and_clearing_it_sends_nothing():
    for cookie in (None, signed_session("another secret of at least thirty-two bytes", {"a": 1})):
        for layer in (SessionMiddleware, SessionCookie):
            seen, headers = serve(layer, lambda session: session.clear(), cookie)
            assert (seen, set_cookie(headers)) == ({}, [])


def test_the_session_a_router_read_is_used_without_reading_the_cookie():
    cookie = signed_session(SECRET, {"session_id": "from the cookie"})
    seen, _ = serve(SessionCookie, lambda session: None, cookie, **{SESSION_READ_SCOPE_KEY: {"session_id": "read by the router"}})
    assert seen == {"session_id": "read by the router"}
    seen, _ = serve(SessionCookie, lambda session: None, cookie)
    assert seen == {"session_id": "from the cookie"}


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=10)


@given(st.none() | st.dictionaries(st.text(), JSON_VALUES, max_size=5))
def test_a_reading_passed_to_a_sibling_is_read_back_as_it_was(session):
    assert decoded_reading(encoded_reading(session)) == session


@given(st.binary(max_size=64) | JSON_VALUES.map(lambda value: json.dumps(value).encode()) | st.integers(1, 3000).map(lambda depth: b"[" * depth))
def test_anything_else_a_sibling_sends_as_a_reading_is_a_value_error_never_another_exception_or_a_non_object(data):
    """The forward's header and the hand-off's message both read a reading so: whatever comes, an object, null, or ValueError."""
    try:
        session = decoded_reading(data)
    except ValueError:
        return
    assert session is None or isinstance(session, dict)
