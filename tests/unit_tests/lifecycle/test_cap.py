"""The live sessions of an instance's workers counted together: a cap admits exactly its limit, a dead worker's stop counting."""

from __future__ import annotations

import multiprocessing
import shutil
import tempfile

import pytest

from nemo_gym.lifecycle.cap import Cap, LiveCount
from nemo_gym.sessions.worker import new_worker_id


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="ngw-test-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def counts(directory: str, alive: set[str], number: int) -> list[LiveCount]:
    workers = [new_worker_id() for _ in range(number)]
    alive.update(workers)
    opened = [LiveCount(directory, worker, alive.__contains__) for worker in workers]
    for count in opened:
        count.open()
    return opened


CAP = Cap(100, "max_sessions (100)")


def admit_many(directory: str, worker: str, tries: int, start: multiprocessing.Event, admitted: multiprocessing.Queue) -> None:
    """One worker process: its own counter, ``tries`` admissions as fast as it can once all are ready (its counter
    file stays: a worker that stops takes its sessions' count with it)."""
    count = LiveCount(directory, worker)
    count.open()
    start.wait(30)
    admitted.put(sum(count.admit([CAP]) is None for _ in range(tries)))


def test_a_burst_of_500_over_four_worker_processes_admits_exactly_the_cap(directory):
    context = multiprocessing.get_context("fork")
    start, admitted = context.Event(), context.Queue()
    processes = [context.Process(target=admit_many, args=(directory, new_worker_id(), 125, start, admitted)) for _ in range(4)]
    for process in processes:
        process.start()
    start.set()
    totals = [admitted.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(30)
    assert sum(totals) == 100


def test_an_ended_session_makes_room_for_one_more(directory):
    first, second = counts(directory, set(), 2)
    cap = Cap(2, "max_sessions (2)")
    assert first.admit([cap]) is None and second.admit([cap]) is None
    assert first.admit([cap]) == cap
    second.add(-1)
    assert first.admit([cap]) is None


def test_a_dead_workers_sessions_stop_counting(directory):
    alive: set[str] = set()
    first, second = counts(directory, alive, 2)
    cap = Cap(2, "max_sessions (2)")
    assert second.admit([cap]) is None and second.admit([cap]) is None
    assert first.admit([cap]) == cap
    alive.discard(second.worker_id)
    assert first.admit([cap]) is None


def test_the_tightest_cap_refuses_and_is_named(directory):
    (count,) = counts(directory, set(), 1)
    caps = [Cap(5, "max_sessions (5)"), Cap(1, "max_sandbox_disk_mb (256)")]
    assert count.admit(caps) is None
    assert count.admit(caps).detail == "max_sandbox_disk_mb (256)"


def test_a_worker_without_a_shared_directory_counts_its_own(directory):
    count = LiveCount(None, None)
    count.open()
    assert count.admit([Cap(1, "x")]) is None and count.admit([Cap(1, "x")]) is not None


def test_a_closed_counter_leaves_nothing_in_the_directory(directory):
    for count in counts(directory, set(), 2):
        count.admit([])
        count.close()
    assert shutil.os.listdir(directory) == []
