"""Multi-worker benchmark: our routing side by side with HAProxy, hop cost, memory, CPU scale, start-up, replicas on hosts.

    python -m scripts.bench                      # everything, default sizes (several minutes)
    python -m scripts.bench --quick              # every section tiny: a sanity check, not a measurement
    python -m scripts.bench --sections startup,episodes --rows gym,off-gym --baseline /tmp/base

It starts every server it measures as a real process on loopback, stops each by its PID, and prints
medians of ``--runs`` alternating runs per configuration:

1. counter episodes (seed 0, +1, +2, verify 3) from a generic pooled aiohttp client (one session, no
   cookie jar, each episode's cookies threaded by hand from Set-Cookie) against the counter server at
   1 worker, at 4 workers routed, at 4 workers with routing off, and HAProxy (round robin, inserted
   cookie) in front of 4 single-worker instances, and from Gym's own client; driven twice
   (``--patterns``): by long-lived loops that mostly keep their own connection, and by one task per
   episode behind a semaphore on one session with aiohttp's default pool, whose requests hop between
   connections; with the sessions per worker (placement spread), throughput, latency and the server's
   CPU per episode and per request;
2. hop cost: one request at a time, to the worker that owns the session (local) or to the other one
   (forwarded), plus straight to the owner's private socket, which is the owner's share of a forward;
3. memory: each worker's RSS before and after ``--sessions`` new sessions on routes that store nothing;
4. CPU-bound scale: a verify that burns 5 ms of CPU, throughput at 2 workers over 1;
5. start-up: the counter at 1, 4 and 8 workers, from launch until every worker serves, and its CPU;
6. replicas on several hosts (network namespaces, needs root, else skipped saying why): 3 hosts x 2
   workers behind HAProxy round robin against HAProxy cookie-insert in front of 6 single-worker
   counters on the same hosts, from a client on a host of its own (throughput, server CPU per episode,
   HAProxy's included); a cross-host forward against a local request; Gym's client's direct hits.

With ``--baseline PATH`` (another checkout of this project, e.g. ``git worktree add /tmp/base <commit>``),
sections 1 and 5 run every case from both trees, alternately in the same rounds, and print the current
tree's figures over the baseline's; sections 2-4 and 6 measure the current tree only. Then each target of
issues 6, 9, 13, 19 and 20, met or not met. Timings are only printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.bench.cpu_scale import cpu_section, cpu_table
from scripts.bench.driving import PATTERNS
from scripts.bench.episodes import ROWS, episodes_section, episodes_table
from scripts.bench.figures import log
from scripts.bench.haproxy import HAPROXY_INSTALL
from scripts.bench.hop import hop_section, hop_table
from scripts.bench.hosts import hosts_section, hosts_table
from scripts.bench.memory import memory_section, memory_table
from scripts.bench.servers import CURRENT, Tree
from scripts.bench.startup import startup_section, startup_table
from scripts.bench.targets import targets

SECTIONS = {
    "episodes": (episodes_section, episodes_table),
    "hop": (hop_section, hop_table),
    "memory": (memory_section, memory_table),
    "cpu": (cpu_section, cpu_table),
    "startup": (startup_section, startup_table),
    "hosts": (hosts_section, hosts_table),
}
# --quick: every section at a size that only shows it runs, and of section 1 the two rows of Gym's client.
QUICK = dict(
    runs=1, warmup=20, episodes=100, concurrency=20, hop_requests=40, hop_block=20, sessions=500, memory_warmup=50,
    memory_workers=2, cpu_episodes=40, cpu_concurrency=8, startup_workers="1,2", rows="gym,off-gym",
)


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    model = "unknown CPU"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    extras = []
    for module in ("uvloop", "httptools"):
        try:
            __import__(module)
            extras.append(f"{module} yes")
        except ImportError:
            extras.append(f"{module} no")
    versions = []
    for package in ("uvicorn", "aiohttp", "starlette"):
        versions.append(f"{package} {__import__(package).__version__}")
    load = load_average()
    return (
        f"Machine: {os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, {', '.join(versions)}, "
        f"{', '.join(extras)}; load average at start {load}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.bench", description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help=f"tiny sizes, for a sanity check (flags given win): {QUICK}")
    parser.add_argument("--baseline", type=Path, help="1 and 5: another checkout of this project, run side by side with this one")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs per configuration (the median is shown)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up episodes per configuration, not counted")
    parser.add_argument("--episodes", type=int, default=2000, help="1 and 6: counter episodes per run")
    parser.add_argument("--concurrency", type=int, default=200, help="1, 3 and 6: episodes in flight")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"1: comma-separated subset of {','.join(ROWS)}")
    parser.add_argument("--no-haproxy", action="store_true", help="1: leave out the HAProxy row")
    parser.add_argument("--patterns", default=",".join(PATTERNS), help=f"1: comma-separated subset of {','.join(PATTERNS)}")
    parser.add_argument("--hop-requests", type=int, default=2000, help="2 and 6: requests of each kind per run")
    parser.add_argument("--hop-block", type=int, default=100, help="2 and 6: requests per block; kinds alternate block by block")
    parser.add_argument("--sessions", type=int, default=100_000, help="3: new sessions between the two RSS readings")
    parser.add_argument("--memory-warmup", type=int, default=2000, help="3: sessions before the first RSS reading")
    parser.add_argument("--memory-workers", type=int, default=4, help="3: workers of the server measured")
    parser.add_argument("--cpu-episodes", type=int, default=1000, help="4: episodes per run")
    parser.add_argument("--cpu-concurrency", type=int, default=64, help="4: episodes in flight")
    parser.add_argument("--verify-cpu-ms", type=float, default=5.0, help="4: CPU each verify burns")
    parser.add_argument("--startup-workers", default="1,4,8", help="5: comma-separated worker counts of the counter started")
    parser.add_argument("--json", type=Path, help="also write the measured figures to this file")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs (they are always kept on failure)")
    if "--quick" in argv:
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    args.sections = names(parser, "sections", args.sections, SECTIONS)
    args.rows = names(parser, "rows", args.rows, ROWS)
    args.patterns = names(parser, "patterns", args.patterns, PATTERNS)
    try:
        args.startup_workers = [int(count) for count in args.startup_workers.split(",")]
    except ValueError:
        parser.error(f"--startup-workers takes whole numbers, got {args.startup_workers!r}")
    if args.runs < 1 or args.episodes < 1 or args.hop_block < 2 or min(args.startup_workers) < 1:
        parser.error("--runs, --episodes and --startup-workers must be at least 1, --hop-block at least 2")
    args.hop_block = min(args.hop_block, args.hop_requests)
    args.trees = [CURRENT]
    if args.baseline is not None:
        if not (args.baseline / "nemo_gym").is_dir():
            parser.error(f"--baseline {args.baseline}: not a checkout of this project (no nemo_gym/ in it)")
        args.trees.append(Tree("baseline", args.baseline.resolve()))
    return args


def names(parser: argparse.ArgumentParser, flag: str, given: str, known: Any) -> list[str]:
    """A comma-separated list of names, each one of ``known``."""
    chosen = [name.strip() for name in given.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        parser.error(f"unknown --{flag} {unknown}; choose from {', '.join(known)}")
    return chosen


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(machine(), flush=True)
    if "episodes" in args.sections and "haproxy" in args.rows and not args.no_haproxy and shutil.which("haproxy") is None:
        print(f"HAProxy is not installed, so its row is skipped. To include it: {HAPROXY_INSTALL}", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench_"))
    results: dict[str, Any] = {}
    started = time.monotonic()
    try:
        for name in args.sections:
            section, table = SECTIONS[name]
            results[name] = section(args, log_dir)
            print(f"\n{table(results[name], args)}\n   (load average after it: {load_average()})", flush=True)
            for warning in results[name].get("warnings", []):
                print(warning, flush=True)
    except BaseException:
        log(f"logs of the servers are kept in {log_dir}")
        raise
    if args.keep_logs:
        log(f"logs of the servers are in {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    print("\nTargets (issues 6, 9, 13, 19 and 20)")
    for target, verdict, figure in targets(results):
        print(f"  {'[' + verdict + ']':<15} {target}: {figure}")
    print(f"\n(took {time.monotonic() - started:.0f} s; load average at the end {load_average()})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
