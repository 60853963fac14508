"""A server whose app.py imports a module of its own directory bare (tests/upstream_style/resources_servers/
upstream_siblings), started as real processes at one worker and at two."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from nemo_gym import config as gym_config
from nemo_gym.config.paths import search_roots
from nemo_gym.process import discovery
from nemo_gym.process.launcher import Launcher

ROOT = Path(__file__).resolve().parents[1] / "upstream_style"
SERVER_DIR = ROOT / "resources_servers" / "upstream_siblings"
WORKERS = {"siblings_one": 1, "siblings_two": 2}


@pytest.fixture(scope="module")
def launcher() -> Iterator[Launcher]:
    data = {name: {"resources_servers": {"upstream_siblings": {"num_workers": workers}}} for name, workers in WORKERS.items()}
    instances = gym_config.parse(data)
    discovery.check_settings(instances, search_roots([ROOT]))
    launcher = Launcher(instances, gym_config.free_port()).start(timeout=180)
    try:
        yield launcher
    finally:
        launcher.stop()


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_an_app_that_imports_a_sibling_module_bare_serves_with_it(launcher, name):
    url = f"{launcher.instances[name].url}/score"
    for answer, reward in (("Paris", 1.0), ("Lyon", 0.0)):
        reply = requests.post(url, json={"answer": answer, "expected": "paris"}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"reward": reward, "scorer_file": str(SERVER_DIR / "scorer.py")}
