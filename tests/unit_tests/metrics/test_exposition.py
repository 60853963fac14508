"""The multi-process aggregation: separate interpreters writing into one directory, as an instance's workers do."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from nemo_gym.metrics.exposition import MULTIPROC_DIR_ENV, Exposition, is_alive, make_metrics_dir, remove_metrics_dir
from nemo_gym.metrics.meters import METERS
from tests.unit_tests.metrics.scrape import samples, value

ROOT = Path(__file__).resolve().parents[3]
# A worker: installs the metrics under its label, starts three sessions, ends one, forwards twice; then
# says so and, unless told to exit, waits for its standard input to close.
WORKER = textwrap.dedent(
    """
    import sys
    from nemo_gym.metrics.meters import METERS, session_ended
    METERS.install(sys.argv[1], keeps_sessions=True)
    for _ in range(3):
        METERS.sessions_started.inc()
        METERS.live_sessions.inc()
    session_ended("verify")
    METERS.forwarded["worker"].inc(2)
    print("counted", flush=True)
    if sys.argv[2] == "stay":
        sys.stdin.read()
    """
)


def start(directory: str, label: str, stay: bool) -> subprocess.Popen:
    env = {**os.environ, MULTIPROC_DIR_ENV: directory, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, label, "stay" if stay else "exit"], env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "counted\n"
    return process


def test_counters_sum_over_live_and_dead_workers_and_a_dead_workers_live_sessions_go(monkeypatch):
    directory = make_metrics_dir()
    try:
        gone = start(directory, "aaaaaaaaaaaaaaaa", stay=False)
        gone.wait(timeout=60)
        alive = start(directory, "bbbbbbbbbbbbbbbb", stay=True)
        monkeypatch.setenv(MULTIPROC_DIR_ENV, directory)
        text = Exposition(METERS).text().decode()
        alive.stdin.close()
        alive.wait(timeout=60)
    finally:
        remove_metrics_dir(directory)
    assert value(text, "nemo_gym_sessions_started_total") == 6
    assert value(text, "nemo_gym_sessions_ended_total", reason="verify") == 2
    assert value(text, "nemo_gym_requests_forwarded_total", hop="worker") == 4
    assert value(text, "nemo_gym_live_sessions", worker="bbbbbbbbbbbbbbbb") == 2
    assert ("nemo_gym_live_sessions", (("worker", "aaaaaaaaaaaaaaaa"),)) not in samples(text)


def test_a_zombie_counts_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 60
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert not is_alive(child.pid) and is_alive(os.getpid())
    finally:
        child.wait()
    assert not is_alive(child.pid)


def test_a_file_that_a_starting_worker_has_made_and_not_yet_sized_is_left_out_of_the_scrape(monkeypatch):
    directory = make_metrics_dir()
    try:
        start(directory, "cccccccccccccccc", stay=False).wait(timeout=60)
        Path(directory, "counter_999999.db").touch()
        monkeypatch.setenv(MULTIPROC_DIR_ENV, directory)
        text = Exposition(METERS).text().decode()
    finally:
        remove_metrics_dir(directory)
    assert value(text, "nemo_gym_sessions_started_total") == 3

