"""A placement counter file broken in place (truncated, garbage, out of range, a directory or symlink):
no worker dies of it, and new sessions still spread over the workers.

The counter at 3 workers with balanced placement on; one server for every kind of damage, each done to
one worker's ``<worker>.sessions`` file and followed by 45 new sessions on connections of their own.
"""

from __future__ import annotations

import asyncio
import os
import struct
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from nemo_gym.sessions.worker import WORKER_HEADER
from tests.e2e.session_routing.test_durable_sessions import COUNTER, SECRET, counter_config, kill
from tests.e2e.session_routing.test_vanished_files import on_fresh_connections
from tests.session_cookies import cookie_owner

WORKERS = 3
NEW_SESSIONS = 45


def truncate(path: Path) -> None:
    os.truncate(path, 0)


def garbage(path: Path) -> None:
    path.write_bytes(b"\xff\x00garbage, and longer than a counter")


def negative(path: Path) -> None:
    path.write_bytes(struct.pack("q", -1_000_000))


def huge(path: Path) -> None:
    path.write_bytes(struct.pack("q", 2**62))


def directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def symlink(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


@pytest.fixture(scope="module")
def placing(start_module_servers, tmp_path_factory):
    state = tmp_path_factory.mktemp("placement_state")
    return start_module_servers(counter_config(WORKERS, place_sessions=True), {"NEMO_GYM_STATE_DIR": str(state)})


def worker_pids(launcher) -> set[str]:
    supervisor = launcher.processes["example_session_state_mgmt"].pid
    return set(Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split())


@pytest.mark.parametrize("damage", [truncate, garbage, negative, huge, directory, symlink], ids=lambda damage: damage.__name__)
def test_a_broken_placement_counter_kills_no_worker_and_new_sessions_still_spread(placing, damage: Callable[[Path], None]):
    url = placing.instances["example_session_state_mgmt"].url
    socket_dir = Path(placing.socket_dirs["example_session_state_mgmt"])
    before = worker_pids(placing)
    counters = sorted(path for path in socket_dir.iterdir() if path.name.endswith(".sessions") and path.is_file() and not path.is_symlink())
    assert len(counters) >= 1
    damage(counters[0])
    seeded = asyncio.run(on_fresh_connections(url, [("/seed_session", {}, None)] * NEW_SESSIONS))
    assert [status for status, _, _ in seeded] == [200] * NEW_SESSIONS
    assert worker_pids(placing) == before  # every worker lives: none was restarted
    placed = Counter(cookie_owner(cookies, COUNTER, SECRET) for _, _, cookies in seeded)
    assert len(placed) == WORKERS and max(placed.values()) <= NEW_SESSIONS * 0.6, placed


def forwards_not_handed_off(url: str) -> float:
    """Requests forwarded to a sibling instead of handing it their connection, summed over the workers and reasons."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
        lines = reply.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("nemo_gym_forwards_not_handed_off_total{"))


def test_new_sessions_are_placed_by_handing_their_connection_to_the_chosen_worker_which_replies_itself(placing):
    """With hand-off on (the default), a new session's first request is not forwarded to the worker placement
    chooses: its connection is handed there, so the reply comes from the session's owner, named by the worker
    header. Where a hand-off cannot be made (an owner that does not take it within a second, on a loaded machine)
    the request is forwarded and counted so: every reply from another worker than the owner is one of those."""
    url = placing.instances["example_session_state_mgmt"].url
    forwarded = forwards_not_handed_off(url)

    async def seeded() -> list[tuple[str, str]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar()) as http:

            async def one() -> tuple[str, str]:
                async with http.post(url + "/seed_session", json={}) as reply:
                    assert reply.status == 200, await reply.text()
                    return reply.headers[WORKER_HEADER], cookie_owner({name: morsel.value for name, morsel in reply.cookies.items()}, COUNTER, SECRET)

            return await asyncio.gather(*(one() for _ in range(NEW_SESSIONS)))

    replies = asyncio.run(seeded())
    not_from_owner = sum(replier != owner for replier, owner in replies)
    assert not_from_owner == forwards_not_handed_off(url) - forwarded and not_from_owner < NEW_SESSIONS / 2, replies
    placed = Counter(owner for _, owner in replies)
    assert len(placed) == WORKERS and max(placed.values()) <= NEW_SESSIONS * 0.6, placed


def test_new_sessions_placed_while_a_worker_lies_sigkilled_all_start_on_a_live_one_and_keep_their_count(placing):
    """Last in the module: it kills a worker. Placement may still choose the dead one (its counter stays behind):
    the hand-off finds no socket, the forward finds it gone, and the session starts where it arrived."""
    url = placing.instances["example_session_state_mgmt"].url
    [(_, _, cookies)] = asyncio.run(on_fresh_connections(url, [("/seed_session", {}, None)]))
    victim = cookie_owner(cookies, COUNTER, SECRET)
    kill(placing, victim)
    seeded = asyncio.run(on_fresh_connections(url, [("/seed_session", {"initial_count": number}, None) for number in range(NEW_SESSIONS)]))
    assert [status for status, _, _ in seeded] == [200] * NEW_SESSIONS
    assert victim not in {cookie_owner(cookies, COUNTER, SECRET) for _, _, cookies in seeded}
    read = asyncio.run(on_fresh_connections(url, [("/get_counter_value", {}, cookies) for _, _, cookies in seeded]))
    assert [(status, body.get("count")) for status, body, _ in read] == [(200, number) for number in range(NEW_SESSIONS)]
