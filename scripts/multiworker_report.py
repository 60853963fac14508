"""Run counter episodes through /run with the resources server at N workers and print the table row.

    python scripts/multiworker_report.py --workers 4 --episodes 200
"""

from __future__ import annotations

import argparse
import asyncio
import itertools

from nemo_gym import config as gym_config
from nemo_gym.client import ServerClient
from nemo_gym.launcher import Launcher
from nemo_gym.presets import agent_name, environment_trio
from nemo_gym.rollouts import read_rows, run_episodes

RESOURCES_SERVER = "example_session_state_mgmt"
DATA = gym_config.REPO_ROOT / "resources_servers" / RESOURCES_SERVER / "data" / "example.jsonl"


def counter_row(row: dict, seed: int) -> dict:
    """The first example task (+1 then +2) with its own start, so episodes are distinguishable."""
    return {**row, "initial_count": seed, "expected_count": seed + 3}


async def run_report(instances: dict, episodes: int, concurrency: int) -> list[dict]:
    row = read_rows(DATA, limit=1)[0]
    rows = [counter_row(row, seed) for seed in itertools.islice(itertools.count(), episodes)]
    client = ServerClient(instances)
    try:
        return await run_episodes(client, agent_name(RESOURCES_SERVER), rows, concurrency, progress=False)
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=200)
    args = parser.parse_args()

    instances = gym_config.parse(environment_trio(RESOURCES_SERVER, args.workers))
    with Launcher(instances, gym_config.free_port()):
        results = asyncio.run(run_report(instances, args.episodes, args.concurrency))
    good = sum(result.get("reward") == 1.0 for result in results)
    errors = sum("error" in result for result in results)
    print("scenario  workers  reward_1.0  reward_0.0  errors")
    print(f"/run      {args.workers:>7}  {good:>10}  {len(results) - good:>10}  {errors:>6}")


if __name__ == "__main__":
    main()
