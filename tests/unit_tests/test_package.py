"""The ``nemo_gym`` package's own names, as upstream has them: its directories and the names it hands out lazily."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nemo_gym

REPO = Path(__file__).resolve().parents[2]


def test_in_a_checkout_caches_and_results_go_under_the_checkout():
    assert (nemo_gym.ROOT_DIR, nemo_gym.PARENT_DIR, nemo_gym.WORKING_DIR) == (REPO / "nemo_gym", REPO, REPO)
    assert (nemo_gym.CACHE_DIR, nemo_gym.RESULTS_DIR) == (REPO / "cache", REPO / "results")


def test_installed_outside_a_checkout_caches_and_results_go_under_the_current_directory(tmp_path):
    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "nemo_gym", site / "nemo_gym", ignore=shutil.ignore_patterns("__pycache__"))
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    code = "import nemo_gym; print(nemo_gym.PARENT_DIR); print(nemo_gym.CACHE_DIR); print(nemo_gym.RESULTS_DIR)"
    out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env={"PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [str(site), str(elsewhere / "cache"), str(elsewhere / "results")]


def test_the_package_hands_out_upstreams_openai_names():
    from nemo_gym.openai_utils import NeMoGymAsyncOpenAI, NeMoGymResponse

    assert (nemo_gym.NeMoGymAsyncOpenAI, nemo_gym.NeMoGymResponse) == (NeMoGymAsyncOpenAI, NeMoGymResponse)
    assert {"NeMoGymAsyncOpenAI", "CACHE_DIR", "RESULTS_DIR"} <= set(dir(nemo_gym))
