"""scripts/bench/processes.py: a server serves only once every one of its workers does, as the launcher judges."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.routing.transport.unix import LifeName
from nemo_gym.sessions.worker import new_worker_id
from nemo_gym.routing.transport.unix import make_socket_dir, remove_socket_dir
from scripts.bench.proc import child_pids
from scripts.bench.processes import Spawned, command_line, current_workers, is_resource_tracker


@pytest.fixture
def answering(tmp_path: Path):
    """A real process answering GET / with 200, and its URL."""
    port = gym_config.free_port()
    process = Spawned("http", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)], tmp_path)
    url = f"http://127.0.0.1:{port}/"
    try:
        process.wait_ready(url, timeout=30)
        yield process, url
    finally:
        process.stop()


def test_a_server_answering_serves_only_once_every_worker_holds_its_life_name(answering):
    process, url = answering
    socket_dir = make_socket_dir()
    names = [LifeName(socket_dir, new_worker_id()) for _ in range(2)]
    try:
        assert process.serves(url)  # one worker: answering is serving
        assert not process.serves(url, socket_dir, workers=2)
        names[0].hold()
        assert not process.serves(url, socket_dir, workers=2)
        names[1].hold()
        assert process.serves(url, socket_dir, workers=2)
    finally:
        for name in names:
            name.release()
        remove_socket_dir(socket_dir)


def test_a_server_that_exits_is_an_error_with_its_log(tmp_path: Path):
    process = Spawned("dies", [sys.executable, "-c", "print('cannot start'); raise SystemExit(3)"], tmp_path)
    deadline = time.monotonic() + 30
    while process.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(RuntimeError, match="exited with code 3:\ncannot start"):
        process.serves("http://127.0.0.1:9/")
    process.stop()


def test_multiprocessings_resource_tracker_is_no_worker():
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # a child of this process, as it is of uvicorn's supervisor
    tracker = resource_tracker._resource_tracker._pid
    assert tracker in child_pids(os.getpid())
    # Until its exec it shows no command line, or this process's: the very case a start's count of workers meets.
    deadline = time.monotonic() + 10
    while command_line(tracker) in (b"", command_line(os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert is_resource_tracker(tracker)
    assert tracker not in current_workers(os.getpid())
    assert not is_resource_tracker(os.getpid())
