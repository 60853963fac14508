"""Balanced placement: a new session starts on the worker that started the fewest, and a damaged counter
file can neither fault a worker nor steer its choices."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile

import pytest
from hypothesis import given, strategies as st

from nemo_gym.routing.placement import COUNT, MAX_COUNT, Placement, SessionCount, count_path, count_value
from nemo_gym.routing.transport.unix import LifeName, UnixTransport
from nemo_gym.sessions.worker import new_worker_id
from tests.session_cookies import cookie_owner
from tests.unit_tests.routing_workers import Worker, two_workers


@given(st.binary(max_size=32))
def test_a_counter_holds_a_count_only_as_exactly_eight_bytes_of_one_in_range(data):
    value = count_value(data)
    if value is None:
        assert len(data) != COUNT.size or not 0 <= COUNT.unpack(data)[0] <= MAX_COUNT
    else:
        assert 0 <= value <= MAX_COUNT and COUNT.pack(value) == data


@given(st.integers(min_value=0, max_value=MAX_COUNT))
def test_every_count_in_range_reads_back_as_written(value):
    assert count_value(COUNT.pack(value)) == value


@pytest.fixture
def socket_dir():
    directory = tempfile.mkdtemp(prefix="ngw-test-", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def workers(socket_dir):
    """Three live workers' placements (each holding its life name), all open and aware of each other."""
    lives, placements = [], []
    for _ in range(3):
        worker = new_worker_id()
        life = LifeName(socket_dir, worker)
        life.hold()
        lives.append(life)
        placements.append(Placement(socket_dir, worker, 3, UnixTransport(socket_dir).is_alive))
    for placement in placements:
        placement.open()
    for placement in placements:
        placement.refresh()
    yield placements
    for placement in placements:
        placement.close()
    for life in lives:
        life.release()


def damage_with(kind: str, path: str) -> None:
    if kind == "truncated":
        os.truncate(path, 0)
    elif kind == "garbage":
        with open(path, "wb") as file:
            file.write(b"\x01\x02\x03")
    elif kind == "negative":
        with open(path, "wb") as file:
            file.write(struct.pack("q", -5))
    elif kind == "huge":
        with open(path, "wb") as file:
            file.write(struct.pack("q", 2**62))


@pytest.mark.parametrize("kind", ["truncated", "garbage", "negative", "huge"])
def test_a_damaged_sibling_counter_is_set_level_with_the_least_loaded_by_the_next_worker_to_place(workers, kind):
    a, b, c = workers
    for _ in range(4):
        a.own.add(1)  # a has started the most: its next new sessions go to siblings
    c.own.add(1)
    damage_with(kind, count_path(b.directory, b.worker_id))
    assert b.worker_id not in a.counts()
    assert {a.choose(), a.choose()} == {b.worker_id, c.worker_id}  # b was set level with c (1), then each took one
    assert a.counts() == {b.worker_id: 2, c.worker_id: 2}


@pytest.mark.parametrize("kind", ["truncated", "garbage", "negative", "huge"])
def test_a_worker_that_finds_its_own_counter_damaged_sets_it_level_and_keeps_the_session(workers, kind):
    a, b, c = workers
    a.own.add(3)
    damage_with(kind, count_path(b.directory, b.worker_id))
    assert b.choose() is None
    assert a.counts()[b.worker_id] == 1  # level with c (0), plus the session it kept


@pytest.mark.parametrize("replacement", ["directory", "symlink", "fifo"])
def test_a_counter_file_replaced_by_something_else_is_not_opened(socket_dir, replacement):
    path = os.path.join(socket_dir, new_worker_id() + ".sessions")
    if replacement == "directory":
        os.mkdir(path)
    elif replacement == "symlink":
        os.symlink("/dev/zero", path)
    else:
        os.mkfifo(path)
    with pytest.raises(OSError):
        SessionCount(path)


def test_a_live_siblings_counter_stays_in_use_when_its_file_is_deleted(workers):
    a, b, c = workers
    os.unlink(count_path(b.directory, b.worker_id))
    a.refresh()
    assert b.worker_id in a.counts()
    b.own.add(10)
    assert a.counts()[b.worker_id] == b.own.value


def test_a_worker_whose_socket_directory_is_gone_starts_and_places_nothing(socket_dir):
    worker = new_worker_id()
    os.rmdir(socket_dir)
    placement = Placement(socket_dir, worker, 2, UnixTransport(socket_dir).is_alive)
    placement.open()
    try:
        assert placement.choose() is None
    finally:
        placement.close()


def test_with_placement_off_a_new_session_starts_here_and_touches_no_counter(workers):
    a, b, _ = workers
    a.balance = False
    before = {worker: count.value for worker, count in a.siblings.items()}, a.own.value
    assert [a.choose() for _ in range(5)] == [None] * 5
    assert ({worker: count.value for worker, count in a.siblings.items()}, a.own.value) == before


@pytest.fixture
async def placing_pair():
    """Workers A and B with balanced placement on, each aware of the other."""
    async with two_workers(place_sessions=True) as (a, b, caller):
        for worker in (a, b):
            worker.server.placement.refresh()
        yield a, b, caller


@pytest.mark.anyio
async def test_new_sessions_arriving_at_one_worker_are_started_on_the_one_that_started_fewest(placing_pair):
    a, b, caller = placing_pair
    owners = []
    for number in range(20):
        response = await caller.post(a, "/echo/x", data=f"seed {number}")
        body = await response.json()
        assert body["body"] == f"seed {number}"  # the body the placement read first still arrives
        owners.append(body["worker"])
        assert cookie_owner({key: morsel.value for key, morsel in response.cookies.items()}, a.server.name, a.server.secret) == body["worker"]
    assert abs(owners.count(a.server.worker_id) - owners.count(b.server.worker_id)) <= 4


@pytest.mark.anyio
async def test_a_new_session_meant_for_a_dead_sibling_starts_here(placing_pair):
    a, b, caller = placing_pair
    for _ in range(5):
        await caller.post(a, "/echo/x")  # a has started more than b, so the next goes to b
    assert a.server.placement.least_loaded() == b.server.worker_id
    await b.stop()
    response = await caller.post(a, "/echo/x", data="kept")
    assert response.status == 200
    body = await response.json()
    assert (body["worker"], body["body"]) == (a.server.worker_id, "kept")
    assert b.server.worker_id not in a.server.placement.siblings


@pytest.mark.anyio
async def test_a_replacement_worker_starts_level_with_the_least_loaded_sibling(placing_pair):
    a, b, caller = placing_pair
    for _ in range(6):
        await caller.post(b, "/echo/x", headers={"Cookie": "ignored=1"})
    started = a.server.placement.counts()[b.server.worker_id]
    c = await Worker(a.server.name, 2, a.server.transport.socket_dir, place_sessions=True).start()
    try:
        assert c.server.placement.counts() == {a.server.worker_id: c.server.placement.counts()[a.server.worker_id], b.server.worker_id: started}
        assert c.server.placement.own.value == min(c.server.placement.counts().values())
    finally:
        await c.stop()
