"""A placement counter file broken in place (truncated, garbage, out of range, a directory or symlink):
no worker dies of it, and new sessions still spread over the workers.

The counter at 3 workers with balanced placement on; one server for every kind of damage, each done to
one worker's ``<worker>.sessions`` file and followed by 45 new sessions on connections of their own.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.session_routing.test_durable_sessions import COUNTER, SECRET, counter_config
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
