"""A multi-worker server's workers are forked from its process, which has imported the libraries already; each
worker still runs the server's own modules in its worker environment and answers signals as a spawned one."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.config.paths import search_roots
from nemo_gym.process import discovery
from nemo_gym.process.launcher import Launcher
from scripts.bench.processes import current_workers
from tests.unit_tests.process.test_launcher import gone

START_TIMEOUT_SECONDS = 120
COUNTER_2W = {"counter": {"resources_servers": {"example_session_state_mgmt": {"num_workers": 2}}}}

GUARDED_APP = '''
"""A server whose module records, at each import, the process and whether upstream's worker guard holds there."""

import json
import os

from nemo_gym.base_resources_server import SimpleResourcesServer
from nemo_gym.server_utils import is_nemo_gym_fastapi_entrypoint


class GuardedServer(SimpleResourcesServer):
    pass


with open(os.environ["IMPORTS_LOG"], "a") as log:
    log.write(json.dumps({"pid": os.getpid(), "worker": is_nemo_gym_fastapi_entrypoint(__file__)}) + "\\n")
'''


def command_line(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


@pytest.fixture(scope="module")
def counter():
    launcher = Launcher(gym_config.parse(COUNTER_2W), gym_config.free_port())
    launcher.start(timeout=START_TIMEOUT_SECONDS)
    try:
        yield launcher
    finally:
        launcher.stop()


def test_a_multi_worker_servers_workers_are_forked_from_its_process_not_spawned(counter):
    supervisor = counter.processes["counter"].pid
    workers = current_workers(supervisor)

    assert len(workers) == 2
    assert all(command_line(worker) == command_line(supervisor) for worker in workers)
    assert all(b"spawn_main" not in command_line(worker) for worker in workers)


def test_each_forked_worker_imports_the_server_module_again_in_its_worker_environment(tmp_path, monkeypatch):
    directory = tmp_path / "resources_servers" / "guarded"
    directory.mkdir(parents=True)
    (directory / "app.py").write_text(GUARDED_APP)
    imports_log = tmp_path / "imports.jsonl"
    monkeypatch.setenv("IMPORTS_LOG", str(imports_log))
    instances = gym_config.parse({"guarded": {"resources_servers": {"guarded": {"num_workers": 2}}}})
    discovery.check_settings(instances, search_roots([tmp_path]))
    imports_log.unlink()  # the check above imported it in this process
    launcher = Launcher(instances, gym_config.free_port(), {"IMPORTS_LOG": str(imports_log)})
    launcher.start(timeout=START_TIMEOUT_SECONDS)
    try:
        supervisor = launcher.processes["guarded"].pid
        workers = current_workers(supervisor)
        imports = [json.loads(line) for line in imports_log.read_text().splitlines()]
    finally:
        launcher.stop()

    assert sorted((entry["pid"], entry["worker"]) for entry in imports) == sorted([(supervisor, False)] + [(worker, True) for worker in workers])


@pytest.mark.skipif(
    signal.getsignal(signal.SIGHUP) == signal.SIG_IGN,
    reason="SIGHUP is ignored here (run under nohup?): every process started from here ignores it, a spawned worker too",
)
def test_a_forked_worker_ends_on_a_signal_uvicorns_supervisor_traps_as_a_spawned_worker_does(counter):
    worker = current_workers(counter.processes["counter"].pid)[0]

    os.kill(worker, signal.SIGHUP)  # uvicorn's supervisor restarts its workers on it; a worker has the default: end

    deadline = time.monotonic() + 30
    while not gone(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(worker)
