"""Start every instance of a config as its own process, wait until each answers, stop them by PID."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from nemo_gym.config import REPO_ROOT, Instance, merge
from nemo_gym.head import HEAD_PORT_ENV
from nemo_gym.routing.liveness import live_workers
from nemo_gym.routing.worker import SOCKET_DIR_ENV, make_socket_dir, remove_socket_dir
from nemo_gym.global_config import CONFIG_PATH_ENV, INSTANCE_ENV
from nemo_gym.server_paths import EXTRA_ROOTS_ENV

STOP_GRACE_SECONDS = 15


class LaunchError(RuntimeError):
    """A server process exited or never answered ``GET /``; the message holds the end of its log."""


class Launcher:
    """Runs the servers of one resolved config, plus the head endpoint that serves that config."""

    def __init__(self, instances: dict[str, Instance], head_port: int, extra_env: dict[str, str] | None = None) -> None:
        self.instances = instances
        self.head_port = head_port
        self.extra_env = extra_env or {}
        self.run_dir = Path(tempfile.mkdtemp(prefix="nemo_gym_run_"))
        self.processes: dict[str, subprocess.Popen] = {}
        # A socket directory per multi-worker server, made here so that stop() removes it whatever
        # became of the server's own process.
        self.socket_dirs: dict[str, str] = {}

    @property
    def head_url(self) -> str:
        return f"http://127.0.0.1:{self.head_port}"

    def resolved_config(self) -> dict:
        resolved: dict = {}
        for instance in self.instances.values():
            resolved = merge(resolved, instance.to_dict())
        return resolved

    def start(self, timeout: float = 60) -> "Launcher":
        config_path = self.run_dir / "resolved_config.json"
        config_path.write_text(json.dumps(self.resolved_config(), indent=2))
        env = {**os.environ, **self.extra_env, CONFIG_PATH_ENV: str(config_path), HEAD_PORT_ENV: str(self.head_port)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        # Servers found outside the install root import from where the config found them.
        roots = [str(i.directory.parent.parent) for i in self.instances.values() if i.directory is not None]
        env[EXTRA_ROOTS_ENV] = os.pathsep.join(dict.fromkeys(filter(None, [*roots, env.get(EXTRA_ROOTS_ENV)])))
        try:
            for name, instance in self.instances.items():
                if instance.num_workers > 1:
                    self.socket_dirs[name] = make_socket_dir()
                own_env = {**env, INSTANCE_ENV: name, SOCKET_DIR_ENV: self.socket_dirs.get(name, "")}
                self.processes[name] = self._spawn(name, ["nemo_gym.serve"], own_env)
            self.processes["head"] = self._spawn("head", ["nemo_gym.head"], env)
            urls = {name: instance.url for name, instance in self.instances.items()} | {"head": self.head_url}
            self._wait_ready(urls, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, module: list[str], env: dict[str, str]) -> subprocess.Popen:
        # The child keeps its own copy of the log's descriptor; this process needs none.
        with open(self.run_dir / f"{name}.log", "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", *module], env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.run_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

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
                logs = "".join(f"\n--- {name} ---\n{self.log_tail(name)}" for name in sorted(waiting))
                raise LaunchError(f"servers {sorted(waiting)} did not have every worker serving within {timeout} s:{logs}")
            if waiting:
                time.sleep(0.1)

    def _every_worker_serves(self, name: str) -> bool:
        """A multi-worker server is up only once each of its workers holds its life lock."""
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
        """SIGTERM each process, give it time to shut down, then SIGKILL whatever is left of its group."""
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
        shutil.rmtree(self.run_dir, ignore_errors=True)
        for socket_dir in self.socket_dirs.values():
            remove_socket_dir(socket_dir)
        self.socket_dirs.clear()

    def table(self) -> str:
        rows = [("name", "type", "address", "workers")]
        rows += [(i.name, i.server_type, i.url, str(i.num_workers)) for i in self.instances.values()]
        rows.append(("head", "-", self.head_url, "1"))
        widths = [max(len(row[column]) for row in rows) for column in range(4)]
        return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)

    def __enter__(self) -> "Launcher":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
