"""The processes the benchmark starts and stops, and when a multi-worker server's workers are up."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from nemo_gym.config import REPO_ROOT
from nemo_gym.routing.transport.unix import live_workers
from scripts.bench.proc import child_pids, cpu_seconds, private_socket

STOP_GRACE_SECONDS = 15
REPLACED_WARNING = "WARNING: uvicorn replaced a worker of {} during the runs; its figures are not reliable"


class Spawned:
    """A process this script started in its own process group, stopped by its PID."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None, cwd: Path = REPO_ROOT) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, url: str, timeout: float = 60, socket_dir: str | None = None, workers: int = 1) -> None:
        """Until ``GET url`` answers 200 and, for a server of several workers, every one holds its life name;
        a process that exits first is an error with its log."""
        deadline = time.monotonic() + timeout
        while not self.serves(url, socket_dir, workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} was not serving {url} with {workers} workers within {timeout} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def serves(self, url: str, socket_dir: str | None = None, workers: int = 1) -> bool:
        """Whether every worker serves now: as the launcher's readiness, each worker of a multi-worker server
        holds its life name (taken at the end of its start-up, once its private socket serves) and ``GET url``
        answers 200. A process that has exited is an error with its log."""
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with code {self.process.returncode}:\n{self.log_tail()}")
        if workers > 1 and (socket_dir is None or live_workers(socket_dir) < workers):
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)  # whatever is left of its group (uvicorn's workers)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()


def command_line(pid: int) -> bytes | None:
    """A process's command line, None once it has ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def is_resource_tracker(pid: int) -> bool:
    """Whether a child of uvicorn's supervisor is multiprocessing's resource_tracker rather than a worker. Between
    its fork and its exec it shows no command line (or the supervisor's), so ask once it is settled."""
    return b"resource_tracker" in (command_line(pid) or b"")


def current_workers(pid: int) -> list[int]:
    """The uvicorn worker processes of a multi-worker server: its live children, less multiprocessing's resource_tracker."""
    return sorted(child for child in child_pids(pid) if (line := command_line(child)) is not None and b"resource_tracker" not in line)


def worker_pids(pid: int, count: int, timeout: float = 60) -> list[int]:
    """The ``count`` workers of the server process ``pid``; a single-worker server is its own one worker."""
    if count == 1:
        return [pid]
    deadline = time.monotonic() + timeout
    while True:
        workers = current_workers(pid)
        if len(workers) == count:
            return workers
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} has {len(workers)} workers, expected {count}")
        time.sleep(0.1)


def settled_workers(pid: int, count: int, routed: bool, timeout: float = 180) -> list[int]:
    """The worker PIDs once every worker has finished starting: the same PIDs, and no CPU used, for a whole
    second, and for a routed server each one serving its private socket (a single worker has none).

    GET / answering is not enough: it answers as soon as one worker is up. Under heavy load uvicorn's
    supervisor may also replace a worker that misses its health check while it is still importing.
    """
    deadline = time.monotonic() + timeout
    while True:
        pids = worker_pids(pid, count, max(1.0, deadline - time.monotonic()))
        try:
            before = {worker: cpu_seconds(worker) for worker in pids}
            time.sleep(1)
            idle = all(cpu_seconds(worker) - before[worker] < 0.05 for worker in pids)
            serving = not routed or count == 1 or all(private_socket(worker) for worker in pids)
        except OSError:
            idle = serving = False
        if idle and serving and worker_pids(pid, count) == pids:
            return pids
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers of process {pid} did not settle within {timeout} s")


def replaced(pid: int, workers: list[int]) -> bool:
    """Whether the server's workers are no longer the ones measured (uvicorn replaced one)."""
    return len(workers) > 1 and current_workers(pid) != workers
