"""What ``GET /metrics`` answers: this process's metrics, or, in a multi-process directory, every worker's of the instance.

Each instance's main process (``nemo_gym.process.run``) makes the directory, new and empty, sets it as
``PROMETHEUS_MULTIPROC_DIR`` for itself and the workers it forks, and removes it when it stops. Every worker
writes its values there (``prometheus_client``'s multi-process mode), so whichever worker is asked reads
them all: counters and histograms sum over every process that ever ran, a dead one's included, so they
survive a worker's restart; live-session gauges (``livesum``) count only live processes: before each
scrape, the live gauges of processes that are gone are dropped (``mark_process_dead``), whoever restarted them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# A metrics file begins with how much of it is used, 8 bytes (prometheus_client's mmap_dict); it only grows.
HEADER_BYTES = 8


def make_metrics_dir() -> str:
    """A new, empty directory under /tmp for one instance's workers' metrics."""
    return tempfile.mkdtemp(prefix="ngm-", dir="/tmp")


def remove_metrics_dir(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def is_alive(pid: int) -> bool:
    """Running, and not a zombie that its parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def forget_dead_processes(directory: str) -> None:
    """Drop the live gauges of the processes that wrote them and are gone."""
    from prometheus_client.multiprocess import mark_process_dead

    for path in glob.glob(os.path.join(glob.escape(directory), "gauge_live*_*.db")):
        pid = path.rsplit("_", 1)[1].removesuffix(".db")
        if pid.isdigit() and not is_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):  # another worker's scrape dropped them first
                mark_process_dead(int(pid), directory)


class Exposition:
    """The text ``GET /metrics`` answers with: every process's metrics in the multi-process directory, or
    else this process's (``meters``: as installed last); plus ``collectors``, the server's own (read at each scrape)."""

    def __init__(self, meters: Any, collectors: Iterable[Any] = ()) -> None:
        from prometheus_client import CollectorRegistry

        self.directory = os.environ.get(MULTIPROC_DIR_ENV)
        self.registry = CollectorRegistry()
        if self.directory:
            self.registry.register(WrittenFiles(self.directory))
        else:
            self.registry.register(InstalledMeters(meters))
        for collector in collectors:
            self.registry.register(collector)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        if self.directory:
            forget_dead_processes(self.directory)
        return generate_latest(self.registry)


class WrittenFiles:
    """prometheus_client's multi-process collector over the files whose header is written. A worker that
    starts makes each of its files empty, then sizes it: read in between, a file fails the whole scrape."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def collect(self) -> Iterable[Any]:
        from prometheus_client.multiprocess import MultiProcessCollector

        files = []
        for path in glob.glob(os.path.join(glob.escape(self.directory), "*.db")):
            try:
                if os.path.getsize(path) >= HEADER_BYTES:
                    files.append(path)
            except FileNotFoundError:  # a gone process's live gauges, dropped meanwhile
                continue
        return MultiProcessCollector.merge(files, accumulate=True)


class InstalledMeters:
    """A collector of the metrics ``meters`` holds now (several servers built in one process install in turn)."""

    def __init__(self, meters: Any) -> None:
        self.meters = meters

    def collect(self) -> Iterable[Any]:
        return [] if self.meters.registry is None else self.meters.registry.collect()
