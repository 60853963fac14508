"""HAProxy as the benchmark's reference balancer: round robin, an inserted cookie, in front of single-worker servers
(or, ``sticky=False``, plain round robin, as an L4 balancer that knows nothing of sessions: the replica-set tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from scripts.bench.processes import Spawned

HAPROXY_INSTALL = "apt-get update && apt-get install -y haproxy   (Debian/Ubuntu; the package is 'haproxy' elsewhere too)"


def haproxy_config(backends: list[str], bind: str, sticky: bool = True) -> str:
    """HAProxy's config: round robin over ``backends`` (URLs or ``host:port``), each request balanced on its own,
    keep-alive on both sides, listening on ``bind`` (``host:port``); ``sticky``: with an inserted cookie."""
    lines = [
        "global",
        "    maxconn 4096",
        "defaults",
        "    mode http",
        "    maxconn 4096",
        "    timeout connect 5s",
        "    timeout client 60s",
        "    timeout server 60s",
        "    timeout http-keep-alive 60s",
        "frontend bench",
        f"    bind {bind}",
        "    default_backend counters",
        "backend counters",
        "    balance roundrobin",
    ]
    if sticky:
        lines.append("    cookie SRV insert indirect nocache")
    lines += [f"    server s{i} {backend.removeprefix('http://')}" + (f" cookie s{i}" if sticky else "") for i, backend in enumerate(backends)]
    return "\n".join(lines) + "\n"


class HAProxy:
    """HAProxy in the foreground on loopback, round robin (with an inserted cookie, ``sticky``), in front of the given backends."""

    def __init__(self, binary: str, backends: list[str], port: int, log_dir: Path, name: str = "haproxy", sticky: bool = True) -> None:
        self.url = f"http://127.0.0.1:{port}"
        config = log_dir / f"{name}.cfg"
        config.write_text(haproxy_config(backends, f"127.0.0.1:{port}", sticky))
        check = subprocess.run([binary, "-c", "-q", "-f", str(config)], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected {config}: {check.stdout}{check.stderr}")
        self.process = Spawned(name, [binary, "-db", "-f", str(config)], log_dir)
        try:
            self.process.wait_ready(f"{self.url}/")
        except BaseException:
            self.process.stop()
            raise

    def stop(self) -> None:
        self.process.stop()
