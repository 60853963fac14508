"""``gym eval run``: episodes through an agent's /run, a progress bar, rewards, files."""

from __future__ import annotations

import argparse
import asyncio
import json

from nemo_gym.cli.env import instances_from_args
from nemo_gym.client.reading import ReadingClient
from nemo_gym.client.rollouts import read_rows, run_episodes, write_results
from nemo_gym.config import Instance, free_port
from nemo_gym.process.head import fetch_instances
from nemo_gym.process.launcher import Launcher


def pick_agent(instances: dict[str, Instance], requested: str | None) -> str:
    agents = [name for name, instance in instances.items() if instance.server_type == "responses_api_agents"]
    if requested:
        if requested not in agents:
            raise ValueError(f"--agent: no agent named {requested!r}; agents: {', '.join(agents) or 'none'}")
        return requested
    if len(agents) != 1:
        raise ValueError(f"--agent: name one of the agents: {', '.join(agents) or 'none'}")
    return agents[0]


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
    instances = instances_from_args(args)
    agent = pick_agent(instances, args.agent)
    with Launcher(instances, free_port(), start_timeout=args.start_timeout):
        asyncio.run(evaluate(instances, agent, rows, args))
    return 0
