"""``gym dataset render|collate`` on local files; upstream's ``upload``, ``download``, ``rm`` and ``migrate`` need
the Hugging Face hub or NVIDIA's GitLab, and say so."""

from __future__ import annotations

import argparse
from pathlib import Path

from nemo_gym import config as gym_config
from nemo_gym.cli.upstream_keys import gives_config_paths
from nemo_gym.config.paths import search_roots
from nemo_gym.datasets import MODES

HUB_COMMANDS = {
    "upload": "uploads a dataset to the Hugging Face hub or GitLab",
    "download": "downloads a dataset from the Hugging Face hub or GitLab",
    "rm": "deletes a dataset from GitLab",
    "migrate": "moves a dataset from GitLab to the Hugging Face hub",
}


def render(args: argparse.Namespace) -> int:
    """Write the input rows with the prompt template filled into each ``responses_create_params.input``."""
    # Here, not at the top: what the datasets' code imports (the servers' types) is for these commands only, not for
    # every ``gym`` command, which builds this one's parser.
    from nemo_gym.prompt import materialize_prompts

    materialize_prompts(args.input, args.prompt_config, args.output)
    print(f"rendered {args.input} with {args.prompt_config}: {args.output}")
    return 0


def collate(args: argparse.Namespace) -> int:
    from nemo_gym.datasets.collation import collate as collate_datasets  # as ``render``'s import

    if not args.config and not gives_config_paths(args.overrides):
        raise ValueError("give --config FILE")
    roots = search_roots(args.search_dir)
    data, _ = gym_config.resolve(args.config, args.overrides, roots)
    collated = collate_datasets(data, roots, args.mode, Path(args.output_dir), args.download, args.overwrite_metrics_conflicts)
    print("View your final data!" + "".join(f"\n- {kind}: {path}" for kind, path in collated.items()))
    return 0


def not_available(args: argparse.Namespace) -> int:
    raise ValueError(f"gym dataset {args.command} is not available here: it {HUB_COMMANDS[args.command]}, over the network")


def add_commands(groups: argparse._SubParsersAction, add_search_dir) -> None:
    parser = groups.add_parser("dataset", help="render prompts into a dataset, validate and collate datasets").add_subparsers(dest="command", required=True)
    rendering = parser.add_parser("render", help="fill a prompt template into each row's responses_create_params.input")
    rendering.add_argument("--input", "-i", required=True, help="raw input JSONL")
    rendering.add_argument("--prompt-config", required=True, help="prompt template YAML (user, optional system)")
    rendering.add_argument("--output", "-o", required=True, help="JSONL to write")
    rendering.set_defaults(handler=render)
    collating = parser.add_parser("collate", help="check the datasets a config's agents declare, write their metrics, collate them per type")
    collating.add_argument("--config", action="append", default=[], help="YAML config file; repeat to merge (later wins)")
    collating.add_argument("--mode", choices=sorted(MODES), required=True, help="train_preparation: train, validation, benchmark; example_validation: example")
    collating.add_argument("--output-dir", required=True, help="directory for <type>.jsonl and <type>_metrics.json")
    collating.add_argument("--download", action="store_true", help="download missing datasets (not available here)")
    collating.add_argument("--overwrite-metrics-conflicts", action="store_true", help="replace metrics files that disagree with the rows")
    add_search_dir(collating)
    collating.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="set a config key; +KEY=VALUE or ++KEY=VALUE sets or adds it")
    collating.set_defaults(handler=collate)
    for name, summary in HUB_COMMANDS.items():
        hub = parser.add_parser(name, help=f"upstream's command that {summary} (not available here)")
        # Upstream's options for it are taken as they come, to reach the message above.
        hub.set_defaults(handler=not_available, takes_any_arguments=True)
