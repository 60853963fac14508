"""The jail, probed as a policy would: each escape fails inside it, and /verify of the session that tried is not fooled.

Every attack that touches grading aims at a reward of 1.0 without a fix (the fix written into the
template, a passing test written over the hidden ones, the fix written into another session's
repository), so a verify that answers 0.0 shows the attack changed nothing that grading sees.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from nemo_gym.sessions.worker import new_worker_id
from nemo_gym.routing.transport.unix import make_socket_dir, remove_socket_dir, socket_address
from nemo_gym.sessions.secret import state_dir
from resources_servers.swe_rebench.app import DEFAULT_TASKS_DIR
from resources_servers.swe_rebench.jail import Interpreter, Jail, JailError, system_view
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
    # The bomb ends by itself once its forks fail (about 1 s); the command's deadline only stops one that does not, and
    # is long enough for a loaded machine to reach the cap first (L23: with 3 s the command was cut short, no fork failed).
    server = make_server(tmp_path / "sandboxes", command_timeout_seconds=15, max_processes=32)
    with TestClient(server.build_app()) as client:
        seeded(client)
        (sandbox,) = server.sandboxes.values()
        bomb = run(client, "bomb() { bomb | bomb & }; bomb; wait")
        assert "Resource temporarily unavailable" in bomb["output"]
        assert not processes_of(sandbox.uid)
        assert run(client, "echo alive")["output"] == "alive\n"
        assert_not_fooled(client)


# Eight processes each take up to 64 MB, 1 MB at a time (each MB written, so it is really held), say how
# much they got, and hold it while the others try.
HOG = (
    "import time\n"
    "held = []\n"
    "try:\n"
    "    while len(held) < 64:\n"
    "        held.append(b'x' * (1 << 20))\n"
    "except MemoryError:\n"
    "    pass\n"
    "print('held', len(held), flush=True)\n"
    "time.sleep(3)\n"
)


def neighbour_keeps_working(app, attack) -> dict:
    """Run ``attack`` (a callable) in a thread while a second session runs commands; the attack's result."""
    neighbour = seeded(TestClient(app), "slug_case")
    outcome = {}
    attacking = threading.Thread(target=lambda: outcome.update(attack()))
    attacking.start()
    answers = []
    while attacking.is_alive() or not answers:
        answers.append(run(neighbour, "echo alive; python3 -c 'print(len(bytearray(32 << 20)))'"))
    attacking.join()
    assert all(answer["exit_code"] == 0 and answer["output"] == f"alive\n{32 << 20}\n" for answer in answers), answers
    assert all(answer["over_limit"] is None for answer in answers)
    return outcome


def test_a_sandboxs_processes_together_cannot_hold_more_than_its_memory_cap(tmp_path):
    server = make_server(tmp_path / "sandboxes", max_memory_mb=64, command_timeout_seconds=20)
    with TestClient(server.build_app()) as client:
        seeded(client)
        (sandbox,) = server.sandboxes.values()
        command = f"for i in 1 2 3 4 5 6 7 8; do python3 -c \"{HOG}\" & done; wait"
        attempt = neighbour_keeps_working(client.app, lambda: run(client, command))
        held = sum(int(count) for count in re.findall(r"^held (\d+)$", attempt["output"], re.MULTILINE))
        assert held <= 64, attempt
        assert sandbox.cgroup.peak_memory_bytes() <= 64 << 20
        assert attempt["over_limit"].startswith("memory: the sandbox's processes together reached max_memory_mb (64 MB)")
        assert run(client, "echo alive")["output"] == "alive\n"
        assert_not_fooled(client)


FORK_LOOP = (
    "import os, time\n"
    "forked = 0\n"
    "try:\n"
    "    while forked < 500:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(30)\n"
    "            os._exit(0)\n"
    "        forked += 1\n"
    "except OSError as refused:\n"
    "    print('refused:', refused)\n"
    "print('forked', forked)\n"
)


def test_a_fork_loop_stops_at_max_processes_and_the_neighbours_work(tmp_path):
    server = make_server(tmp_path / "sandboxes", max_processes=40, command_timeout_seconds=20)
    with TestClient(server.build_app()) as client:
        seeded(client)
        attempt = neighbour_keeps_working(client.app, lambda: run(client, f"python3 -c \"{FORK_LOOP}\""))
        assert "refused: [Errno 11] Resource temporarily unavailable" in attempt["output"], attempt
        forked = int(attempt["output"].split("forked")[1])
        assert 0 < forked < 40
        assert attempt["over_limit"].startswith("processes: the sandbox reached max_processes (40 at once)")
        assert run(client, "echo alive")["output"] == "alive\n"
        assert_not_fooled(client)


@pytest.mark.parametrize("command", ["unshare -U true", "unshare -Urm sh -c 'id; mount -t tmpfs x /mnt'"])
def test_user_namespaces_are_refused_in_the_jail(client, command):
    attempt = run(client, command)
    assert attempt["exit_code"] != 0 and "unshare failed: Operation not permitted" in attempt["output"], attempt
    assert_not_fooled(client)


def test_no_process_in_the_jail_shows_a_host_path(server, client):
    (sandbox,) = server.sandboxes.values()
    listing = run(client, "sleep 5 & for p in /proc/[0-9]*; do echo \"$p: $(tr '\\0' ' ' < $p/cmdline)\"; cat $p/environ; done 2>/dev/null; echo")
    assert "/proc/1: /usr/bin/bwrap --args" in listing["output"], listing
    for host_path in [sandbox.root, server.root.path, DEFAULT_TASKS_DIR, sys.prefix, sys.base_prefix, state_dir()]:
        assert str(host_path) not in listing["output"], (host_path, listing)
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


def test_a_machine_without_a_known_seccomp_filter_refuses_to_start_naming_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(("Linux", "host", "6", "#1", "riscv64")))
    with pytest.raises(JailError, match="refuses user namespaces with a seccomp filter: no seccomp filter .* 'riscv64'.*unsafe_no_jail"):
        make_server(tmp_path / "sandboxes")


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


@pytest.fixture(scope="module")
def venv_under_tmp():
    """A virtualenv under /tmp, as a fresh clone there makes (issue 25): the jail must not show where it is."""
    place = Path(tempfile.mkdtemp(prefix="clone-", dir="/tmp"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(place / "venv")], check=True, timeout=120)
    # The packages this process sees, wherever they are installed: a venv made from inside a user's venv is based
    # on the base interpreter, so --system-site-packages would show that one's packages, not the project's.
    python = place / "venv" / "bin" / "python"
    venv_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    sites = [path for path in sys.path if path.endswith(("site-packages", "dist-packages")) and Path(path).is_dir()]
    Path(venv_site, "this_process_packages.pth").write_text("".join(f"import site; site.addsitedir({path!r})\n" for path in sites))
    yield python
    shutil.rmtree(place)


def test_a_venv_under_tmp_leaves_the_jails_tmp_empty_and_runs_as_opt_python(server, client, venv_under_tmp):
    """The installation the server finds for itself (``Interpreter.of_this_process``) when it runs from that virtualenv."""
    finds = "import sys; from resources_servers.swe_rebench.jail import Interpreter; i = Interpreter.of_this_process(); print(sys.prefix, i.prefix, i.executable)"
    checkout = Path(__file__).resolve().parents[3]
    facts = subprocess.run(
        [str(venv_under_tmp), "-c", finds],
        capture_output=True, text=True, check=True, timeout=60, cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
    ).stdout.split()
    assert facts[0].startswith("/tmp/clone-")
    interpreter = Interpreter(Path(facts[1]), Path(facts[2]))
    server.jail = Jail(server.config.bwrap, server.jail.limits, [DEFAULT_TASKS_DIR], interpreter)
    inside = run(client, "ls -A /tmp; python3 -c 'import sys; print(sys.prefix)'; cat /proc/1/cmdline /proc/self/mountinfo")
    assert inside["output"].startswith(f"{interpreter.in_jail()}\n"), inside
    assert "/tmp/clone-" not in inside["output"]
    verified = verify(client)
    assert verified["reward"] == 0.0 and "FAIL_TO_PASS" in verified["reason"]


def test_an_installation_under_tmp_is_shown_at_opt_python_only():
    interpreter = Interpreter(Path("/tmp/clone-x/python"), Path("bin/python3.11"))
    view = system_view([], 1 << 20, interpreter)
    assert interpreter.in_jail() == Path("/opt/python")
    places = [arg for arg in view if arg.startswith("/tmp/")]
    assert places == ["/tmp/clone-x/python"]
    assert view[view.index("/tmp/clone-x/python") + 1] == "/opt/python"
