"""Hosts for tests, on one machine: network namespaces joined by a bridge, each with its own private /tmp.

``Hosts(["h1", "h2", ...])`` makes one network namespace per name, each with its loopback up and an
address on a private /24 (10.231.K.0/24, a K no interface of this machine uses), joined by a bridge
that lives in a namespace of its own, so no traffic touches the machine's own namespace. Every host
gets a fresh tmpfs on /tmp in a mount namespace of its own, so no Unix socket file crosses hosts (and
the network namespace keeps abstract socket names apart), and an /etc/hosts naming every host, so a
client can reach one by name (aiohttp's cookie jar keeps no cookie from an IP address). What the hosts
run from is bound into that /tmp where it lives under the machine's /tmp (a checkout, or a virtualenv,
cloned there): nothing else of the machine's /tmp is seen.

A host's mount namespace is held by a holder process (``sleep infinity``) that stands for the
machine itself: ``Host.run`` starts a command inside the host's network and mount namespaces, and a
whole-host ``kill`` or ``freeze`` signals every process of the host except its holder, found from
/proc (those in the host's network namespace, and the descendants of what ``run`` started), never by
name; ``unplug`` cuts the host off the bridge. ``close`` kills every process by PID, then removes the namespaces and with them the links; a
new ``Hosts`` first removes those of an earlier run whose test process is gone.

``start_gym`` runs ``gym env start`` inside a host; ``start_balancer`` runs HAProxy round robin,
with a new connection to a server for every request (``start_haproxy`` HAProxy with any config);
``run_client`` runs the test client (tests/hosts_client.py) inside a host, ``Remote`` its ``post`` mode (a
request per call). The benchmark's section of
replicas on several hosts (scripts/bench/hosts.py) makes its hosts with these too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import select
import shutil
import signal
import site
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nemo_gym.config import REPO_ROOT
from nemo_gym.env import STATE_DIR_ENV
from nemo_gym.process.launcher import children
from tests.programs import lacking

SUBNETS = ipaddress.ip_network("10.231.0.0/16")
# The bridge's namespace, and the bridge in it.
SWITCH = "switch"
BRIDGE = "br0"
HOST_INTERFACE = "eth0"
COMMAND_TIMEOUT_SECONDS = 10
HOLDER_READY_SECONDS = 10
KILL_SECONDS = 10
# A holder mounts the host's /tmp and /etc/hosts (its first argument), binds the paths its other arguments
# name back into that /tmp from the machine's (through a bind of the machine's /tmp made first, then
# dropped), says it is ready, and then only holds them.
HOLDER_SCRIPT = """hosts="$1" && shift && stage=$(mktemp -d /run/nemo-gym-host-tmp.XXXXXX) && mount --bind /tmp "$stage" \
&& mount -t tmpfs -o mode=1777 tmpfs /tmp && for kept in "$@"; do mkdir -p "$kept" && mount --bind "$stage${kept#/tmp}" "$kept" || exit 1; done \
&& umount -l "$stage" && rmdir "$stage" && printf '%s' "$hosts" > /tmp/hosts && mount --bind /tmp/hosts /etc/hosts \
&& rm /tmp/hosts && echo ready && exec sleep infinity"""
TCP_LISTEN = "0A"
GYM_READY = "All servers are up."
CLIENT_MODULE = "tests.hosts_client"
GYM_LOG_TAIL_LINES = 40
# What Hosts.keep_logs copies of a host's /tmp after a failed test: servers', workers', balancers' and Ray's
# logs, and the configs they ran with.
KEPT_SUFFIXES = {".log", ".out", ".err", ".yaml", ".json", ".cfg"}
KEPT_FILE_BYTES = 20 * 2**20
BALANCER_CONFIG = """global
    maxconn 4000
    # A line per request in the balancer's log (``balancer_cut``).
    log stdout format raw local0
defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    # A bound, not an expectation: longer than the tests' 10-20 s freezes, and than a whole swe_rebench episode (one
    # relay /run) on a loaded 2-core machine, which ran over 30 s; a request no server answers in time gets 504.
    timeout client 120s
    timeout server 120s
    # A new connection to a server for every request: no connection of one request serves another.
    http-reuse never
    option http-server-close
    retries 3
    option redispatch 1
frontend public
    bind {address}:{port}
    default_backend replicas
backend replicas
    balance roundrobin
{servers}
"""


class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, or no ``ip netns``), or a program the hosts run is missing."""


def ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def netns_inode(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def is_running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (a zombie is over; only its exit status is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def holders(sockets: set[int]) -> set[int]:
    """The processes (of any namespace) with one of these socket inodes open."""
    names = {f"socket:[{inode}]" for inode in sockets}
    return {int(pid) for pid in filter(str.isdigit, os.listdir("/proc") if names else []) if open_files(pid) & names}


def open_files(pid: str) -> set[str]:
    """What each open file descriptor of the process links to (those closed meanwhile left out)."""
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return found


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        new = children(todo.pop()) - found
        found |= new
        todo.extend(new)
    return found


def run_from_tmp() -> list[str]:
    """What processes on a host run from (the checkout, the interpreter and its packages) that lives under
    the machine's /tmp, which a host's own /tmp would hide: the outermost such directories."""
    tmp = Path("/tmp")
    used = [REPO_ROOT, Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent, *map(Path, site.getsitepackages())]
    under = sorted({path.resolve() for path in used if path.resolve().is_relative_to(tmp) and path.resolve() != tmp})
    return [str(path) for path in under if not any(path != other and path.is_relative_to(other) for other in under)]


def sweep_stale() -> None:
    """Remove the hosts of an earlier run whose test process is gone (killed before it could clean up)."""
    for netns in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        match = re.fullmatch(r"ngt(\d+)-(.+)", netns)
        if match and not Path(f"/proc/{match[1]}").exists():
            inode = os.stat(f"/run/netns/{netns}").st_ino
            for pid in os.listdir("/proc"):
                if pid.isdigit() and netns_inode(pid) == inode:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", netns)


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.231.0.0/16 that no address of this machine's namespace falls in."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS).stdout
    addresses = [ipaddress.ip_interface(word).network for line in used.splitlines() for word in line.split()[3:4]]
    for subnet in SUBNETS.subnets(new_prefix=24):
        if not any(subnet.overlaps(address) for address in addresses):
            return subnet
    raise HostsUnavailable(f"no free /24 in {SUBNETS}")


@dataclass
class Host:
    """One host: its name (also its name in every host's /etc/hosts), network namespace and address."""

    name: str
    netns: str
    address: str
    # The bridge's namespace, and this host's port on the bridge.
    switch: str
    switch_port: str
    holder: subprocess.Popen | None = None
    started: list[subprocess.Popen] = field(default_factory=list)

    def run(self, argv: list[str], env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
        """Start ``argv`` inside this host's network and mount namespaces, from the repository root, with the
        repository on PYTHONPATH and the state directory in the host's own /tmp."""
        own_env = {**os.environ, STATE_DIR_ENV: "/tmp/nemo_gym_state", **(env or {})}
        own_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        command = ["nsenter", f"--target={self.holder.pid}", "--net", "--mount", f"--wd={REPO_ROOT}", "--", *argv]
        process = subprocess.Popen(command, env=own_env, **popen)
        self.started.append(process)
        return process

    def python(self, *args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
        return self.run([sys.executable, *args], env=env, **popen)

    def path(self, path: str) -> Path:
        """A file of this host's filesystem (its own /tmp), as this process reaches it."""
        return Path(f"/proc/{self.holder.pid}/root") / path.lstrip("/")

    def processes(self) -> set[int]:
        """Every running process of this host but its holder: those in its network namespace, every process that
        holds one of its sockets (from anywhere), and every descendant of a process ``run`` started that has not
        ended (an ended one's PID may be another's now)."""
        inode = os.stat(f"/run/netns/{self.netns}").st_ino
        found = {int(pid) for pid in os.listdir("/proc") if pid.isdigit() and netns_inode(pid) == inode}
        found |= holders(self.sockets())
        for process in self.started:
            if process.poll() is None:
                found |= {process.pid} | descendants(process.pid)
        found.discard(self.holder.pid)
        return {pid for pid in found if is_running(pid)}

    def sockets(self) -> set[int]:
        """The inodes of the TCP sockets (IPv4 and IPv6) open in this host's network namespace."""
        found = {int(line.split()[9]) for table in ("tcp", "tcp6") for line in self.tcp_table(table)}
        found.discard(0)  # a connection in TIME-WAIT, which no process holds
        return found

    def tcp_table(self, table: str) -> list[str]:
        return Path(f"/proc/{self.holder.pid}/net/{table}").read_text().splitlines()[1:]

    def signal_all(self, signum: int) -> None:
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def kill(self) -> None:
        """SIGKILL every process of the host, again until none is left (a process may fork meanwhile) and nothing
        listens on the host: a dying process's sockets close after it has left the namespace (the kernel lets go of
        its files last), and a connection accepted meanwhile would be cut, where a dead host's is refused."""
        deadline = time.monotonic() + KILL_SECONDS
        while self.processes() or self.listening():
            if time.monotonic() > deadline:
                raise RuntimeError(f"host {self.name}: processes {sorted(self.processes())} or sockets {self.listening()} outlived SIGKILL")
            self.signal_all(signal.SIGKILL)
            for process in self.started:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=0.1)
            time.sleep(0.01)

    def unplug(self) -> None:
        """Take the host's port on the bridge down: no packet reaches it or leaves it, nothing answers for it
        (not even a refusal), as for a host that lost power or its network."""
        ip("-n", self.switch, "link", "set", self.switch_port, "down")

    def freeze(self) -> None:
        self.signal_all(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal_all(signal.SIGCONT)

    def listening(self) -> set[tuple[str, int]]:
        """The TCP addresses (IPv4 and IPv6) something listens on in this host's network namespace."""
        found = set()
        for table in ("tcp", "tcp6"):
            for line in self.tcp_table(table):
                local, _, state = line.split()[1:4]
                if state == TCP_LISTEN:
                    address, port = local.split(":")
                    packed = bytes.fromhex(address)
                    # /proc writes each 32-bit word of the address in the machine's byte order.
                    words = b"".join(packed[i : i + 4][::-1] for i in range(0, len(packed), 4)) if sys.byteorder == "little" else packed
                    found.add((str(ipaddress.ip_address(words)), int(port, 16)))
        return found

    def _stop(self) -> None:
        self.kill()
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait(timeout=KILL_SECONDS)
        for process in self.started:
            process.wait(timeout=KILL_SECONDS)


class Hosts:
    """Network-namespace hosts, made on entering, all removed (processes, namespaces, links) on leaving."""

    def __init__(self, names: list[str]) -> None:
        self.prefix = f"ngt{os.getpid()}-"
        self.names = names
        self.hosts: dict[str, Host] = {}
        self.made: list[str] = []

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> "Hosts":
        if reason := lacking("ip", "nsenter", "unshare"):
            raise HostsUnavailable(reason)
        if os.geteuid() != 0:
            raise HostsUnavailable("network namespaces need root")
        try:
            sweep_stale()
            self._add_netns(SWITCH)
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            raise HostsUnavailable(f"cannot make a network namespace: {error}") from None
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _add_netns(self, name: str) -> str:
        netns = self.prefix + name
        ip("netns", "add", netns)
        self.made.append(netns)
        ip("-n", netns, "link", "set", "lo", "up")
        return netns

    def _build(self) -> None:
        switch = self.prefix + SWITCH
        ip("-n", switch, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", switch, "link", "set", BRIDGE, "up")
        subnet = free_subnet()
        for number, (name, address) in enumerate(zip(self.names, subnet.hosts()), 1):
            netns = self._add_netns(name)
            port = f"v{number}"
            ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", HOST_INTERFACE, "netns", netns)
            ip("-n", switch, "link", "set", port, "master", BRIDGE)
            ip("-n", switch, "link", "set", port, "up")
            ip("-n", netns, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", HOST_INTERFACE)
            ip("-n", netns, "link", "set", HOST_INTERFACE, "up")
            self.hosts[name] = Host(name, netns, str(address), switch, port)
        etc_hosts = "127.0.0.1 localhost\n" + "".join(f"{host.address} {host.name}\n" for host in self.hosts.values())
        for host in self.hosts.values():
            host.holder = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{host.netns}", "--", "unshare", "--mount", "--propagation", "private", "sh", "-c", HOLDER_SCRIPT, "sh", etc_hosts, *run_from_tmp()],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
        for host in self.hosts.values():
            ready, _, _ = select.select([host.holder.stdout], [], [], HOLDER_READY_SECONDS)
            if not ready or host.holder.stdout.readline() != b"ready\n":
                host.holder.kill()
                raise RuntimeError(f"host {host.name}: its /tmp and /etc/hosts were not mounted: {host.holder.stderr.read1().decode()}")

    def keep_logs(self, into: Path) -> None:
        """Copy what every host's /tmp holds of logs, configs and records (a file below ``KEPT_FILE_BYTES``
        ending in one of ``KEPT_SUFFIXES``) under ``into/HOST/``, before its /tmp goes with it; the checkout and
        virtualenv bound into it are left out."""
        for host in self.hosts.values():
            if host.holder is None or host.holder.poll() is not None:
                continue
            top = host.path("/tmp")
            bound = {top / Path(path).relative_to("/tmp") for path in run_from_tmp()}
            for directory, subdirectories, files in os.walk(top):
                subdirectories[:] = [name for name in subdirectories if Path(directory, name) not in bound]
                for name in files:
                    source = Path(directory, name)
                    with contextlib.suppress(OSError):
                        if source.suffix in KEPT_SUFFIXES and source.stat().st_size < KEPT_FILE_BYTES:
                            target = into / host.name / source.relative_to(top)
                            target.parent.mkdir(parents=True, exist_ok=True)
                            shutil.copyfile(source, target)

    def close(self) -> None:
        """Kill every process of every host by PID, then remove each namespace (its links go with it)."""
        errors = []
        for host in self.hosts.values():
            if host.holder is not None:
                try:
                    host._stop()
                except (RuntimeError, subprocess.TimeoutExpired) as error:
                    errors.append(error)
        for netns in reversed(self.made):
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", netns)
        self.made.clear()
        if errors:
            raise RuntimeError(f"hosts not stopped: {errors}")


def tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def server_log_lines(host: Host, pattern: str) -> list[str]:
    """The lines matching ``pattern`` of the logs of every server ``gym env start`` ran on ``host`` (each run's
    /tmp/nemo_gym_run_*/ there), each after its log's name: for a failed test to say what the servers saw."""
    return [
        f"{log.parent.name}/{log.name}: {line}"
        for log in sorted(host.path("/tmp").glob("nemo_gym_run_*/*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if re.search(pattern, line)
    ]


def start_gym(configs: list[tuple[Host, dict]], timeout: float, env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """``gym env start`` on each host with its config (and ``env`` added to its environment), all at once,
    until each says all its servers are up.

    Each host's servers, head endpoint and logs are its own; the log of ``gym env start`` is
    /tmp/gym.log of its host. Raises with the end of a host's log if its servers do not come up."""
    started = []
    for host, config in configs:
        host.path("/tmp/gym.yaml").write_text(yaml.safe_dump(config))
        with open(host.path("/tmp/gym.log"), "wb") as log:
            command = ["-m", "nemo_gym.cli.main", "env", "start", "--config", "/tmp/gym.yaml", "--start-timeout", str(timeout)]
            started.append(host.python(*command, stdout=log, stderr=subprocess.STDOUT, env=env))
    deadline = time.monotonic() + timeout + COMMAND_TIMEOUT_SECONDS
    for (host, _), process in zip(configs, started):
        log = host.path("/tmp/gym.log")
        while GYM_READY not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gym env start on host {host.name} did not come up:\n{tail(log, GYM_LOG_TAIL_LINES)}")
            time.sleep(0.2)
    return started


def start_balancer(host: Host, port: int, servers: list[tuple[str, int]], name: str = "haproxy") -> subprocess.Popen:
    """HAProxy on ``host:port``, round robin over ``servers`` (each checked by a TCP connect every second);
    its config and log are the host's /tmp/NAME.cfg and /tmp/NAME.log (a name per balancer of a host)."""
    lines = "\n".join(f"    server s{number} {address}:{server_port} check inter 1s fall 1 rise 1" for number, (address, server_port) in enumerate(servers, 1))
    return start_haproxy(host, port, BALANCER_CONFIG.format(address=host.address, port=port, servers=lines), name)


def wait_in_rotation(host: Host, name: str, number: int, timeout: float) -> None:
    """Until the HAProxy ``name`` on ``host`` (``start_balancer``) has its server ``number`` (1 for the first) in
    rotation: the last state its log gives that server is UP, or it never logged one (never taken out)."""
    deadline = time.monotonic() + timeout
    while True:
        states = re.findall(rf"Server replicas/s{number} is (UP|DOWN)", host.path(f"/tmp/{name}.log").read_text(errors="replace"))
        if not states or states[-1] == "UP":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"haproxy {name} on host {host.name} kept server s{number} down:\n{tail(host.path(f'/tmp/{name}.log'), GYM_LOG_TAIL_LINES)}")
        time.sleep(0.2)


def balancer_cut(host: Host, name: str = "haproxy") -> list[str]:
    """The requests the balancer ``name`` on ``host`` answered itself or cut short, from its log: each line whose
    termination state is not ``----`` (its own 502, 503 or 504 among them, with the server it had chosen)."""
    log = host.path(f"/tmp/{name}.log")
    return [line for line in log.read_text(errors="replace").splitlines() if re.search(r'\] \S+ \S+ \S+ \S+ \d+ \S+ \S+ (?!----)\S{4} ', line)]


def start_haproxy(host: Host, port: int, config: str, name: str = "haproxy") -> subprocess.Popen:
    """HAProxy with ``config`` on ``host`` (its config and log /tmp/NAME.cfg and .log there), once it listens on
    ``host:port``. ``nsenter`` execs it, so the process returned is HAProxy's own."""
    if reason := lacking("haproxy"):
        raise HostsUnavailable(reason)
    host.path(f"/tmp/{name}.cfg").write_text(config)
    with open(host.path(f"/tmp/{name}.log"), "wb") as log:
        process = host.run(["haproxy", "-db", "-f", f"/tmp/{name}.cfg"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + COMMAND_TIMEOUT_SECONDS
    while (host.address, port) not in host.listening():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"haproxy on host {host.name} did not listen:\n{tail(host.path(f'/tmp/{name}.log'), GYM_LOG_TAIL_LINES)}")
        time.sleep(0.05)
    return process


def run_client(host: Host, mode: str, args: dict, timeout: float) -> Any:
    """The test client (``python -m tests.hosts_client MODE ARGS``) run on ``host``: its JSON result."""
    return run_json(host, ["-m", CLIENT_MODULE, mode, json.dumps(args)], timeout)


def run_json(host: Host, args: list[str], timeout: float) -> Any:
    """Run ``python ARGS`` on ``host`` and read the JSON it prints last."""
    return json.loads(run_python(host, args, timeout).splitlines()[-1])


def run_python(host: Host, args: list[str], timeout: float) -> str:
    """Run ``python ARGS`` on ``host``: its output, once it exited 0 within ``timeout`` (else RuntimeError)."""
    process = host.python(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise RuntimeError(f"{args} on host {host.name} ran over {timeout} s:\n{err[-3000:]}") from None
    if process.returncode != 0:
        raise RuntimeError(f"{args} on host {host.name} exited with {process.returncode}:\n{err[-3000:]}")
    return out


class Remote:
    """The ``post`` mode of the test client (tests/hosts_client.py) on ``host``: a request per call, a new
    connection each, its reply within ``timeout`` seconds."""

    def __init__(self, host: Host, timeout: float) -> None:
        self.timeout = timeout
        # Each reply of a balancer's own 502 (a server closed the connection without a whole reply) that ``retried`` sent again.
        self.bad_gateways: list[dict] = []
        self.process = host.python("-m", CLIENT_MODULE, "post", "{}", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def send(self, url: str, path: str, body: dict, cookies: dict[str, str], key: str | None = None, client: str = "requests", token: str | None = None) -> None:
        """``client`` ``mcp``: the path is a tool called over MCP with ``token`` alone (``cookies`` unused)."""
        call = {"url": url, "path": path, "body": body, "cookies": cookies, "key": key, "client": client, "token": token}
        self.process.stdin.write(json.dumps(call) + "\n")
        self.process.stdin.flush()

    def receive(self) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout)
        if not ready:
            raise RuntimeError(f"the client on its host had no reply within {self.timeout} s")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the client on its host exited:\n{self.process.stderr.read()[-3000:]}")
        return json.loads(line)

    def post(self, *args, **options) -> dict:
        self.send(*args, **options)
        return self.receive()

    def retried(self, seconds: float, url: str, path: str, body: dict, cookies: dict[str, str], key: str | None = None, client: str = "requests", token: str | None = None) -> dict:
        """``post``, sent again (with the cookies the 503 set) after each 503's Retry-After, as a client is told to, for
        ``seconds``; a request with an id also after a 502 (whether it reached a server is unknown: its id makes the
        retry safe), a second later, each kept in ``bad_gateways``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            reply = self.post(url, path, body, cookies, key, client, token)
            if reply["status"] == 503 and reply["retry_after"]:
                cookies = reply["cookies"]
                time.sleep(float(reply["retry_after"]))
            elif reply["status"] == 502 and key is not None:
                self.bad_gateways.append({"path": path, "key": key, **reply})
                time.sleep(1)
            else:
                break
        return reply

    def __enter__(self) -> "Remote":
        return self

    def __exit__(self, *exc_info) -> None:
        self.process.kill()
        self.process.communicate()
