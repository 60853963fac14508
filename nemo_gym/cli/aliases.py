"""Upstream's command names: each ``ng_*`` / ``nemo_gym_*`` console script (``sys.argv[0]``) runs the
``gym`` command it stands for, with the arguments it was given; one with no ``gym`` command here is an error."""

from __future__ import annotations

import sys
from pathlib import Path

from nemo_gym.cli.main import main as gym_main

# Upstream's alias, its prefix dropped, and the ``gym`` command it runs (upstream's own mapping).
ALIASES = {
    "run": ["env", "start"],
    "test": ["env", "test"],
    "init_resources_server": ["env", "init"],
    "collect_rollouts": ["eval", "run", "--no-serve"],
    "e2e_collect_rollouts": ["eval", "run"],
    "dump_config": ["env", "resolve"],
    "list_benchmarks": ["list", "benchmarks"],
    "prepare_benchmark": ["eval", "prepare"],
    "aggregate_rollouts": ["eval", "aggregate"],
    "reward_profile": ["eval", "profile"],
    "materialize_prompts": ["dataset", "render"],
    "prepare_data": ["dataset", "collate"],
    "upload_dataset_to_gitlab": ["dataset", "upload", "--storage", "gitlab"],
    "download_dataset_from_gitlab": ["dataset", "download", "--storage", "gitlab"],
    "upload_dataset_to_hf": ["dataset", "upload"],
    "download_dataset_from_hf": ["dataset", "download"],
    "gitlab_to_hf_dataset": ["dataset", "migrate"],
    "delete_dataset_from_gitlab": ["dataset", "rm"],
    "validate": ["env", "validate"],
    "status": ["env", "status"],
    "help": ["--help"],
    "version": ["--version"],
}


def main() -> int:
    alias = Path(sys.argv[0]).name
    tokens = ALIASES.get(alias.removeprefix("nemo_gym_").removeprefix("ng_"))
    if tokens is None:
        print(f"{alias}: no `gym` command here stands for it; see `gym --help`", file=sys.stderr)
        return 2
    return gym_main([*tokens, *sys.argv[1:]])
