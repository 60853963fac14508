"""Standard clients against the durable counter at 4 workers: adoption after a SIGKILL, and Set-Cookie on errors.

The counter starts once for the module; each test runs one client (``standard_clients``, keeping its
cookies its own way). Where a worker is killed, every request opens a new connection: one kept alive
to the killed worker would fail in the client, before any server could answer. What a client sent is
read as the router reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from http.cookies import SimpleCookie
from pathlib import Path

import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.openai_utils import new_response
from nemo_gym.process.launcher import Launcher
from nemo_gym.routing.owner import OwnerReader
from nemo_gym.routing.request_id import ID_HEADER_NAME
from nemo_gym.sessions.worker import OWNER_KEY
from nemo_gym.sessions.token import token_serializer
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS, THINK_SECONDS, Post, Reply
from tests.e2e.session_routing.test_durable_sessions import COOKIE, COUNTER, KEY, counter_config, kill, rows
from tests.session_cookies import session_of

SESSIONS = 24
ROUTER_READING = OwnerReader({"secret_key": KEY, "session_cookie": COOKIE}, token_serializer(KEY))
Request = Callable[[int], tuple[str, dict]]


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("durable_clients_state")


@pytest.fixture(scope="module")
def counter(start_module_servers, state_dir: Path) -> Launcher:
    return start_module_servers(counter_config(4), {"NEMO_GYM_STATE_DIR": str(state_dir)}, timeout=120)


async def sent_session(reply: Reply) -> dict:
    """The session the request's Cookie header named, as the router read it ({} for none)."""
    headers = [] if reply.sent_cookie is None else [(b"cookie", reply.sent_cookie.encode("latin-1"))]
    return ROUTER_READING.named_session({"type": "http", "path": "/", "headers": headers}) or {}


def set_session(reply: Reply) -> dict | None:
    """The session the reply's Set-Cookie gave for the counter, or None if it set none."""
    cookies = SimpleCookie()
    for header in reply.set_cookies:
        cookies.load(header)
    return session_of(KEY, cookies[COOKIE].value) if COOKIE in cookies else None


async def each(posts: list[Post], request: Request) -> list[Reply]:
    """One request per session, all at once after a little think time."""

    async def one(number: int, post: Post) -> Reply:
        await asyncio.sleep(THINK_SECONDS)
        return await post(*request(number))

    return await asyncio.gather(*(one(number, post) for number, post in enumerate(posts)))


def verify(number: int) -> tuple[str, dict]:
    body = {"responses_create_params": {"input": "x"}, "response": new_response().model_dump(mode="json"), "expected_count": number + 3}
    return "/verify", body


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_sessions_of_a_sigkilled_owner_are_adopted_score_and_the_clients_next_cookie_names_the_adopter(counter, state_dir, client):
    async def scenario() -> tuple[str, list[dict], list[Reply], list[dict], dict[str, str], list[Reply]]:
        async with CLIENTS[client](counter.instances[COUNTER].url, True) as episode_post, contextlib.AsyncExitStack() as stack:
            posts = [await stack.enter_async_context(episode_post()) for _ in range(SESSIONS)]
            seeded = await each(posts, lambda number: ("/seed_session", {"initial_count": number}))
            added = await each(posts, lambda number: ("/increment_counter", {"count": 1}))
            sessions = [await sent_session(reply) for reply in added]
            victim = Counter(session[OWNER_KEY] for session in sessions).most_common(1)[0][0]
            await asyncio.to_thread(kill, counter, victim)
            adopted = await each(posts, lambda number: ("/increment_counter", {"count": 2}))
            read = await each(posts, lambda number: ("/get_counter_value", {}))
            after = [await sent_session(reply) for reply in read]
            owners = {session_id: owner for session_id, (owner, _, _) in rows(state_dir).items()}
            verdicts = await each(posts, verify)
        assert [reply.status for reply in [*seeded, *added]] == [200] * 2 * SESSIONS
        return victim, sessions, adopted, after, owners, verdicts

    victim, sessions, adopted, after, owners, verdicts = asyncio.run(scenario())
    assert [reply.status for reply in adopted] == [200] * SESSIONS, [reply.body for reply in adopted if reply.status != 200][:3]
    held = [number for number, session in enumerate(sessions) if session[OWNER_KEY] == victim]
    assert held and all(after[number][SESSION_ID_KEY] == sessions[number][SESSION_ID_KEY] for number in range(SESSIONS))
    named = {number: after[number][OWNER_KEY] for number in held}
    assert named == {number: owners[sessions[number][SESSION_ID_KEY]] for number in held} and victim not in named.values()
    assert [(reply.status, reply.body["reward"]) for reply in verdicts] == [(200, 1.0)] * SESSIONS, [reply.body for reply in verdicts][:3]


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_error_replies_set_the_session_cookie_and_the_session_goes_on(counter, client):
    """A body the tool refuses (422), an unknown tool (404), and the handler's own 404 for a session it never seeded."""

    async def scenario() -> tuple[list[Reply], Reply]:
        async with CLIENTS[client](counter.instances[COUNTER].url, False) as episode_post:
            async with episode_post() as post:
                replies = [
                    await post("/seed_session", {"initial_count": 7}),
                    await post("/increment_counter", {"count": "many"}),
                    await post("/no_such_tool", {}),
                    await post("/increment_counter", {"count": 1}),
                    await post("/get_counter_value", {}),
                ]
            async with episode_post() as post:
                unseeded = await post("/get_counter_value", {})
        return replies, unseeded

    replies, unseeded = asyncio.run(scenario())
    assert [reply.status for reply in replies] == [200, 422, 404, 200, 200] and replies[-1].body == {"count": 8}
    session_id = set_session(replies[0])[SESSION_ID_KEY]
    assert [set_session(reply)[SESSION_ID_KEY] for reply in replies[1:3]] == [session_id] * 2
    assert (unseeded.status, "seed_session" in unseeded.body["detail"]) == (404, True)
    assert set_session(unseeded)[SESSION_ID_KEY] != session_id


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_an_increment_each_client_sends_twice_under_one_idempotency_key_is_applied_once(counter, client):
    """The key a client's ``post`` is given reaches the server as it was sent: the second increment under it is
    answered with the first's reply, and the count read back has one increment in it."""

    async def scenario() -> list[Reply]:
        async with CLIENTS[client](counter.instances[COUNTER].url, False) as episode_post, episode_post() as post:
            once = {ID_HEADER_NAME: f"add-one-{client}"}
            return [
                await post("/seed_session", {"initial_count": 7}),
                await post("/increment_counter", {"count": 1}, once),
                await post("/increment_counter", {"count": 1}, once),
                await post("/get_counter_value", {}),
            ]

    replies = asyncio.run(scenario())
    assert [reply.status for reply in replies] == [200] * 4, [reply.body for reply in replies]
    assert replies[2].body == replies[1].body and replies[3].body == {"count": 8}


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_session_lost_with_its_owner_gets_410_and_no_cookie(counter, client):
    """A session that kept no durable state (never seeded) is gone with its owner's process."""

    async def scenario() -> tuple[str, Reply]:
        async with CLIENTS[client](counter.instances[COUNTER].url, True) as episode_post:
            async with episode_post() as post:
                first = await post("/get_counter_value", {})
                owner = set_session(first)[OWNER_KEY]
                await asyncio.to_thread(kill, counter, owner)
                return owner, await post("/get_counter_value", {})

    owner, lost = asyncio.run(scenario())
    assert lost.status == 410 and owner in lost.body["detail"], lost.body
    assert set_session(lost) is None
