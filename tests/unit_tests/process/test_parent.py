"""nemo_gym.process.parent: a process that follows its launcher dies with it, whatever ends the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from nemo_gym import config as gym_config
from nemo_gym.env import PARENT_PID_ENV

CHILD = "from nemo_gym.process.parent import follow_parent; import time; follow_parent(); time.sleep(120)"
PARENT = """import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**os.environ, sys.argv[2]: str(os.getpid())})
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_process_that_follows_its_launcher_ends_when_the_launcher_is_sigkilled():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(gym_config.REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, PARENT_PID_ENV], env=env, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{child}").exists()
    finally:
        parent.kill()
        parent.wait()


FOLLOW = "import os; from nemo_gym.process.parent import follow_parent; follow_parent(); print(os.environ.get(%r))" % PARENT_PID_ENV


def run_following(parent: str | None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != PARENT_PID_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(gym_config.REPO_ROOT), os.environ.get("PYTHONPATH")]))
    if parent is not None:
        env[PARENT_PID_ENV] = parent
    return subprocess.run([sys.executable, "-c", FOLLOW], env=env, capture_output=True, text=True, timeout=60)


def test_a_process_whose_launcher_is_already_gone_stops_at_once():
    # The child's parent is this test's process, never PID 1's child named here.
    assert run_following("1").returncode == -signal.SIGTERM


def test_a_process_that_follows_its_living_launcher_runs_on_and_hands_its_name_to_no_child():
    done = run_following(str(os.getpid()))
    assert (done.returncode, done.stdout) == (0, "None\n")


def test_a_process_no_launcher_named_runs_on():
    done = run_following(None)
    assert (done.returncode, done.stdout) == (0, "None\n")


def test_children_are_those_of_every_thread_and_only_while_they_live():
    from nemo_gym.process.parent import children

    started: list[subprocess.Popen] = []
    thread = threading.Thread(target=lambda: started.append(subprocess.Popen(["sleep", "60"])))
    thread.start()
    thread.join()
    started.append(subprocess.Popen(["sleep", "60"]))
    try:
        assert {child.pid for child in started} <= children(os.getpid())
        started[0].kill()
        started[0].wait()
        assert started[0].pid not in children(os.getpid()) and started[1].pid in children(os.getpid())
    finally:
        for child in started:
            child.kill()
            child.wait()
    assert children(2**22 + 1) == set()  # no such process
