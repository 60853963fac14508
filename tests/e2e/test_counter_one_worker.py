"""The counter environment end to end at one worker: real processes, real HTTP, scripted policy."""

import subprocess
import sys

from nemo_gym.config import REPO_ROOT

DATA = REPO_ROOT / "resources_servers" / "example_session_state_mgmt" / "data" / "example.jsonl"


def test_demo_command_scores_every_episode_at_one_worker(tmp_path):
    output = tmp_path / "rollouts.jsonl"
    command = [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run",
        "--resources-server", "example_session_state_mgmt",
        "--input", str(DATA), "--num-repeats", "40", "--concurrency", "200", "--output", str(output),
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert finished.returncode == 0, finished.stderr
    assert '"1.0": 200' in finished.stdout
    assert len(output.read_text().splitlines()) == 200
    assert (tmp_path / "rollouts_aggregate_metrics.json").exists()
