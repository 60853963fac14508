"""``gym eval run|prepare|aggregate|reverify|profile``: episodes through an agent's /run, benchmark data, shard
metrics, rewards recomputed, reward profiles."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nemo_gym import config as gym_config
from nemo_gym.evaluation.agent_metrics import metrics_by_agent, rollout_order, write_agent_metrics
from nemo_gym.evaluation.benchmarks import benchmarks_of, prepare_function, prepare as prepare_benchmark
from nemo_gym.cli.env import config_from_args, uses_config
from nemo_gym.cli.upstream_keys import gives_config_paths
from nemo_gym.client.reading import ReadingClient
from nemo_gym.config import Instance, free_port
from nemo_gym.process.head import fetch_instances
from nemo_gym.process.launcher import Launcher
from nemo_gym.evaluation.reward_profiling import completion, profile as profile_rewards, write_profile
from nemo_gym.evaluation.reverification import FAILURE_CLASS_KEY, done_rows, not_done, output_paths, reverify as reverify_rows, routes_of, unsafe_servers, verify_payloads
from nemo_gym.client.rollouts import read_jsonl, read_rows, run_episodes, write_results
from nemo_gym.config.paths import search_roots


def agents_of(instances: dict[str, Instance]) -> list[str]:
    return [name for name, instance in instances.items() if instance.server_type == "responses_api_agents"]


def pick_agent(instances: dict[str, Instance], requested: str | None) -> str:
    agents = agents_of(instances)
    if requested:
        if requested not in agents:
            raise ValueError(f"--agent: no agent named {requested!r}; agents: {', '.join(agents) or 'none'}")
        return requested
    if len(agents) != 1:
        raise ValueError(f"--agent: name one of the agents: {', '.join(agents) or 'none'}")
    return agents[0]


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[dict[str, Instance]]:
    """With a config (``--config``, ``+config_paths=[...]`` or ``--resources-server``) its servers, started here and stopped after;
    without one, the servers of a running ``gym env start`` (its head endpoint)."""
    if uses_config(args) or args.resources_server:
        settings, instances = config_from_args(args)
        with Launcher(instances, free_port(), start_timeout=args.start_timeout, settings=settings):
            yield instances
    else:
        yield fetch_instances(args.head_url or f"http://127.0.0.1:{args.head_port}")


async def evaluate(instances: dict[str, Instance], agent: str, rows: list[dict], args: argparse.Namespace) -> dict:
    client = ReadingClient(instances)
    try:
        results = await run_episodes(client, agent, rows, args.concurrency)
        metrics = await client.post(agent, "/aggregate_metrics", json={"verify_responses": results})
    finally:
        await client.close()
    if not metrics.ok:
        raise ValueError(f"{agent}/aggregate_metrics answered {metrics.status}: {metrics.text}")
    summary = {**metrics.body, "num_errors": sum("error" in result for result in results)}
    metrics_path = write_results(args.output, results, summary)
    print(json.dumps(summary, indent=2))
    print(f"rollouts: {args.output}\nmetrics: {metrics_path}")
    return summary


def run(args: argparse.Namespace) -> int:
    """Everything that can be checked (the rows, the agent's name) is checked before any server starts."""
    rows = read_rows(args.input, args.limit, args.num_repeats)
    if args.no_serve:
        instances = fetch_instances(args.head_url or f"http://127.0.0.1:{args.head_port}")
        asyncio.run(evaluate(instances, pick_agent(instances, args.agent), rows, args))
        return 0
    settings, instances = config_from_args(args)
    agent = pick_agent(instances, args.agent)
    with Launcher(instances, free_port(), start_timeout=args.start_timeout, settings=settings):
        asyncio.run(evaluate(instances, agent, rows, args))
    return 0


def benchmark_config(name: str, roots: list[Path]) -> Path:
    """``--benchmark N``: ``benchmarks/N/config.yaml``; ``N/FLAVOR``: ``benchmarks/N/FLAVOR.yaml``; first search root that has it."""
    relative = Path("benchmarks", name, "config.yaml") if "/" not in name else Path("benchmarks", f"{name}.yaml")
    for root in roots:
        if (root / relative).is_file():
            return root / relative
    raise ValueError(f"--benchmark {name}: no {relative.as_posix()} in the search roots: {', '.join(map(str, roots))}")


def prepare(args: argparse.Namespace) -> int:
    """Run the prepare script of every benchmark dataset of the config, after checking that each has one."""
    roots = search_roots(args.search_dir)
    paths = [*args.config, *([benchmark_config(args.benchmark, roots)] if args.benchmark else [])]
    if not paths and not gives_config_paths(args.overrides):
        raise ValueError("give --benchmark NAME or --config FILE")
    data, _ = gym_config.resolve(paths, args.overrides, roots)
    benchmarks = benchmarks_of(data, roots)
    if not benchmarks:
        raise ValueError("no benchmark config found: no agent of the config declares a dataset of type benchmark; pass one with --benchmark NAME")
    for benchmark in benchmarks:
        prepare_function(benchmark)
    arguments = data.get("prepare_script_args") or {}
    for benchmark in benchmarks:
        if args.use_cached and benchmark.jsonl_path.exists():
            print(f"{benchmark.dataset.name} has already been prepared ({benchmark.jsonl_path}); --use-cached skips it")
            continue
        print(f"Preparing benchmark: {benchmark.dataset.name}")
        print(f"Benchmark data prepared at: {prepare_benchmark(benchmark, arguments)}")
    return 0


def shard_paths(input_glob: str) -> list[str]:
    """The files a glob, or comma-separated globs, match: each once, in the order found."""
    patterns = [pattern.strip() for pattern in input_glob.split(",") if pattern.strip()]
    return list(dict.fromkeys(path for pattern in patterns for path in sorted(glob.glob(pattern))))


def read_results(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    for number, row in read_jsonl(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: a rollout is a JSON object")
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]], append: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w") as file:
        file.writelines(json.dumps(row) + "\n" for row in rows)


async def agent_metrics(instances: dict[str, Instance], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    client = ReadingClient(instances)
    try:
        return await metrics_by_agent(client, results, agents_of(instances))
    finally:
        await client.close()


def aggregate(args: argparse.Namespace) -> int:
    """Metrics over every shard together, from each agent's /aggregate_metrics; the shards merged into --output."""
    paths = shard_paths(args.input_glob)
    if not paths:
        raise ValueError(f"no shards matched input_glob={args.input_glob!r}")
    print(f"Aggregating {len(paths)} shard(s):" + "".join(f"\n  - {path}" for path in paths))
    results = sorted((row for path in paths for row in read_results(path)), key=rollout_order)
    print(f"Loaded {len(results)} rollout record(s) from {len(paths)} shard(s)")
    output = Path(args.output)
    if not args.no_merge_shards:
        write_jsonl(output, results)
    with servers(args) as instances:
        entries = asyncio.run(agent_metrics(instances, results))
    output.parent.mkdir(parents=True, exist_ok=True)
    metrics_path = write_agent_metrics(output, entries)
    print(f"Finished rollout aggregation! View results at:\nMerged rollouts: {output if not args.no_merge_shards else '<not merged>'}\nAggregate metrics: {metrics_path}")
    return 0


async def reverify_on(instances: dict[str, Instance], payloads: list[dict[str, Any]], args: argparse.Namespace) -> None:
    routes = routes_of(instances)
    client = ReadingClient(instances)
    try:
        unsafe = await unsafe_servers(client, routes.servers())
        if unsafe and not args.force:
            raise ValueError(
                f"resources server(s) {unsafe} have reverify_mode unknown or unsupported: their /verify may not give a stored rollout's "
                "reward again. Pass --force to re-verify anyway (the output files are then prefixed with unsafe_)"
            )
        if unsafe:
            print(f"WARNING: resources server(s) {unsafe} have reverify_mode unknown or unsupported; rewards may be wrong. Output is prefixed with 'unsafe_'.")
        output, failures = output_paths(args.output, "unsafe_" if unsafe else "", args.overwrite, args.resume)
        done = done_rows(output) if args.resume else []
        if args.resume:
            print(f"Resuming: {len(done)} rollout(s) already in {output}")
        results = await reverify_rows(client, not_done(payloads, done), routes, args.concurrency)
        successes = [row for row in results if row.get(FAILURE_CLASS_KEY) is None]
        write_jsonl(output, successes, append=True)
        write_jsonl(failures, [row for row in results if row.get(FAILURE_CLASS_KEY) is not None], append=True)
        print(f"Re-verified {len(results)} rollout(s): {output}")
        if not args.disable_aggregation:
            metrics_path = write_agent_metrics(output, await metrics_by_agent(client, done + successes, agents_of(instances)))
            print(f"Aggregate metrics: {metrics_path}")
    finally:
        await client.close()


def reverify(args: argparse.Namespace) -> int:
    """Recompute the rewards of stored rollouts; the files are read and joined before any server starts."""
    payloads = verify_payloads(Path(args.inputs), Path(args.rollouts), args.limit)
    with servers(args) as instances:
        asyncio.run(reverify_on(instances, payloads, args))
    return 0


def profile(args: argparse.Namespace) -> int:
    """Statistics per task and per agent of a collection's rollouts, from files alone (no server)."""
    for path, flag in ((args.inputs, "--inputs"), (args.rollouts, "--rollouts")):
        if not Path(path).is_file():
            raise ValueError(f"input file not found: '{path}' ({flag})")
    rows, results = read_results(args.inputs), read_results(args.rollouts)
    tasks, agents = profile_rewards(rows, results, args.allow_partial_rollouts)
    done = completion(rows, results)
    profiling, agent_metrics = write_profile(Path(args.rollouts), tasks, agents)
    print(
        f"Reward profile completion: {done['completed_rollout_rows']}/{done['expected_rollout_rows']} rollout rows ({done['reward_profile_completion_pct']:.2f}%)\n"
        f"Input rows: {done['total_input_rows']} total; {done['complete_input_rows']} complete; {done['partial_input_rows']} partial; "
        f"{done['missing_input_rows']} without rollouts dropped from output.\n"
        f"Reward profiling outputs: {profiling}\nAgent-level metrics: {agent_metrics}"
    )
    return 0
