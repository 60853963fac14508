"""Section 6, replicas on several hosts (issue 20): one server's replicas behind round robin against HAProxy's
cookie-insert, the cost of a cross-host forward, and Gym's client's direct hits across hosts.

Five network-namespace hosts (tests/hosts.py): h1, h2 and h3 each run, in one ``gym env start``, the
counter at 2 workers (``counter``: routed, in memory, the same ``session_secret`` on every host, so the
three are one replica set) and two single-worker counters (``counter_a``, ``counter_b``). The host
``balancer`` runs two HAProxy processes: plain round robin over the three replicas, and cookie-insert
over the six single-worker counters, with the same config otherwise (keep-alive on both sides, each
request balanced on its own: scripts/bench/haproxy.py). The client (scripts/bench/hosts_client.py) runs
on the host ``client`` and drives counter episodes through either balancer by long-lived loops (the
"loops" pattern), the two configurations and Gym's own client against the replicas alternating in
rotated rounds. A run's server CPU is the user and system time, from /proc, of the processes serving
its instances (found by the instance their environment names: supervisors and workers) and of its
HAProxy, from before the client is told to start until it answers. Then, one request at a time, the
latency of a request sent to its session's owner replica against one sent to another replica, which
forwards it over TCP. Without root (or ``ip``, ``nsenter``, HAProxy) the section says it was skipped, and why.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
from pathlib import Path
from typing import Any

from nemo_gym.env import INSTANCE_ENV
from scripts.bench.driving import RUN_TIMEOUT_SECONDS
from scripts.bench.figures import fmt, log, median, ratio, render_table
from scripts.bench.haproxy import HAPROXY_INSTALL, haproxy_config
from scripts.bench.hosts_client import CROSS_HOST, LOCAL
from scripts.bench.proc import cpu_seconds
from scripts.bench.servers import COUNTER, resource_server
from tests.hosts import Host, Hosts, HostsUnavailable, descendants, start_gym, start_haproxy, tail

REPLICA_HOSTS = ["h1", "h2", "h3"]
HOST_NAMES = [*REPLICA_HOSTS, "balancer", "client"]
REPLICAS = "counter"
WORKERS = 2
SINGLES = {"counter_a": 8001, "counter_b": 8002}
PUBLIC_PORT = 8000
ROUND_ROBIN_PORT = 8000
COOKIE_INSERT_PORT = 8001
START_TIMEOUT_SECONDS = 300
CLIENT_MODULE = "scripts.bench.hosts_client"
TARGET_DIRECT_SHARE = 0.95

ROUND_ROBIN = f"{len(REPLICA_HOSTS)} hosts x {WORKERS} workers, round robin"
GYM = f"{len(REPLICA_HOSTS)} hosts x {WORKERS} workers, Gym client"
COOKIE_INSERT = f"cookie-insert + {len(REPLICA_HOSTS) * len(SINGLES)} x 1 worker"
ROWS = (ROUND_ROBIN, GYM, COOKIE_INSERT)


def unavailable() -> str | None:
    """Why the section cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, hint in (("ip", "install iproute2"), ("nsenter", "install util-linux"), ("haproxy", f"install: {HAPROXY_INSTALL}")):
        if shutil.which(tool) is None:
            return f"no {tool} ({hint})"
    return None


def host_config(host: Host) -> dict:
    """A replica host's config: the counter's replica (routed, in memory) and its two single-worker counters."""
    replica = resource_server(COUNTER, host=host.address, port=PUBLIC_PORT, num_workers=WORKERS, durable_sessions=False)
    singles = {name: resource_server(COUNTER, host=host.address, port=port, num_workers=1) for name, port in SINGLES.items()}
    return {REPLICAS: replica, **singles}


def instance_of(pid: int) -> str | None:
    """The instance a server process serves (its environment names it); None for any other process."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{INSTANCE_ENV}=".encode()
    return next((entry[len(prefix):].decode() for entry in environ if entry.startswith(prefix)), None)


def server_pids(hosts: list[Host], instances: set[str]) -> list[int]:
    return sorted(pid for host in hosts for pid in host.processes() if instance_of(pid) in instances)


def row_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A row from its runs: medians of rates, latencies and server CPU per episode; sums of the counts."""
    figures: dict[str, Any] = {key: median([run[key] for run in runs]) for key in ("per_second", "p50_ms", "p99_ms", "client_cpu_ms")}
    figures["per_second_all_runs"] = [run["per_second"] for run in runs]
    figures["server_cpu_ms"] = median([run["server_cpu_s"] / run["total"] * 1000 for run in runs])
    for key in ("total", "good", "errors", "requests", "owner_host", "owner_worker"):
        if key in runs[0]:
            figures[key] = sum(run[key] for run in runs)
    figures["first_error"] = next((run["first_error"] for run in runs if run["first_error"]), None)
    return figures


class Client:
    """The client process on its own host, given one command at a time (scripts/bench/hosts_client.py)."""

    def __init__(self, host: Host, log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log_file:
            self.process = host.python("-m", CLIENT_MODULE, REPLICAS, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, text=True)

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], RUN_TIMEOUT_SECONDS)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"the client did not answer {command}:\n{tail(self.log_path, 40)}")
        return json.loads(line)

    def stop(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def hosts_section(args: argparse.Namespace, log_dir: Path) -> dict:
    reason = unavailable()
    if reason is not None:
        return {"skipped": reason}
    log("6. replicas on several hosts: making the hosts and starting the servers")
    try:
        lan = Hosts(HOST_NAMES).__enter__()
    except HostsUnavailable as error:
        return {"skipped": str(error)}
    try:
        return measure(lan, args, log_dir)
    finally:
        lan.close()


def measure(lan: Hosts, args: argparse.Namespace, log_dir: Path) -> dict:
    replicas = [lan[name] for name in REPLICA_HOSTS]
    start_gym([(host, host_config(host)) for host in replicas], START_TIMEOUT_SECONDS)
    balancer = lan["balancer"]
    round_robin = haproxy_config([f"{host.address}:{PUBLIC_PORT}" for host in replicas], f"{balancer.address}:{ROUND_ROBIN_PORT}", sticky=False)
    singles = [f"{host.address}:{port}" for host in replicas for port in SINGLES.values()]
    cookie_insert = haproxy_config(singles, f"{balancer.address}:{COOKIE_INSERT_PORT}", sticky=True)
    haproxies = {
        "round_robin": start_haproxy(balancer, ROUND_ROBIN_PORT, round_robin, "haproxy_round_robin"),
        "cookie_insert": start_haproxy(balancer, COOKIE_INSERT_PORT, cookie_insert, "haproxy_cookie_insert"),
    }
    haproxy_pids = {name: [process.pid, *descendants(process.pid)] for name, process in haproxies.items()}
    replica_pids = server_pids(replicas, {REPLICAS}) + haproxy_pids["round_robin"]
    single_pids = server_pids(replicas, set(SINGLES)) + haproxy_pids["cookie_insert"]
    # By name: aiohttp's jar keeps no cookie from an IP address, and it is what a user would write.
    targets = {
        ROUND_ROBIN: ({"episodes": f"http://balancer:{ROUND_ROBIN_PORT}", "gym": False}, replica_pids),
        GYM: ({"episodes": f"http://balancer:{ROUND_ROBIN_PORT}", "gym": True}, replica_pids),
        COOKIE_INSERT: ({"episodes": f"http://balancer:{COOKIE_INSERT_PORT}", "gym": False}, single_pids),
    }
    client = Client(lan["client"], log_dir / "hosts_client.log")
    try:
        if args.warmup > 0:
            for command, _ in targets.values():
                client.ask({**command, "count": min(args.warmup, args.episodes), "concurrency": args.concurrency})
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
        for round_ in range(args.runs):
            for name in ROWS[round_ % len(ROWS):] + ROWS[: round_ % len(ROWS)]:
                command, pids = targets[name]
                before = sum(map(cpu_seconds, pids))
                run = client.ask({**command, "count": args.episodes, "concurrency": args.concurrency})
                run["server_cpu_s"] = sum(map(cpu_seconds, pids)) - before
                runs[name].append(run)
                note = f", first error: {run['first_error']}" if run["first_error"] else ""
                log(f"  run {round_ + 1}/{args.runs} {name}: {run['good']}/{run['total']}, {run['per_second']:.0f}/s{note}")
        log("  cross-host forward against a local request, one at a time")
        urls = [f"http://{host.address}:{PUBLIC_PORT}" for host in replicas]
        hop = client.ask({"hop": urls, "requests": args.hop_requests, "block": args.hop_block, "runs": args.runs})
    finally:
        client.stop()
    rows = {name: {**row_figures(each), "processes": len(targets[name][1])} for name, each in runs.items()}
    return {"rows": rows, "hop": hop}


def hosts_table(result: dict, args: argparse.Namespace) -> str:
    if "skipped" in result:
        return f"6. Replicas on several hosts: skipped ({result['skipped']})"
    rows_by_name = result["rows"]
    cookie = rows_by_name[COOKIE_INSERT]
    rows = []
    for name, row in rows_by_name.items():
        rows.append([
            name,
            f"{row['good']}/{row['total']}",
            f"{row['errors']}",
            fmt(row["per_second"], ".0f"),
            " ".join(f"{rate:.0f}" for rate in row["per_second_all_runs"]),
            fmt(row["p50_ms"], ".1f"),
            fmt(row["p99_ms"], ".1f"),
            fmt(row["server_cpu_ms"], ".2f"),
            fmt(ratio(row["per_second"], cookie["per_second"]), ".2f", "x"),
            fmt(ratio(row["server_cpu_ms"], cookie["server_cpu_ms"]), ".2f", "x"),
            f"{row['processes']}",
            fmt(row["client_cpu_ms"], ".2f"),
        ])
    header = [
        "configuration", "reward 1.0 / total", "errors", "episodes/s", "each run", "p50 ms", "p99 ms", "server CPU ms/ep",
        "episodes/s vs cookie", "CPU/ep vs cookie", "server processes", "client CPU ms/ep",
    ]
    title = (
        f"6a. Replicas on {len(REPLICA_HOSTS)} network-namespace hosts, counter episodes from a host of their own through HAProxy: "
        f"{args.episodes} per run at concurrency {args.concurrency}, loops client, medians of {args.runs} runs, reward over all runs "
        "(server CPU, user and system: the processes of the instance driven and its HAProxy, per episode; "
        "client CPU: the client's own, which shares the machine's cores with the servers)"
    )
    hop = result["hop"]
    hop_rows = [
        [kind, fmt(hop[kind]["p50_ms"], ".3f"), fmt(hop[kind]["p99_ms"], ".3f"), fmt(ratio(hop[kind]["p50_ms"], hop[LOCAL]["p50_ms"]), ".2f", "x")]
        for kind in (LOCAL, CROSS_HOST)
    ]
    hop_title = (
        f"6b. Cross-host forward: POST /increment_counter one at a time, {hop['requests_per_run']} of each kind per run, medians of {args.runs} runs "
        "(local: sent to the host of its owner replica; cross-host: to another replica, which forwards it over TCP)"
    )
    gym = rows_by_name[GYM]
    host_share = ratio(gym["owner_host"], gym["requests"])
    worker_share = ratio(gym["owner_worker"], gym["requests"])
    notes = [
        f"   every increment reached its session's state: {'yes' if hop['state_intact'] else 'NO'}",
        f"6c. Gym client's non-first requests answered on their owner host (no cross-host hop): {gym['owner_host']}/{gym['requests']} "
        f"({fmt(host_share, '.1%')}; target >= {TARGET_DIRECT_SHARE:.0%}), by the owner worker itself: {gym['owner_worker']} ({fmt(worker_share, '.1%')})",
    ]
    return "\n".join([title, render_table(header, rows), "", hop_title, render_table(["request", "p50 ms", "p99 ms", "p50 / local"], hop_rows), *notes])
