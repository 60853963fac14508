"""The jail, probed as a policy would: each escape fails inside it, and /verify of the session that tried is not fooled.

Every attack that touches grading aims at a reward of 1.0 without a fix (the fix written into the
template, a passing test written over the hidden ones, the fix written into another session's
repository), so a verify that answers 0.0 shows the attack changed nothing that grading sees.
"""

import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from nemo_gym.routing.worker import make_socket_dir, new_worker_id, remove_socket_dir, socket_address
from nemo_gym.signing_secret import state_dir
from resources_servers.swe_rebench.app import DEFAULT_TASKS_DIR
from resources_servers.swe_rebench.jail import JailError
from resources_servers.swe_rebench.tests.test_app import make_server, seeded, verify
from responses_api_models.scripted_backend.app import SWE_REBENCH_FIXES

FIX = SWE_REBENCH_FIXES["bounds.py"]
PASSING_TEST = "import unittest\n\nclass Passes(unittest.TestCase):\n    def test_passes(self):\n        pass\n"
TEMPLATE = DEFAULT_TASKS_DIR / "clamp_upper" / "repo" / "bounds.py"
HIDDEN_TEST = DEFAULT_TASKS_DIR / "clamp_upper" / "hidden" / "test_hidden_bounds.py"


@pytest.fixture
def server(tmp_path):
    return make_server(tmp_path / "sandboxes", max_disk_mb=64, command_timeout_seconds=15)


@pytest.fixture
def client(server):
    with TestClient(server.build_app()) as client:
        yield seeded(client)


def run(client, command: str) -> dict:
    reply = client.post("/run_command", json={"command": command})
    assert reply.status_code == 200, reply.text
    return reply.json()


def assert_not_fooled(client) -> None:
    result = verify(client)
    assert result["reward"] == 0.0 and result["tests_passed"] is False, result


def test_another_sessions_repository_is_out_of_reach(server, client):
    (victim,) = server.sandboxes.values()
    other = seeded(TestClient(client.app))  # a second session: a client without the first one's cookie
    attempt = run(other, f"cat {victim.repo}/bounds.py; printf '%s' '{FIX}' > {victim.repo}/bounds.py")
    assert attempt["exit_code"] != 0 and "No such file or directory" in attempt["output"]
    assert "return low" in (victim.repo / "bounds.py").read_text()
    assert_not_fooled(client)


def test_the_task_templates_are_out_of_reach(client):
    original = TEMPLATE.read_text()
    try:
        attempt = run(client, f"ls {DEFAULT_TASKS_DIR}; printf '%s' '{FIX}' > {TEMPLATE}")
        assert attempt["exit_code"] != 0 and "No such file or directory" in attempt["output"]
        assert TEMPLATE.read_text() == original
        assert_not_fooled(client)
    finally:
        TEMPLATE.write_text(original)


def test_the_hidden_tests_are_out_of_reach(client):
    original = HIDDEN_TEST.read_text()
    try:
        attempt = run(client, f"cat {HIDDEN_TEST}; printf '%s' '{PASSING_TEST}' > {HIDDEN_TEST}")
        assert attempt["exit_code"] != 0 and "No such file or directory" in attempt["output"]
        assert HIDDEN_TEST.read_text() == original
        assert_not_fooled(client)
    finally:
        HIDDEN_TEST.write_text(original)


def test_the_secrets_directory_is_out_of_reach(client):
    secrets = state_dir() / "secrets"
    assert (secrets / "swe_rebench").is_file()
    attempt = run(client, f"ls {secrets} || ls ~/.local/state/nemo_gym; cat {secrets}/swe_rebench")
    assert attempt["exit_code"] != 0 and "No such file or directory" in attempt["output"]
    assert_not_fooled(client)


def test_a_socket_directory_is_out_of_reach(client):
    socket_dir = make_socket_dir()
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(f"{socket_dir}/worker.sock")
        listener.listen()
        code = f"import socket; socket.socket(socket.AF_UNIX).connect('{socket_dir}/worker.sock')"
        assert run(client, "ls -A /tmp")["output"] == ""
        attempt = run(client, f"ls {socket_dir}; python3 -c \"{code}\"")
        assert attempt["exit_code"] != 0 and "FileNotFoundError" in attempt["output"]
        assert_not_fooled(client)
    finally:
        listener.close()
        remove_socket_dir(socket_dir)


def test_a_workers_private_socket_is_out_of_reach(client):
    """A worker's private socket is an abstract name: the jail's network namespace has none of them."""
    socket_dir = make_socket_dir()
    listener = socket.socket(socket.AF_UNIX)
    try:
        address = socket_address(socket_dir, new_worker_id())
        listener.bind(address)
        listener.listen()
        code = f"import socket; socket.socket(socket.AF_UNIX).connect({address!r})"
        attempt = run(client, f'python3 -c "{code}"')
        assert attempt["exit_code"] != 0 and "ConnectionRefusedError" in attempt["output"]
        assert_not_fooled(client)
    finally:
        listener.close()
        remove_socket_dir(socket_dir)


def test_the_network_is_out_of_reach(client):
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        port = listener.getsockname()[1]
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)"
        attempt = run(client, f'python3 -c "{code}"; python3 -c "import socket; socket.create_connection((\'1.1.1.1\', 80), timeout=5)"')
        assert attempt["exit_code"] != 0 and "ConnectionRefusedError" in attempt["output"]
        assert "Network is unreachable" in attempt["output"]
        assert_not_fooled(client)
    finally:
        listener.close()


def test_a_setsid_process_dies_when_its_command_ends(client):
    marker = f"777.{uuid.uuid4().int % 10**6}"
    attempt = run(client, f"setsid sleep {marker} > /dev/null 2>&1 & echo started")
    assert attempt["exit_code"] == 0 and attempt["output"] == "started\n"
    assert not processes_running(marker)
    assert_not_fooled(client)


def test_a_setsid_process_dies_when_its_command_times_out(tmp_path):
    with TestClient(make_server(tmp_path / "sandboxes", command_timeout_seconds=1).build_app()) as client:
        seeded(client)
        marker = f"778.{uuid.uuid4().int % 10**6}"
        attempt = run(client, f"setsid sleep {marker} > /dev/null 2>&1 & sleep 60")
        assert attempt["timed_out"] is True
        assert not processes_running(marker)
        assert_not_fooled(client)


def test_a_1gb_write_fails(client):
    attempt = run(client, "dd if=/dev/zero of=big bs=1M count=1024 status=none; echo repo=$?; rm -f big;"
                          " dd if=/dev/zero of=/tmp/big bs=1M count=1024 status=none; echo tmp=$?")
    assert "No space left on device" in attempt["output"]
    assert "repo=1" in attempt["output"] and "tmp=1" in attempt["output"]
    assert_not_fooled(client)


def test_a_fork_bomb_fails_and_the_server_lives(tmp_path):
    server = make_server(tmp_path / "sandboxes", command_timeout_seconds=3, max_processes=32)
    with TestClient(server.build_app()) as client:
        seeded(client)
        (sandbox,) = server.sandboxes.values()
        bomb = run(client, "bomb() { bomb | bomb & }; bomb; wait")
        assert "Resource temporarily unavailable" in bomb["output"]
        assert not processes_of(sandbox.uid)
        assert run(client, "echo alive")["output"] == "alive\n"
        assert_not_fooled(client)


def test_a_process_cannot_take_more_memory_than_its_cap(tmp_path):
    with TestClient(make_server(tmp_path / "sandboxes", max_memory_mb=256).build_app()) as client:
        seeded(client)
        attempt = run(client, "python3 -c 'bytearray(512 << 20)'")
        assert attempt["exit_code"] != 0 and "MemoryError" in attempt["output"]
        assert_not_fooled(client)


@pytest.fixture
def outside_dir():
    """A host directory outside /tmp (the jail's /tmp is its own)."""
    path = Path(tempfile.mkdtemp(dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


def test_write_file_never_writes_outside_while_a_loop_swaps_a_symlink_in(server, client, outside_dir):
    (victim,) = server.sandboxes.values()
    attacker = seeded(TestClient(client.app))
    outside = outside_dir / "outside.txt"
    targets = [outside, victim.repo / "bounds.py"]
    victim_before = targets[1].read_text()
    swap_loop = "end=$((SECONDS + 10)); while [ $SECONDS -lt $end ]; do " + "".join(
        f"ln -sfn {target} swap; rm -f swap; echo x > swap; rm -f swap; " for target in targets
    ) + "done"
    looping = threading.Thread(target=run, args=(attacker, swap_loop))
    looping.start()
    writes = 0
    while looping.is_alive():
        reply = attacker.post("/write_file", json={"path": "swap", "content": "pwned\n"})
        assert reply.status_code in (200, 400), reply.text
        writes += 1
    looping.join()
    assert writes > 10
    assert not outside.exists()
    assert targets[1].read_text() == victim_before
    assert_not_fooled(client)


def test_a_missing_bwrap_stops_the_start_with_how_to_install_it(tmp_path):
    with pytest.raises(JailError, match="cannot find '/nonexistent/bwrap'.*apt-get install bubblewrap.*unsafe_no_jail"):
        make_server(tmp_path / "sandboxes", bwrap="/nonexistent/bwrap")


def test_unsafe_no_jail_starts_without_bwrap_and_says_so_loudly(tmp_path, caplog):
    server = make_server(tmp_path / "sandboxes", bwrap="/nonexistent/bwrap", unsafe_no_jail=True)
    with TestClient(server.build_app()) as client:
        assert "runs with unsafe_no_jail: true" in caplog.text
        seeded(client)
        client.post("/write_file", json={"path": "bounds.py", "content": FIX})
        assert verify(client)["reward"] == 1.0
    assert not (tmp_path / "sandboxes").exists()


def processes_running(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (waiting a moment for a killed one to be reaped)."""
    deadline = time.monotonic() + 5
    while True:
        found = [pid for pid, cmdline in all_processes() if marker.encode() in cmdline]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def processes_of(uid: int) -> list[int]:
    deadline = time.monotonic() + 5
    while True:
        found = []
        for pid, _ in all_processes():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            if f"\nUid:\t{uid}\t" in status:
                found.append(pid)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def all_processes() -> list[tuple[int, bytes]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), (entry / "cmdline").read_bytes()))
            except OSError:
                pass
    return found
