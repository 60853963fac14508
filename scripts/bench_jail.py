"""The cost of swe_rebench's jail: p50 and p90 of /seed_session and /run_command, jailed and unjailed, side by side.

Two swe_rebench instances run at once (one worker each): the shipped one, and one with
``unsafe_no_jail: true``. Each round seeds a new session on both and runs one command in each
session, alternating which goes first, so both see the same machine load.

    python -m scripts.bench_jail --rounds 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

from nemo_gym import config as gym_config
from nemo_gym.client.rollouts import read_rows
from nemo_gym.openai_utils import new_response
from nemo_gym.process.launcher import Launcher

DATA = Path(__file__).resolve().parents[1] / "resources_servers" / "swe_rebench" / "data" / "example.jsonl"
# A command that costs next to nothing (the jail's own cost shows), and the task's tests (a typical step).
COMMANDS = {"run_command true": "true", "run_command tests": "python3 -m unittest -q 2>/dev/null; git status --short"}
MODES = {"jailed": {}, "unjailed": {"unsafe_no_jail": True}}


def post(session: urllib.request.OpenerDirector, url: str, body: dict) -> float:
    """POST ``body`` as JSON in ``session`` (its cookie jar keeps the session); the milliseconds it took."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    started = time.perf_counter()
    with session.open(request, timeout=60) as reply:
        reply.read()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        config = {
            mode: {"resources_servers": {"swe_rebench": {"entrypoint": "app.py", "sandbox_dir": f"{scratch}/{mode}", **settings}}}
            for mode, settings in MODES.items()
        }
        launcher = Launcher(gym_config.parse(config), gym_config.free_port()).start()
        try:
            rows = read_rows(DATA)
            steps = ["seed_session", *COMMANDS]
            times: dict[tuple[str, str], list[float]] = {(mode, step): [] for mode in MODES for step in steps}
            for number in range(args.rounds):
                order = list(MODES) if number % 2 == 0 else list(reversed(MODES))
                for mode in order:
                    url = launcher.instances[mode].url
                    row = rows[number % len(rows)]
                    session = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
                    times[mode, "seed_session"].append(post(session, f"{url}/seed_session", row))
                    for step, command in COMMANDS.items():
                        times[mode, step].append(post(session, f"{url}/run_command", {"command": command}))
                    post(session, f"{url}/verify", {**row, "response": new_response().model_dump(mode="json")})
        finally:
            launcher.stop()
    print(f"{args.rounds} rounds, one worker each; " + "; ".join(f"{step} = {command!r}" for step, command in COMMANDS.items()))
    print(f"{'step':<20}{'jailed p50':>12}{'unjailed p50':>14}{'ratio':>8}{'jailed p90':>12}{'unjailed p90':>14}")
    for step in steps:
        jailed, unjailed = times["jailed", step], times["unjailed", step]
        p50 = statistics.median(jailed), statistics.median(unjailed)
        p90 = statistics.quantiles(jailed, n=10)[-1], statistics.quantiles(unjailed, n=10)[-1]
        print(f"{step:<20}{p50[0]:>10.1f}ms{p50[1]:>12.1f}ms{p50[0] / p50[1]:>7.2f}x{p90[0]:>10.1f}ms{p90[1]:>12.1f}ms")


if __name__ == "__main__":
    main()
