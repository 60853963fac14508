"""Run counter episodes with the resources server at N workers and print the table row.

    python scripts/multiworker_report.py --workers 4 --episodes 200 [--client NAME] [--connections keep_alive]

The counter scenario drives the counter itself (seed i, +1, +2, get == i+3) with a standard client,
each keeping the session cookie its own way (--client; default aiohttp_jar, aiohttp with its own
cookie jar, what most Python callers use), or, with --client gym_agent, runs episodes through
simple_agent's /run with Gym's own client. Other scenarios (--scenario): mcp (or --mcp), counter sequences over /mcp by clients that keep only
the session token; swe_rebench, episodes through the legacy relay -> simple_agent -> swe_rebench
at N workers; memory_agent, two-turn conversations with memory_agent at N workers, where reward 1.0
means the second turn continued the first.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.client.rollouts import read_rows, run_episodes
from nemo_gym.config.presets import agent_name, environment_trio
from nemo_gym.process.launcher import Launcher
from resources_servers.example_session_state_mgmt.episodes import plus_one_plus_two
from resources_servers.example_session_state_mgmt.mcp_sequences import run_sequences
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS
from resources_servers.example_session_state_mgmt.standard_clients import run_episodes as run_client_episodes
from responses_api_agents.memory_agent.conversations import run_conversations

RESOURCES_SERVER = "example_session_state_mgmt"
SWE_REBENCH = "swe_rebench"
SWE_REBENCH_DIR = gym_config.REPO_ROOT / "resources_servers" / SWE_REBENCH
SWE_REBENCH_RELAY = "swe_rebench_legacy_agent"
MEMORY_AGENT = "memory_agent"
MEMORY_AGENT_CONFIG = gym_config.REPO_ROOT / "responses_api_agents" / MEMORY_AGENT / "configs" / "memory_agent.yaml"
GYM_AGENT = "gym_agent"


async def run_report(instances: dict, episodes: int, concurrency: int) -> list[dict]:
    rows = plus_one_plus_two(episodes)
    client = ReadingClient(instances)
    try:
        return await run_episodes(client, agent_name(RESOURCES_SERVER), rows, concurrency, progress=False)
    finally:
        await client.close()


def shipped_config(path: Path, server_type: str, instance: str, **settings) -> dict:
    """A shipped YAML config with these settings for ``instance`` (whose implementation has the same name)."""
    data, _ = gym_config.resolve([path])
    return gym_config.merge(data, {instance: {server_type: {instance: settings}}})


def counter_scenario(args: argparse.Namespace) -> tuple[str, list[dict], str]:
    if args.client == GYM_AGENT:
        config = environment_trio(RESOURCES_SERVER, args.workers)
    else:
        config = {RESOURCES_SERVER: {"resources_servers": {RESOURCES_SERVER: {"num_workers": args.workers}}}}
    config[RESOURCES_SERVER]["resources_servers"][RESOURCES_SERVER]["route_sessions"] = args.routing
    instances = gym_config.parse(config)
    with Launcher(instances, gym_config.free_port()):
        if args.client == GYM_AGENT:
            return "/run", asyncio.run(run_report(instances, args.episodes, args.concurrency)), ""
        fresh = args.connections == "fresh"
        url = instances[RESOURCES_SERVER].url
        results = asyncio.run(run_client_episodes(CLIENTS[args.client], url, list(range(args.episodes)), fresh, args.concurrency))
    return "counter", results, f"client {args.client}, {args.connections} connections"


def swe_rebench_scenario(args: argparse.Namespace) -> tuple[str, list[dict], str]:
    scratch = Path(tempfile.mkdtemp(prefix="swe_rebench_report_"))
    sandbox_dir = scratch / "sandboxes"  # the instance's sandbox root: made at start, removed at stop
    config = shipped_config(
        SWE_REBENCH_DIR / "configs" / "swe_rebench.yaml", "resources_servers", SWE_REBENCH,
        num_workers=args.workers, sandbox_dir=str(sandbox_dir), route_sessions=args.routing,
    )
    instances = gym_config.parse(config)
    rows = read_rows(SWE_REBENCH_DIR / "data" / "example.jsonl")
    rows = [rows[number % len(rows)] for number in range(args.episodes)]

    async def run() -> list[dict]:
        client = ReadingClient(instances)
        try:
            return await run_episodes(client, SWE_REBENCH_RELAY, rows, args.concurrency, progress=False)
        finally:
            await client.close()

    try:
        with Launcher(instances, gym_config.free_port()):
            results = asyncio.run(run())
            left_after_verify = len(list(sandbox_dir.glob("worker-*/sandbox-*")))
        left_after_stop = len(list(sandbox_dir.glob("worker-*/sandbox-*")))
        root_left = sandbox_dir.exists()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    graders = len({result["worker_pid"] for result in results if "worker_pid" in result})
    note = (
        f"graded by {graders} worker(s); sandboxes left after verify: {left_after_verify}, after stop: {left_after_stop}"
        f"; sandbox root {'still there' if root_left else 'removed'} after stop"
    )
    return SWE_REBENCH, results, note


def memory_agent_scenario(args: argparse.Namespace) -> tuple[str, list[dict], str]:
    instances = gym_config.parse(shipped_config(
        MEMORY_AGENT_CONFIG, "responses_api_agents", MEMORY_AGENT, num_workers=args.workers, route_sessions=args.routing
    ))

    async def run() -> list[dict]:
        client = ReadingClient(instances)
        try:
            return await run_conversations(client, MEMORY_AGENT, args.episodes, args.concurrency)
        finally:
            await client.close()

    with Launcher(instances, gym_config.free_port()):
        conversations = asyncio.run(run())
    return MEMORY_AGENT, [{**result, "reward": float(result["continued"])} for result in conversations], ""


def mcp_scenario(args: argparse.Namespace) -> tuple[str, list[dict], str]:
    settings = {"num_workers": args.workers, "expose_tools_over_mcp": True, "route_sessions": args.routing}
    instances = gym_config.parse({RESOURCES_SERVER: {"resources_servers": {RESOURCES_SERVER: settings}}})

    async def run() -> list[bool]:
        client = ReadingClient(instances)
        try:
            return await run_sequences(client, RESOURCES_SERVER, args.episodes)
        finally:
            await client.close()

    with Launcher(instances, gym_config.free_port()):
        right = asyncio.run(run())
    return "/mcp", [{"reward": float(ok)} for ok in right], ""


SCENARIOS = {"counter": counter_scenario, "mcp": mcp_scenario, "swe_rebench": swe_rebench_scenario, "memory_agent": memory_agent_scenario}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="counter")
    parser.add_argument("--mcp", action="store_const", dest="scenario", const="mcp", help="same as --scenario mcp")
    parser.add_argument("--client", choices=[*sorted(CLIENTS), GYM_AGENT], default="aiohttp_jar", help="counter scenario: who drives it")
    parser.add_argument("--connections", choices=["fresh", "keep_alive"], default="fresh", help="standard clients: a new connection per request, or kept alive")
    parser.add_argument("--no-routing", dest="routing", action="store_false", help="switch routing off (to see the bug)")
    args = parser.parse_args()

    label, results, note = SCENARIOS[args.scenario](args)
    good = sum(result.get("reward") == 1.0 for result in results)
    errors = sum("error" in result for result in results)
    print("scenario      workers  reward_1.0  reward_0.0  errors")
    print(f"{label:<12}  {args.workers:>7}  {good:>10}  {len(results) - good:>10}  {errors:>6}")
    if note:
        print(note)


if __name__ == "__main__":
    main()
