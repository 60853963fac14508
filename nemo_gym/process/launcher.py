"""Start every instance of a config as its own process, wait until each answers, stop them by PID.

A config with servers that need Ray (their code imports it) or instances with ``num_replicas`` above 1
connects this process to the one Ray cluster (``ray_head_node_address``, or a local one it starts)
and hands its address to every server; each replicated instance runs as replicas on the cluster's
nodes (``nemo_gym.ray_cluster.replicas``). Each process started here dies with this one
(``nemo_gym.process.parent``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from glob import escape as glob_escape
from pathlib import Path

from nemo_gym.config import REPO_ROOT, Instance, config_of, merge
from nemo_gym.env import (
    CONFIG_PATH_ENV,
    DEFAULT_HOST,
    EXTRA_ROOTS_ENV,
    HEAD_PORT_ENV,
    INSTANCE_ENV,
    PARENT_PID_ENV,
    SERVER_PROCESS_MODULE,
    SOCKET_DIR_ENV,
    WORKER_LOG_DIR_ENV,
)
from nemo_gym.global_config import RAY_HEAD_NODE_ADDRESS_KEY_NAME
from nemo_gym.process.parent import children
from nemo_gym.ray_cluster.cluster import join, leave
from nemo_gym.ray_cluster.replicas import PlacementError, ReplicaSet
from nemo_gym.routing.transport.unix import life_sockets, live_workers, make_socket_dir, remove_socket_dir

STOP_GRACE_SECONDS = 15
# How long a start may take before it fails, unless set (``--start-timeout``): this, plus the second
# figure for every worker the config starts, since the workers import and start up on the same cores.
START_TIMEOUT_SECONDS = 60
START_TIMEOUT_PER_WORKER_SECONDS = 10
LOG_TAIL_LINES = 30
WORKER_LOG_TAIL_LINES = 10
# Of a server whose workers uvicorn replaced again and again, the logs of the latest few.
WORKER_LOGS_SHOWN = 8


def default_start_timeout(instances: dict[str, Instance]) -> float:
    return START_TIMEOUT_SECONDS + START_TIMEOUT_PER_WORKER_SECONDS * sum(instance.num_workers for instance in instances.values())


class LaunchError(RuntimeError):
    """A server process exited or never answered ``GET /``; the message holds the end of its log."""


class Launcher:
    """Runs the servers of one resolved config, plus the head endpoint that serves that config."""

    def __init__(
        self,
        instances: dict[str, Instance],
        head_port: int | None,
        extra_env: dict[str, str] | None = None,
        start_timeout: float | None = None,
        settings: dict | None = None,
    ) -> None:
        self.instances = instances
        # Top-level settings (upstream's global keys, e.g. observability_enabled) every server reads beside the instances.
        self.settings = settings or {}
        # None: no head endpoint (a replica's own launcher, on its node).
        self.head_port = head_port
        self.extra_env = extra_env or {}
        # Seconds until every server answers and every worker serves; else the start fails.
        self.start_timeout = default_start_timeout(instances) if start_timeout is None else start_timeout
        # The servers' config and logs: made by start(), removed by stop(); none for a launcher never started.
        self.run_dir: Path | None = None
        self.processes: dict[str, subprocess.Popen] = {}
        # A socket directory per multi-worker server, made here so that stop() removes it whatever
        # became of the server's own process.
        self.socket_dirs: dict[str, str] = {}
        # Whether this process is connected to a Ray cluster, and the replica sets it placed there.
        self.ray_connected = False
        self.replica_sets: dict[str, ReplicaSet] = {}

    @property
    def head_url(self) -> str:
        return f"http://{DEFAULT_HOST}:{self.head_port}"

    def resolved_config(self) -> dict:
        return merge(dict(self.settings), config_of(self.instances))

    def start(self, timeout: float | None = None) -> "Launcher":
        """Start every server and wait until all serve, for ``timeout`` seconds (default: ``start_timeout``)."""
        timeout = self.start_timeout if timeout is None else timeout
        # First: joining or starting a cluster may set Ray's variables (RAY_AUTH_MODE) that the servers need.
        self._connect_ray()
        self.run_dir = Path(tempfile.mkdtemp(prefix="nemo_gym_run_"))
        config_path = self.run_dir / "resolved_config.json"
        env = {**os.environ, **self.extra_env, CONFIG_PATH_ENV: str(config_path), HEAD_PORT_ENV: str(self.head_port)}
        # Every line a server prints is in its log at once, even if it is killed next.
        env.update({"PYTHONUNBUFFERED": "1", WORKER_LOG_DIR_ENV: str(self.run_dir)})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        # Servers found outside the install root import from where the config found them.
        roots = [str(i.directory.parent.parent) for i in self.instances.values() if i.directory is not None]
        env[EXTRA_ROOTS_ENV] = os.pathsep.join(dict.fromkeys(filter(None, [*roots, env.get(EXTRA_ROOTS_ENV)])))
        try:
            self._place_replicas(env, timeout)
            config_path.write_text(json.dumps(self.resolved_config(), indent=2))
            for name, instance in self.instances.items():
                if name in self.replica_sets:
                    continue
                if instance.num_workers > 1:
                    self.socket_dirs[name] = make_socket_dir()
                own_env = {**env, INSTANCE_ENV: name, SOCKET_DIR_ENV: self.socket_dirs.get(name, "")}
                self.processes[name] = self._spawn(name, [SERVER_PROCESS_MODULE], own_env)
            urls = {name: instance.url for name, instance in self.instances.items() if name not in self.replica_sets}
            if self.head_port is not None:
                self.processes["head"] = self._spawn("head", ["nemo_gym.process.head"], env)
                urls["head"] = self.head_url
            self._wait_ready(urls, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _connect_ray(self) -> None:
        """Join the config's Ray cluster when this process places replicas on it; start a local one when a
        server needs Ray and the config names none (its address then goes to every server)."""
        address = self.settings.get(RAY_HEAD_NODE_ADDRESS_KEY_NAME)
        replicated = [i for i in self.instances.values() if i.num_replicas > 1]
        if replicated and not address:
            raise LaunchError(f"servers {sorted(i.name for i in replicated)} ask for num_replicas above 1, which needs a Ray cluster: set {RAY_HEAD_NODE_ADDRESS_KEY_NAME}")
        if not replicated and (address or not any(i.needs_ray for i in self.instances.values())):
            return
        # ray.init puts Ray's SIGTERM handlers in place of this process's: its Python one exits 15, and its
        # C++ failure handler (the first to get the signal) has the process aborted 3 s later, stopped or
        # not. This process's own (gym env start's stop) is put back, so that SIGTERM stops what it started.
        handler = signal.getsignal(signal.SIGTERM)
        self.settings[RAY_HEAD_NODE_ADDRESS_KEY_NAME], _ = join(address, "gym env start")
        self.ray_connected = True
        if handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)

    def _place_replicas(self, env: dict[str, str], timeout: float) -> None:
        """Each instance with ``num_replicas`` above 1: its replicas on as many nodes, serving before anything
        else starts; the instance's settings then name them (``host`` the first, ``replicas`` all)."""
        replicated = [i for i in self.instances.values() if i.num_replicas > 1]
        if not replicated:
            return
        # Where the code is, as here; every node keeps its own state directory.
        handed = {key: env[key] for key in ("PYTHONPATH", EXTRA_ROOTS_ENV) if env.get(key)}
        for instance in replicated:
            self.replica_sets[instance.name] = ReplicaSet(instance, {**handed, **self.extra_env})
        for replica_set in self.replica_sets.values():
            try:
                replica_set.start(self.resolved_config(), timeout)
            except PlacementError as error:
                raise LaunchError(str(error)) from None

    def _spawn(self, name: str, module: list[str], env: dict[str, str]) -> subprocess.Popen:
        # The child keeps its own copy of the log's descriptor; this process needs none.
        with open(self.run_dir / f"{name}.log", "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", *module], env={**env, PARENT_PID_ENV: str(os.getpid())}, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log_tail(self, name: str) -> str:
        """The last lines of a server's log, then of each of its (latest) workers' own logs."""
        sections = [tail(self.run_dir / f"{name}.log", LOG_TAIL_LINES)]
        newest = sorted(self.worker_logs(name).items(), key=lambda item: item[1].stat().st_mtime)[-WORKER_LOGS_SHOWN:]
        for pid, path in sorted(newest):
            sections.append(f"--- {name}: worker process {pid}; its last log lines ---\n{tail(path, WORKER_LOG_TAIL_LINES)}")
        return "\n".join(sections)

    def worker_logs(self, name: str) -> dict[int, Path]:
        """Each worker process of a multi-worker server (its PID) that has started, and its own log."""
        prefix = f"{name}.worker-"
        return {int(path.name[len(prefix) : -len(".log")]): path for path in self.run_dir.glob(glob_escape(prefix) + "*.log")}

    def _wait_ready(self, urls: dict[str, str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = dict(urls)
        while waiting:
            for name, url in list(waiting.items()):
                if self.processes[name].poll() is not None:
                    raise LaunchError(f"server {name!r} exited with code {self.processes[name].returncode}:\n{self.log_tail(name)}")
                if self._every_worker_serves(name) and self._answers(url):
                    del waiting[name]
            if waiting and time.monotonic() > deadline:
                reports = "\n".join(self._not_serving(name) for name in sorted(waiting))
                raise LaunchError(f"servers {sorted(waiting)} were not serving within {timeout:g} s (a longer limit: --start-timeout SECONDS):\n{reports}")
            if waiting:
                time.sleep(0.1)

    def _not_serving(self, name: str) -> str:
        """What of a server is not up: the workers that do not serve, each with its last log lines, then the
        server's own log."""
        process = self.processes[name]
        socket_dir = self.socket_dirs.get(name)
        if socket_dir is None:
            return f"--- {name}: process {process.pid}, not answering GET /; its last log lines ---\n{tail(self.run_dir / f'{name}.log', LOG_TAIL_LINES)}"
        logs = self.worker_logs(name)
        workers = children(process.pid) & set(logs)
        serving = holding_life_names(workers, socket_dir)
        lines = [f"--- {name}: {live_workers(socket_dir)} of {self.instances[name].num_workers} workers serving ---"]
        for pid in sorted(workers - serving):
            lines.append(f"--- {name}: worker process {pid}, not serving; its last log lines ---\n{tail(logs[pid], LOG_TAIL_LINES)}")
        lines.append(f"--- {name}: its server process {process.pid}; its last log lines ---\n{tail(self.run_dir / f'{name}.log', LOG_TAIL_LINES)}")
        return "\n".join(lines)

    def _every_worker_serves(self, name: str) -> bool:
        """A multi-worker server is up only once each of its workers holds its life name."""
        socket_dir = self.socket_dirs.get(name)
        return socket_dir is None or live_workers(socket_dir) >= self.instances[name].num_workers

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(f"{url}/", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """Stop every replica set (each replica on its node, below), then SIGTERM each process, give it time to
        shut down, then SIGKILL whatever is left of its group; last, leave the Ray cluster."""
        for replica_set in self.replica_sets.values():
            replica_set.stop()
        self.replica_sets.clear()
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process.wait()
        self.processes.clear()
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        for socket_dir in self.socket_dirs.values():
            remove_socket_dir(socket_dir)
        self.socket_dirs.clear()
        if self.ray_connected:
            leave()
            self.ray_connected = False

    def table(self) -> str:
        rows = [("name", "type", "address", "workers")]
        for i in self.instances.values():
            urls = self.replica_sets[i.name].urls if i.name in self.replica_sets else [i.url]
            rows += [(i.name, i.server_type, url, str(i.num_workers)) for url in urls]
        if self.head_port is not None:
            rows.append(("head", "-", self.head_url, "1"))
        widths = [max(len(row[column]) for row in rows) for column in range(4)]
        return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)

    def __enter__(self) -> "Launcher":
        """``with Launcher(...)`` starts the servers; ``with launcher.start()`` does not start them again."""
        return self if self.processes else self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def holding_life_names(pids: set[int], socket_dir: str) -> set[int]:
    """Those of ``pids`` that hold a life name of this socket directory's workers (by socket inode)."""
    held = {f"socket:[{inode}]" for inode in life_sockets(socket_dir).values()}
    holding = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in held for fd in Path(f"/proc/{pid}/fd").iterdir()):
                holding.add(pid)
    return holding
