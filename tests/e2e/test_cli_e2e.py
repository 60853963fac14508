"""The `gym` command as a user runs it: real processes on free loopback ports, stopped by their PIDs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from nemo_gym.config import REPO_ROOT, free_port

COUNTER = "example_session_state_mgmt"
DATA = REPO_ROOT / "resources_servers" / COUNTER / "data" / "example.jsonl"
START_TIMEOUT_SECONDS = 120
STOP_TIMEOUT_SECONDS = 60
CONFIG = f"""
counter:
  resources_servers:
    {COUNTER}:
      num_workers: 2
      domain: games
      description: A counter kept per session
counter_agent:
  responses_api_agents:
    simple_agent:
      resources_server: {{type: resources_servers, name: counter}}
      model_server: {{type: responses_api_models, name: policy_model}}
policy_model:
  responses_api_models:
    vllm_model:
      backend_server: {{type: responses_api_models, name: scripted_backend}}
      model: scripted
scripted_backend:
  responses_api_models:
    scripted_backend: {{}}
"""


def gym(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "nemo_gym.cli.main", *arguments]


def process_state(pid: int) -> tuple[int, str] | None:
    """(parent PID, state) of a live process, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[1]), fields[0]


def alive(pid: int) -> bool:
    state = process_state(pid)
    return state is not None and state[1] not in ("Z", "X")


def descendants(root: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (state := process_state(int(entry))) is not None:
            parents[int(entry)] = state[0]
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@dataclass
class EnvStart:
    """A running `gym env start`: its process, what it printed, and every process it started."""

    process: subprocess.Popen
    head_url: str
    lines: list[str] = field(default_factory=list)
    started: set[int] = field(default_factory=set)

    def table(self) -> dict[str, list[str]]:
        end = next(i for i, line in enumerate(self.lines) if line.startswith("All servers are up"))
        header, *rows = [line.split() for line in self.lines[:end] if line.strip()]
        assert header == ["name", "type", "address", "workers"]
        return {row[0]: row[1:] for row in rows}

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=STOP_TIMEOUT_SECONDS)


def start_env(config_path: Path, stderr_path: Path) -> EnvStart:
    head_port = free_port()
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(
            gym("env", "start", "--config", str(config_path), "--head-port", str(head_port)),
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
        )
    env = EnvStart(process, f"http://127.0.0.1:{head_port}")
    ready = threading.Event()

    def read_stdout() -> None:
        for line in process.stdout:
            env.lines.append(line.rstrip("\n"))
            if line.startswith("All servers are up"):
                ready.set()
        ready.set()

    threading.Thread(target=read_stdout, daemon=True).start()
    if not ready.wait(START_TIMEOUT_SECONDS) or process.poll() is not None:
        stop_env(env)
        pytest.fail(f"gym env start did not come up:\n{chr(10).join(env.lines)}\n{stderr_path.read_text()}")
    env.started = descendants(process.pid)
    return env


def stop_env(env: EnvStart) -> None:
    """SIGTERM, then SIGKILL each leftover process by its own PID (only if the test already failed)."""
    if env.process.poll() is None:
        try:
            env.terminate()
        except subprocess.TimeoutExpired:
            env.process.kill()
            env.process.wait(timeout=STOP_TIMEOUT_SECONDS)
    for pid in env.started | descendants(env.process.pid):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


@pytest.fixture(scope="module")
def running_env(tmp_path_factory) -> Iterator[EnvStart]:
    directory = tmp_path_factory.mktemp("env_start")
    config_path = directory / "counter.yaml"
    config_path.write_text(CONFIG)
    env = start_env(config_path, directory / "stderr.log")
    try:
        yield env
    finally:
        stop_env(env)


def test_env_test_passes_for_the_counter_environment():
    finished = subprocess.run(
        gym("env", "test", "--resources-server", COUNTER), capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "5 of 5 rows match the request models" in finished.stdout


def test_env_start_prints_the_table_answers_and_stops_every_process_on_sigterm(tmp_path):
    config_path = tmp_path / "counter.yaml"
    config_path.write_text(CONFIG)
    env = start_env(config_path, tmp_path / "stderr.log")
    try:
        table = env.table()
        assert set(table) == {"counter", "counter_agent", "policy_model", "scripted_backend", "head"}
        assert table["counter"] == ["resources_servers", table["counter"][1], "2"]
        assert table["head"] == ["-", env.head_url, "1"]
        for name, (_, address, _) in table.items():
            assert get_json(f"{address}/") == {"status": "ok"}, name
        # Four servers, the head, and the counter's two uvicorn workers, at least.
        assert len(env.started) >= 7

        assert env.terminate() == 0
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while any(alive(pid) for pid in env.started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in env.started if alive(pid)] == []
    finally:
        stop_env(env)


def test_eval_run_no_serve_uses_the_servers_of_a_running_env_start(running_env, tmp_path):
    output = tmp_path / "rollouts.jsonl"
    arguments = ["eval", "run", "--no-serve", "--head-url", running_env.head_url, "--input", str(DATA), "--num-repeats", "2"]
    finished = subprocess.run(gym(*arguments, "--output", str(output)), capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert finished.returncode == 0, finished.stderr
    assert '"1.0": 10' in finished.stdout
    assert len(output.read_text().splitlines()) == 10
    metrics = json.loads((tmp_path / "rollouts_aggregate_metrics.json").read_text())
    assert (metrics["num_episodes"], metrics["mean_reward"], metrics["num_errors"]) == (10, 1.0, 0)


def test_the_head_endpoint_shows_upstreams_catalog_keys(running_env):
    settings = get_json(f"{running_env.head_url}/global_config")["counter"]["resources_servers"][COUNTER]
    assert (settings["domain"], settings["description"]) == ("games", "A counter kept per session")


def test_eval_run_with_a_bad_agent_name_gives_a_clear_error(running_env, tmp_path):
    arguments = ["eval", "run", "--no-serve", "--head-url", running_env.head_url, "--agent", "counter_agnet", "--input", str(DATA)]
    finished = subprocess.run(
        gym(*arguments, "--output", str(tmp_path / "out.jsonl")), capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    assert finished.returncode == 2
    assert "gym: error: --agent: no agent named 'counter_agnet'; agents: counter_agent" in finished.stderr
    assert "Traceback" not in finished.stderr


BENCHMARK = "counter_benchmark"
# A benchmark config written the upstream way: it takes the counter environment's blocks from the
# environment's own config and renames them; the local keys win over the inherited ones.
BENCHMARK_CONFIG = f"""
config_paths:
  - resources_servers/{COUNTER}/configs/{COUNTER}.yaml
{BENCHMARK}_resources_server:
  _inherit_from: {COUNTER}
  resources_servers:
    {COUNTER}:
      num_workers: 1
      domain: games
{BENCHMARK}_simple_agent:
  _inherit_from: {COUNTER}_simple_agent
  responses_api_agents:
    simple_agent:
      resources_server:
        name: {BENCHMARK}_resources_server
"""


def test_a_benchmark_config_that_inherits_the_counter_starts_it_under_its_new_name_and_serves_sessions(tmp_path):
    config_path = tmp_path / "benchmark.yaml"
    config_path.write_text(BENCHMARK_CONFIG)
    env = start_env(config_path, tmp_path / "stderr.log")
    try:
        table = env.table()
        assert set(table) == {f"{BENCHMARK}_resources_server", f"{BENCHMARK}_simple_agent", "policy_model", "scripted_backend", "head"}
        assert table[f"{BENCHMARK}_resources_server"][2] == "1"
        counter_url, agent_url = table[f"{BENCHMARK}_resources_server"][1], table[f"{BENCHMARK}_simple_agent"][1]
        with requests.Session() as session:
            assert session.post(f"{counter_url}/seed_session", json={"initial_count": 1}, timeout=30).status_code == 200
            for count in (2, 3):
                assert session.post(f"{counter_url}/increment_counter", json={"count": count}, timeout=30).json() == {"success": True}
            assert session.post(f"{counter_url}/get_counter_value", json={}, timeout=30).json() == {"count": 6}
        row = json.loads(DATA.read_text().splitlines()[0])
        assert requests.post(f"{agent_url}/run", json=row, timeout=120).json()["reward"] == 1.0
    finally:
        stop_env(env)


def test_env_start_with_a_directive_cycle_names_the_file_and_key_and_starts_nothing(tmp_path):
    config_path = tmp_path / "cycle.yaml"
    config_path.write_text(
        f"counter_a:\n  _inherit_from: counter_b\n  resources_servers: {{{COUNTER}: {{}}}}\n"
        f"counter_b:\n  _inherit_from: counter_a\n  resources_servers: {{{COUNTER}: {{}}}}\n"
    )
    arguments = ["env", "start", "--config", str(config_path), "--head-port", str(free_port())]
    finished = subprocess.run(gym(*arguments), capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert finished.returncode == 2
    assert f"gym: error: {config_path}: counter_a._inherit_from: " in finished.stderr
    assert "counter_a -> counter_b -> counter_a" in finished.stderr
    assert "Traceback" not in finished.stderr
    assert finished.stdout == ""


SCAFFOLD = "demo_env"
# Outside the repository's directory, `python -m nemo_gym...` must still import this checkout.
GYM_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def scaffold_root(tmp_path_factory) -> Path:
    """A directory outside the repository holding a server made by `gym env init`."""
    root = tmp_path_factory.mktemp("outside_repo")
    finished = subprocess.run(gym("env", "init", SCAFFOLD), capture_output=True, text=True, timeout=60, cwd=root, env=GYM_ENV)
    assert finished.returncode == 0, finished.stderr
    return root


def test_env_init_scaffold_passes_env_test_by_name_from_its_root(scaffold_root):
    finished = subprocess.run(
        gym("env", "test", "--resources-server", SCAFFOLD), capture_output=True, text=True, timeout=300, cwd=scaffold_root, env=GYM_ENV
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "5 of 5 rows match the request models" in finished.stdout
    assert "1 passed" in finished.stdout


def test_env_test_takes_a_server_outside_the_repository_by_path(scaffold_root):
    directory = scaffold_root / "resources_servers" / SCAFFOLD
    finished = subprocess.run(
        gym("env", "test", "--resources-server", str(directory)), capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "1 passed" in finished.stdout


def test_a_server_found_with_search_dir_runs_from_there_and_the_scaffold_scores_every_episode_at_4_workers(scaffold_root, tmp_path):
    config = scaffold_root / "resources_servers" / SCAFFOLD / "configs" / f"{SCAFFOLD}.yaml"
    data = scaffold_root / "resources_servers" / SCAFFOLD / "data" / "example.jsonl"
    output = tmp_path / "rollouts.jsonl"
    arguments = ["eval", "run", "--config", str(config), "--search-dir", str(scaffold_root), "--input", str(data)]
    arguments += ["--num-repeats", "40", "--concurrency", "200", "--output", str(output)]
    arguments += [f"{SCAFFOLD}.resources_servers.{SCAFFOLD}.num_workers=4"]
    finished = subprocess.run(gym(*arguments), capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert finished.returncode == 0, finished.stderr
    metrics = json.loads((tmp_path / "rollouts_aggregate_metrics.json").read_text())
    assert (metrics["num_episodes"], metrics["reward_counts"], metrics["num_errors"]) == (200, {"1.0": 200}, 0)


def test_a_server_outside_the_repository_without_search_dir_is_an_error_listing_where_it_looked(scaffold_root, tmp_path):
    config = scaffold_root / "resources_servers" / SCAFFOLD / "configs" / f"{SCAFFOLD}.yaml"
    finished = subprocess.run(
        gym("env", "resolve", "--config", str(config)), capture_output=True, text=True, timeout=60, cwd=tmp_path, env=GYM_ENV
    )
    assert finished.returncode == 2
    assert f"no implementation directory resources_servers/{SCAFFOLD}; looked in" in finished.stderr
    assert f"\n  {tmp_path / 'resources_servers' / SCAFFOLD}" in finished.stderr
    assert "Traceback" not in finished.stderr
