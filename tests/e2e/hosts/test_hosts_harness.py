"""The network-namespace hosts themselves (tests/hosts.py): separate /tmp and sockets, reachable by address,
HAProxy round robin over them, and a whole-host kill that leaves no process of the host.

A tiny HTTP server on each of h1, h2, h3 answers every GET with the address the connection reached
(and a POST with 501). The last two tests take h2 off the network and h3 down.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests import hosts
from tests.e2e.hosts.conftest import REPLICA_HOSTS
from tests.hosts import is_running, run_client, run_json, start_balancer

PORT = 8000
REQUESTS = 30
WHOAMI = """import http.server, sys
class Whoami(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.connection.getsockname()[0].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Whoami).serve_forever()
"""
# Binds a Unix socket file in /tmp and an abstract one, says so, and keeps them.
BIND = """import socket, time
sockets = []
for address in ("/tmp/probe.sock", "\\0nemo_gym_probe"):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(address)
    sock.listen()
    sockets.append(sock)
print("bound", flush=True)
time.sleep(3600)
"""
# Whether /tmp/probe.sock exists here, and which of the two sockets this host can connect to.
PROBE = """import json, os, socket
reached = {}
for address in ("/tmp/probe.sock", "\\0nemo_gym_probe"):
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(address)
        reached[repr(address)] = True
    except OSError:
        reached[repr(address)] = False
print(json.dumps({"file": os.path.exists("/tmp/probe.sock"), "reached": reached}))
"""


@pytest.fixture(scope="module")
def whoami(lan):
    for name in REPLICA_HOSTS:
        lan[name].python("-c", WHOAMI, lan[name].address, str(PORT))
    for name in REPLICA_HOSTS:
        wait_listening(lan[name], (lan[name].address, PORT))
    start_balancer(lan["balancer"], PORT, [(lan[name].address, PORT) for name in REPLICA_HOSTS])
    return lan


def wait_listening(host, address, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while address not in host.listening():
        assert time.monotonic() < deadline, f"nothing listens on {address} in host {host.name}"
        time.sleep(0.05)


def test_a_unix_socket_made_in_one_hosts_tmp_is_not_visible_from_another(lan):
    binder = lan["h1"].python("-c", BIND, stdout=subprocess.PIPE, text=True)
    assert binder.stdout.readline() == "bound\n"
    same_host = run_json(lan["h1"], ["-c", PROBE], timeout=30)
    other_host = run_json(lan["h2"], ["-c", PROBE], timeout=30)
    binder.kill()
    binder.wait()
    assert same_host == {"file": True, "reached": {"'/tmp/probe.sock'": True, "'\\x00nemo_gym_probe'": True}}
    assert other_host == {"file": False, "reached": {"'/tmp/probe.sock'": False, "'\\x00nemo_gym_probe'": False}}


def get(host, urls: list[str], requests: int = 1) -> list[list[str]]:
    """The bodies of ``requests`` GETs to each URL, sent from ``host``."""
    return run_client(host, "get", {"urls": urls, "requests": requests}, 60)


def test_hosts_reach_each_other_by_address_and_by_name(whoami):
    addresses = [whoami[name].address for name in REPLICA_HOSTS]
    by_address = get(whoami["client"], [f"http://{address}:{PORT}/" for address in addresses])
    by_name = get(whoami["h1"], [f"http://{name}:{PORT}/" for name in REPLICA_HOSTS])
    assert by_address == by_name == [[address] for address in addresses]


def test_haproxy_spreads_new_connections_round_robin_over_the_three_hosts(whoami):
    url = f"http://balancer:{PORT}/"
    [bodies] = get(whoami["client"], [url], REQUESTS)
    addresses = {whoami[name].address for name in REPLICA_HOSTS}
    assert Counter(bodies) == {address: REQUESTS // 3 for address in addresses}
    assert all(bodies[number] == bodies[number % 3] for number in range(REQUESTS)), bodies


def test_an_unplugged_host_answers_no_one_not_even_with_a_refusal(whoami):
    """Takes h2 off the network."""
    whoami["h2"].unplug()
    urls = [f"http://{name}:{PORT}" for name in ("h1", "h2")]
    outcomes = run_client(whoami["client"], "refused", {"urls": urls, "timeout": 2}, 60)
    assert outcomes[urls[0]] == 501 and "TimeoutError" in outcomes[urls[1]], outcomes


def test_a_whole_host_kill_leaves_no_process_of_that_host(whoami):
    host = whoami["h3"]
    # A tree of processes, and one that left it (a daemon: its parent gone, in a session of its own).
    tree = host.run(["sh", "-c", "setsid sleep 3600 & sleep 3600 & python3 -c 'import os, time; os.fork(); time.sleep(3600)'"])
    # The whoami server, sh, two sleeps, python and its fork.
    deadline = time.monotonic() + 10
    while len(before := host.processes()) < 6:
        assert time.monotonic() < deadline, before
        time.sleep(0.05)
    host.kill()
    assert host.processes() == set()
    assert not any(Path(f"/proc/{pid}").exists() and is_running(pid) for pid in before)
    assert tree.poll() is not None
    assert get(whoami["client"], [f"http://h1:{PORT}/"]) == [[whoami["h1"].address]]


def test_a_whole_host_kill_returns_once_nothing_listens_on_that_host_even_a_socket_kept_by_a_process_outside_it(whoami):
    """A socket of the host's namespace outlives its processes: kept by a process that moved to a network namespace
    of its own and left the tree (its parent gone), and, for a moment, by every killed process (the kernel lets go
    of a dying process's files after its namespaces). A connection it accepts meanwhile is cut, not refused: a
    balancer answers 502 for it instead of trying another server."""
    host = whoami["h3"]
    listen = "import socket, subprocess; s = socket.create_server(('0.0.0.0', 9123)); s.set_inheritable(True); "
    listen += "subprocess.Popen(['unshare', '--net', 'sleep', '3600'], pass_fds=[s.fileno()], start_new_session=True)"
    host.run(["python3", "-c", listen]).wait(timeout=10)
    deadline = time.monotonic() + 10
    while ("0.0.0.0", 9123) not in host.listening():
        assert time.monotonic() < deadline, host.listening()
        time.sleep(0.05)
    host.kill()
    assert host.listening() == set()
    assert host.processes() == set()


def test_a_checkout_and_virtualenv_under_the_machines_tmp_are_what_the_hosts_keep_of_it(monkeypatch, tmp_path):
    """A clone under /tmp with its virtualenv inside (issue 25's new user) runs on the hosts: the outermost
    directory of what they run from is bound into each host's own /tmp; a checkout elsewhere needs nothing."""
    if not tmp_path.resolve().is_relative_to("/tmp"):
        pytest.skip(f"pytest's temporary directory {tmp_path} is not under /tmp")
    checkout = tmp_path / "clone"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    monkeypatch.setattr(hosts, "REPO_ROOT", checkout)
    monkeypatch.setattr(sys, "prefix", str(checkout / ".venv"))
    monkeypatch.setattr(sys, "executable", str(checkout / ".venv" / "bin" / "python"))
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(checkout / ".venv" / "lib" / "python3" / "site-packages")])
    assert hosts.run_from_tmp() == [str(checkout.resolve())]
    monkeypatch.setattr(hosts, "REPO_ROOT", Path("/work/elsewhere"))
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    monkeypatch.setattr(sys, "executable", os.path.join(sys.base_prefix, "bin", "python3"))
    assert str(checkout.resolve()) not in hosts.run_from_tmp()


def test_the_logs_a_host_kept_in_its_own_tmp_are_copied_out_leaving_out_what_was_bound_into_it(lan, monkeypatch, tmp_path):
    """What a failed test's hosts leave to read (tests/failed_runs.py): logs, configs and records below the size
    limit, wherever in the host's /tmp; not other files, not big ones, not the checkout or virtualenv bound in."""
    monkeypatch.setattr(hosts, "KEPT_FILE_BYTES", 1000)
    bound = hosts.run_from_tmp()  # a checkout or virtualenv of this run's under /tmp, bound into the hosts too
    monkeypatch.setattr(hosts, "run_from_tmp", lambda: [*bound, "/tmp/bound_checkout"])
    written = {"gym.log": b"up", "nemo_gym_run_x/counter_worker_1.log": b"served", "ray/session/logs/raylet.out": b"raylet", "gym.yaml": b"a: 1",
               "big.log": b"x" * 2000, "notes.txt": b"not a log", "bound_checkout/pip.log": b"installed"}
    for name, content in written.items():
        path = lan["h1"].path(f"/tmp/{name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    lan.keep_logs(tmp_path / "kept")
    kept = {str(path.relative_to(tmp_path / "kept" / "h1")): path.read_bytes() for path in (tmp_path / "kept" / "h1").rglob("*") if path.is_file()}
    assert kept == {name: written[name] for name in ["gym.log", "nemo_gym_run_x/counter_worker_1.log", "ray/session/logs/raylet.out", "gym.yaml"]}
