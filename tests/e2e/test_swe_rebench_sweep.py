"""swe_rebench as real processes: a SIGKILLed worker's sandboxes are swept (durable ones: test_swe_rebench_durable.py), nothing is left after a stop, no bwrap no start."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from nemo_gym.process.launcher import LaunchError
from nemo_gym.process.run import WORKER_HEALTHCHECK_SECONDS
from resources_servers.swe_rebench.tmpfs import mounts_under
from tests.e2e.test_swe_rebench_one_worker import SWE, episodes, sandboxes_in
from tests.programs import needs

# Every test here starts swe_rebench, whose commands run in a bubblewrap jail.
pytestmark = needs("bwrap")


def swe_alone(sandbox_dir: Path, **settings) -> dict:
    return {SWE: {"resources_servers": {SWE: {"entrypoint": "app.py", "sandbox_dir": str(sandbox_dir), **settings}}}}


def seed(url: str) -> int:
    """Seed a new session (no cookie sent, so a new one); the pid of the worker that holds its sandbox."""
    request = urllib.request.Request(f"{url}/seed_session", json.dumps(episodes(1)[0]).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.load(reply)["worker_pid"]


def wait_for(condition, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def assert_nothing_left(sandbox_dir: Path) -> None:
    assert not sandbox_dir.exists()
    assert mounts_under(sandbox_dir) == []


def test_without_durable_sessions_a_sigkilled_workers_sandboxes_are_swept_and_nothing_is_left_after_the_stop(start_servers, tmp_path):
    sandbox_dir = tmp_path / "sandboxes"
    launcher = start_servers(swe_alone(sandbox_dir, num_workers=2, durable_sessions=False))
    url = launcher.instances[SWE].url
    holders = [seed(url) for _ in range(12)]
    assert len(set(holders)) == 2, holders
    assert len(sandboxes_in(sandbox_dir)) == 12
    os.kill(holders[0], signal.SIGKILL)
    # uvicorn starts a worker in its place, and that worker's start sweeps what the killed one left. A kill
    # that lands while the supervisor pings that worker is seen only once the ping has timed out.
    alive = 12 - holders.count(holders[0])
    replaced = WORKER_HEALTHCHECK_SECONDS + 30
    assert wait_for(lambda: len(sandboxes_in(sandbox_dir)) == alive, replaced), (sandboxes_in(sandbox_dir), launcher.log_tail(SWE))
    assert len(mounts_under(sandbox_dir)) == alive
    launcher.stop()
    assert_nothing_left(sandbox_dir)


def test_a_sigkilled_servers_sandboxes_are_swept_by_the_next_start(start_servers, tmp_path):
    sandbox_dir = tmp_path / "sandboxes"
    first = start_servers(swe_alone(sandbox_dir))
    for _ in range(3):
        seed(first.instances[SWE].url)
    first.processes[SWE].send_signal(signal.SIGKILL)
    first.processes[SWE].wait(timeout=30)
    assert len(sandboxes_in(sandbox_dir)) == 3 and len(mounts_under(sandbox_dir)) == 3
    first.stop()
    second = start_servers(swe_alone(sandbox_dir))
    assert sandboxes_in(sandbox_dir) == [] and mounts_under(sandbox_dir) == []
    second.stop()
    assert_nothing_left(sandbox_dir)


def test_a_server_without_bwrap_refuses_to_start_and_says_how_to_install_it(start_servers, tmp_path):
    with pytest.raises(LaunchError, match="apt-get install bubblewrap"):
        start_servers(swe_alone(tmp_path / "sandboxes", bwrap="/nonexistent/bwrap"))
