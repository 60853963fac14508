"""The launcher: one process per instance plus the head, ready when GET / answers, stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.config.paths import search_roots
from nemo_gym.process import discovery
from nemo_gym.process.launcher import START_TIMEOUT_PER_WORKER_SECONDS, START_TIMEOUT_SECONDS, LaunchError, Launcher
from nemo_gym.routing.transport.unix import life_sockets, live_workers, socket_address

COUNTER = {"counter": {"resources_servers": {"example_session_state_mgmt": {}}}}


def gone(pid: int) -> bool:
    """No such process, or only a zombie left for its parent to reap."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_a_server_that_exits_at_start_gives_launch_error_with_its_log_tail():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = {"counter": {"resources_servers": {"example_session_state_mgmt": {"port": port}}}}
        launcher = Launcher(gym_config.parse(data, check_ports=False), gym_config.free_port())
        with pytest.raises(LaunchError) as error:
            launcher.start(timeout=60)
    message = str(error.value)
    assert message.startswith("server 'counter' exited with code")
    assert "address already in use" in message.lower()
    assert launcher.processes == {}
    assert not launcher.run_dir.exists()


def test_a_server_that_never_becomes_ready_gives_launch_error_with_its_log_tail():
    """Settings the server's config model refuses (check_settings skipped): the app cannot be built."""
    data = {"counter": {"resources_servers": {"example_session_state_mgmt": {"num_wokers": 2}}}}
    launcher = Launcher(gym_config.parse(data), gym_config.free_port())
    # Long enough for the server to import (the openai package alone is about 0.6 s of CPU) on a busy machine.
    with pytest.raises(LaunchError) as error:
        launcher.start(timeout=15)
    assert "'counter'" in str(error.value)
    assert "num_wokers" in str(error.value)
    assert launcher.processes == {}


def test_start_serves_every_instance_and_the_resolved_config_and_stop_ends_every_process():
    instances = gym_config.parse(COUNTER)
    launcher = Launcher(instances, gym_config.free_port()).start(timeout=60)
    try:
        pids = [process.pid for process in launcher.processes.values()]
        assert sorted(launcher.processes) == ["counter", "head"]
        with urllib.request.urlopen(f"{instances['counter'].url}/", timeout=10) as reply:
            assert json.load(reply) == {"status": "ok"}
        with urllib.request.urlopen(f"{launcher.head_url}/global_config", timeout=10) as reply:
            resolved = json.load(reply)
        assert resolved["counter"]["resources_servers"]["example_session_state_mgmt"]["port"] == instances["counter"].port
    finally:
        launcher.stop()
    assert all(gone(pid) for pid in pids)
    assert not launcher.run_dir.exists()


def test_table_lists_name_type_address_and_workers_of_every_server_and_the_head():
    instances = gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {"num_workers": 3}}}})
    launcher = Launcher(instances, 11999)
    try:
        header, counter, head = [line.split() for line in launcher.table().splitlines()]
    finally:
        launcher.stop()
    assert header == ["name", "type", "address", "workers"]
    assert counter == ["counter", "resources_servers", instances["counter"].url, "3"]
    assert head == ["head", "-", "http://127.0.0.1:11999", "1"]


def test_the_processes_get_the_launchers_extra_environment(tmp_path):
    marker = tmp_path / "seen"
    launcher = Launcher(gym_config.parse(COUNTER), gym_config.free_port(), {"NEMO_GYM_TEST_MARKER": str(marker)})
    try:
        assert launcher.extra_env == {"NEMO_GYM_TEST_MARKER": str(marker)}
        launcher.start(timeout=60)
        environ = Path(f"/proc/{launcher.processes['counter'].pid}/environ").read_bytes().split(b"\0")
    finally:
        launcher.stop()
    assert f"NEMO_GYM_TEST_MARKER={marker}".encode() in environ
    assert os.environ.get("NEMO_GYM_TEST_MARKER") is None


def test_stop_removes_the_socket_directory_of_a_server_whose_process_was_killed():
    instances = gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {"num_workers": 2}}}})
    launcher = Launcher(instances, gym_config.free_port()).start(timeout=60)
    socket_dir = launcher.socket_dirs["counter"]
    try:
        os.kill(launcher.processes["counter"].pid, signal.SIGKILL)  # its own cleanup never runs
        launcher.processes["counter"].wait(timeout=10)
        assert os.path.isdir(socket_dir)
    finally:
        launcher.stop()
    assert not os.path.exists(socket_dir)


def test_a_multi_worker_server_is_up_only_when_every_worker_serves_its_private_socket():
    data = {"counter": {"resources_servers": {"example_session_state_mgmt": {"num_workers": 4}}}}
    launcher = Launcher(gym_config.parse(data), gym_config.free_port())
    launcher.start(timeout=120)
    try:
        socket_dir = launcher.socket_dirs["counter"]
        assert live_workers(socket_dir) == 4
        for worker in life_sockets(socket_dir):
            with socket.socket(socket.AF_UNIX) as private:
                private.connect(socket_address(socket_dir, worker))  # each worker's private socket accepts at once
    finally:
        launcher.stop()


SLOW_START_APP = '''
"""A server one of whose workers sleeps at import: the first worker process to claim the marker file."""

import os
import signal
import time

from nemo_gym.base_resources_server import SimpleResourcesServer


class SlowStartServer(SimpleResourcesServer):
    pass


if os.environ.get("IS_NEMO_GYM_FASTAPI_WORKER") == "1":
    print("slow_start: importing", flush=True)
    try:
        claimed = os.open(os.environ["SLOW_START_MARKER"], os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        pass
    else:
        os.write(claimed, str(os.getpid()).encode())
        os.close(claimed)
        print("slow_start: this worker sleeps at import", flush=True)
        # uvicorn's handler (installed before the import) would only flag the SIGTERM of the stop that follows
        # the time-out, and the stop would wait out its grace: this sleeper dies of it at once instead.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(600)
'''


def slow_start_instances(tmp_path: Path) -> dict[str, gym_config.Instance]:
    directory = tmp_path / "resources_servers" / "slow_start"
    directory.mkdir(parents=True)
    (directory / "app.py").write_text(SLOW_START_APP)
    instances = gym_config.parse({"slow": {"resources_servers": {"slow_start": {"num_workers": 2}}}})
    discovery.check_settings(instances, search_roots([tmp_path]))
    return instances


def test_a_start_that_times_out_names_the_workers_that_did_not_come_up_with_their_last_log_lines(tmp_path):
    marker = tmp_path / "sleeper"
    launcher = Launcher(slow_start_instances(tmp_path), gym_config.free_port(), {"SLOW_START_MARKER": str(marker)})
    # Long enough for the sleeper to reach its import on a busy machine (whether the other serves by then or not).
    with pytest.raises(LaunchError) as error:
        launcher.start(timeout=15)
    message = str(error.value)
    sleeper = int(marker.read_text())
    assert "within 15 s" in message and "--start-timeout" in message
    header = f"--- slow: worker process {sleeper}, not serving; its last log lines ---\n"
    assert header in message
    assert "slow_start: this worker sleeps at import" in message.split(header, 1)[1].split("\n---", 1)[0]
    assert launcher.processes == {}
    deadline = time.monotonic() + 10
    while not gone(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(sleeper)


def test_the_default_start_timeout_grows_with_the_number_of_workers_started():
    one = Launcher(gym_config.parse(COUNTER), gym_config.free_port())
    eight = Launcher(gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {"num_workers": 8}}}}), gym_config.free_port())
    try:
        assert one.start_timeout == START_TIMEOUT_SECONDS + START_TIMEOUT_PER_WORKER_SECONDS
        assert eight.start_timeout == START_TIMEOUT_SECONDS + 8 * START_TIMEOUT_PER_WORKER_SECONDS
        assert Launcher(gym_config.parse(COUNTER), gym_config.free_port(), start_timeout=7).start_timeout == 7
    finally:
        one.stop()
        eight.stop()


def test_the_config_every_server_reads_carries_the_top_level_settings_the_launcher_was_given():
    instances = gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {"entrypoint": "app.py", "domain": "games"}}}})
    resolved = Launcher(instances, 1, settings={"observability_enabled": True}).resolved_config()
    assert resolved["observability_enabled"] is True
    assert list(resolved["counter"]["resources_servers"]) == ["example_session_state_mgmt"]
    assert "observability_enabled" not in Launcher(instances, 1).resolved_config()


def test_a_launcher_started_then_entered_as_a_context_starts_its_servers_once(monkeypatch):
    spawned = []
    spawn = Launcher._spawn

    def counting_spawn(self, name, *args):
        spawned.append(name)
        return spawn(self, name, *args)

    monkeypatch.setattr(Launcher, "_spawn", counting_spawn)
    launcher = Launcher(gym_config.parse(COUNTER), gym_config.free_port())
    with launcher.start(timeout=60) as entered:
        assert entered is launcher
    assert sorted(spawned) == ["counter", "head"]


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """tempfile's directory for this test alone, so a directory the launcher makes (or leaves) is seen."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(directory))
    return directory


def test_a_launcher_that_is_built_and_never_started_leaves_no_directory(own_tmp):
    launcher = Launcher(gym_config.parse(COUNTER), gym_config.free_port())
    assert launcher.resolved_config() and launcher.start_timeout
    assert list(own_tmp.glob("nemo_gym_run_*")) == []


def test_a_start_refused_before_any_server_leaves_no_directory(own_tmp):
    data = {"counter": {"resources_servers": {"example_session_state_mgmt": {"num_replicas": 3, "num_workers": 2}}}}
    launcher = Launcher(gym_config.parse(data, check_ports=False), gym_config.free_port())
    with pytest.raises(LaunchError, match="ray_head_node_address"):
        launcher.start()
    assert list(own_tmp.glob("nemo_gym_run_*")) == []
