"""A /tmp cleaner empties a running server's socket directory: its live workers keep their sessions.

The durable counter at 3 workers (placement on, so that every worker owns sessions), whose sessions a
sibling would adopt if it took their owner for dead.
Every request goes on a connection of its own, so it lands on any worker and is forwarded to the owner,
and with the session's first cookie, never a later one, as a client that kept an old cookie does.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import aiohttp

from nemo_gym.client.reading import cookie_header
from tests.e2e.session_routing.test_durable_sessions import COOKIE, COUNTER, SECRET, counter_config
from tests.session_cookies import cookie_owner

SESSIONS = 30
ROUNDS = 4


def empty(directory: str) -> list[str]:
    """Delete everything in ``directory``, as a cleaner of old files in /tmp would; what was there."""
    removed = []
    for entry in Path(directory).iterdir():
        removed.append(entry.name)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return removed


async def on_fresh_connections(url: str, requests: list[tuple[str, dict, dict[str, str] | None]]) -> list[tuple[int, dict, dict[str, str]]]:
    """Each request (path, body, cookies) on a connection of its own: status, JSON body, cookies set."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def one(path: str, body: dict, cookies: dict[str, str] | None):
            headers = {"Cookie": cookie_header(cookies)} if cookies else {}
            async with http.post(url + path, json=body, headers=headers) as reply:
                return reply.status, await reply.json(), {name: morsel.value for name, morsel in reply.cookies.items()}

        return await asyncio.gather(*(one(*request) for request in requests))


def test_a_live_workers_sessions_are_never_adopted_when_its_socket_directory_is_emptied(start_servers, tmp_path):
    launcher = start_servers(counter_config(3, place_sessions=True), {"NEMO_GYM_STATE_DIR": str(tmp_path)})
    url = launcher.instances["example_session_state_mgmt"].url
    seeded = asyncio.run(on_fresh_connections(url, [("/seed_session", {}, None)] * SESSIONS))
    assert [status for status, _, _ in seeded] == [200] * SESSIONS
    first_cookies = [cookies for _, _, cookies in seeded]
    owners = [cookie_owner(cookies, COUNTER, SECRET) for cookies in first_cookies]
    assert len(set(owners)) >= 2
    removed = []
    for count in range(1, ROUNDS + 1):
        if count == 2:
            removed = empty(launcher.socket_dirs["example_session_state_mgmt"])
        added = asyncio.run(on_fresh_connections(url, [("/increment_counter", {"count": 1}, cookies) for cookies in first_cookies]))
        assert [status for status, _, _ in added] == [200] * SESSIONS, added
        read = asyncio.run(on_fresh_connections(url, [("/get_counter_value", {}, cookies) for cookies in first_cookies]))
        assert [(status, body) for status, body, _ in read] == [(200, {"count": count})] * SESSIONS
        # No reply hands the session to another worker: any cookie set names the owner it had.
        for session, (_, _, cookies) in enumerate(added + read):
            if COOKIE in cookies:
                assert cookie_owner(cookies, COUNTER, SECRET) == owners[session % SESSIONS]
    assert removed, "the socket directory had nothing to delete"
