"""The sandboxes on disk, as ``GET /metrics`` reports them: how many the instance's root holds and the disk they take.

Read from the root at each scrape, whichever worker answers: every worker's sandboxes, and those a gone
worker left that no sweep has taken yet (they take disk too). A jailed sandbox is a tmpfs of its own, whose
used size the kernel says (``statvfs``); an unjailed one is a plain directory, whose files' blocks are added up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from resources_servers.swe_rebench.sandbox_root import SandboxRoot


def used_bytes(path: Path) -> int:
    """The disk a sandbox takes: its tmpfs's used blocks, or its files' blocks; 0 if it went meanwhile."""
    try:
        if os.path.ismount(path):
            stats = os.statvfs(path)
            return (stats.f_blocks - stats.f_bfree) * stats.f_frsize
        total = 0
        for directory, _, files in os.walk(path):
            for name in files:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
        return total
    except FileNotFoundError:
        return 0


class SandboxMetrics:
    """A ``prometheus_client`` collector: ``nemo_gym_sandboxes`` and ``nemo_gym_sandbox_disk_bytes``."""

    def __init__(self, root: SandboxRoot) -> None:
        self.root = root

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        sandboxes = sorted(self.root.path.glob("worker-*/sandbox-*"))
        yield GaugeMetricFamily("nemo_gym_sandboxes", "Sandboxes in the instance's sandbox root (every worker's).", value=len(sandboxes))
        yield GaugeMetricFamily("nemo_gym_sandbox_disk_bytes", "Disk the sandboxes in the root take.", value=sum(map(used_bytes, sandboxes)))
