"""``gym``: the command line. ``gym env start|test|resolve|validate|status|init``, ``gym eval run|prepare|aggregate|reverify|profile``, ``gym dataset``, ``gym list [KIND]``, ``gym sessions``."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Callable

from nemo_gym.cli import dataset, servers, sessions
from nemo_gym.cli.upstream_keys import as_flags
from nemo_gym.config import ConfigError
from nemo_gym.env import DEFAULT_HEAD_PORT
from nemo_gym.process.launcher import LaunchError


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds greater than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds greater than 0, got {text}")
    return value


def add_search_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--search-dir", action="append", default=[], help="also look for <server_type>/<name>/ here, before NEMO_GYM_EXTRA_ROOTS, the working directory and the install root; repeatable"
    )


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """Which config: files, or the shortcut for one environment's trio; search roots; key overrides."""
    parser.add_argument("--config", action="append", default=[], help="YAML config file; repeat to merge (later wins)")
    parser.add_argument("--resources-server", help="shortcut: run this resources server with a simple_agent and a model")
    parser.add_argument("--num-workers", type=positive_int, default=1, help="workers of the resources server (shortcut only)")
    parser.add_argument("--model-url", help="OpenAI-compatible base URL; with --config it sets policy_base_url; default: the scripted backend")
    parser.add_argument("--model", help="model name to send to --model-url; with --config it sets policy_model_name")
    parser.add_argument("--model-api-key", help="with --config, sets policy_api_key")
    add_search_dir(parser)
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="set a config key (it must exist); +KEY=VALUE or ++KEY=VALUE sets or adds it"
    )


def add_server_options(parser: argparse.ArgumentParser) -> None:
    add_config_options(parser)
    parser.add_argument("--head-port", type=port_number, default=DEFAULT_HEAD_PORT, help="port of the head endpoint")
    parser.add_argument(
        "--start-timeout",
        type=positive_seconds,
        metavar="SECONDS",
        help="how long every server and worker may take to start serving (default: 60 + 10 per worker of the config)",
    )


def add_running_servers_options(parser: argparse.ArgumentParser) -> None:
    """A config whose servers the command starts and stops, or, without one, the servers of a running ``gym env start``."""
    add_server_options(parser)
    parser.add_argument("--head-url", help="without a config: head endpoint of the running servers (default: http://127.0.0.1:HEAD_PORT)")


def installed_version() -> str:
    """This package's version as installed (``unknown`` when it runs from a checkout that is not)."""
    try:
        return importlib.metadata.version("nemo-gym-multiworker")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def handler(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The command ``name`` of ``nemo_gym.cli.MODULE``, imported when it runs: ``env`` and ``eval`` import the servers'
    and the rollouts' code (about a second of CPU), which every other command (``gym sessions`` in a script, say) would
    pay for nothing."""

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"nemo_gym.cli.{module}"), name)(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gym", description="Run and evaluate Gym environment servers.")
    parser.add_argument("--version", action="version", version=f"gym {installed_version()}")
    groups = parser.add_subparsers(dest="group", required=True)

    env_parser = groups.add_parser("env", help="start, test, check and inspect environments; the status of running servers").add_subparsers(dest="command", required=True)
    start = env_parser.add_parser("start", help="start every server of a config and keep them up until Ctrl-C")
    add_server_options(start)
    start.set_defaults(handler=handler("env", "start"))
    test = env_parser.add_parser("test", help="run a resources server's tests and check its example data")
    test.add_argument("--resources-server", help="a name found in the search roots, or the server's directory")
    test.add_argument("overrides", nargs="*", metavar="+entrypoint=resources_servers/NAME", help="upstream's form of --resources-server")
    add_search_dir(test)
    test.set_defaults(handler=handler("env", "test"))
    resolve = env_parser.add_parser("resolve", help="print the merged, interpolated config as YAML (credentials redacted)")
    add_config_options(resolve)
    resolve.set_defaults(handler=handler("env", "resolve"))
    check = env_parser.add_parser("validate", help="check a config as `env start` would, without starting a server")
    check.add_argument("workload", nargs="?", metavar="NAME", help="upstream's manifest-backed workload (not supported here)")
    add_config_options(check)
    check.set_defaults(handler=handler("env", "validate"))
    state = env_parser.add_parser("status", help="the servers of a running `gym env start` and whether each answers")
    state.add_argument("--json", action="store_true", help="one JSON list: process_name, server_type, name, host, port, url, num_workers, status")
    state.add_argument("--head-url", help="head endpoint of that run (default: http://127.0.0.1:HEAD_PORT)")
    state.add_argument("--head-port", type=port_number, default=DEFAULT_HEAD_PORT, help="port of the head endpoint")
    state.set_defaults(handler=handler("env", "status"))
    init = env_parser.add_parser("init", help="make a new resources server: app, config, example data, tests, README")
    init.add_argument("name")
    init.add_argument("--dir", default=".", help="write DIR/resources_servers/NAME/ (default: the working directory)")
    init.set_defaults(handler=handler("env", "init"))

    eval_parser = groups.add_parser("eval", help="run rollouts, prepare benchmarks, aggregate and re-verify rollouts").add_subparsers(dest="command", required=True)
    run = eval_parser.add_parser("run", help="run episodes through an agent's /run and report rewards")
    add_server_options(run)
    run.add_argument("--agent", help="agent instance name (default: the only agent in the config)")
    run.add_argument("--input", required=True, help="JSONL of task rows")
    run.add_argument("--output", required=True, help="JSONL to write rollouts to")
    run.add_argument("--num-repeats", type=positive_int, default=1)
    run.add_argument("--limit", type=positive_int, help="use only the first L rows")
    run.add_argument("--concurrency", type=positive_int, default=64)
    run.add_argument("--no-serve", action="store_true", help="use the servers of a running `gym env start`")
    run.add_argument("--head-url", help="head endpoint of that run (default: http://127.0.0.1:HEAD_PORT)")
    run.set_defaults(handler=handler("eval", "run"))
    prepare = eval_parser.add_parser("prepare", help="run the prepare script of each benchmark dataset of a config, writing its JSONL")
    prepare.add_argument("--config", action="append", default=[], help="YAML config file; repeat to merge (later wins)")
    prepare.add_argument("--benchmark", help="shortcut: the config benchmarks/NAME/config.yaml (NAME/FLAVOR: benchmarks/NAME/FLAVOR.yaml)")
    prepare.add_argument("--use-cached", action="store_true", help="skip a benchmark whose JSONL already exists")
    add_search_dir(prepare)
    prepare.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="+prepare_script_args.NAME=VALUE passes NAME to prepare()")
    prepare.set_defaults(handler=handler("eval", "prepare"))
    aggregate = eval_parser.add_parser("aggregate", help="metrics over rollout shards from each agent's /aggregate_metrics; the shards merged")
    add_running_servers_options(aggregate)
    aggregate.add_argument("--input-glob", "-i", required=True, help="glob, or comma-separated globs, of the rollout shards")
    aggregate.add_argument("--output", "-o", required=True, help="merged rollouts JSONL; the metrics go beside it as <stem>_aggregate_metrics.json")
    aggregate.add_argument("--no-merge-shards", action="store_true", help="write only the metrics")
    aggregate.set_defaults(handler=handler("eval", "aggregate"))
    reverify = eval_parser.add_parser("reverify", help="recompute the rewards of stored rollouts with their resources server's /verify")
    add_running_servers_options(reverify)
    reverify.add_argument("--inputs", required=True, help="materialized inputs JSONL (rows with _ng_task_index and _ng_rollout_index)")
    reverify.add_argument("--rollouts", required=True, help="rollouts JSONL to re-verify")
    reverify.add_argument("--output", "-o", required=True, help="JSONL of the recomputed results; failures go to <stem>_failures.jsonl")
    reverify.add_argument("--concurrency", type=positive_int, help="most /verify calls at once (default: all)")
    reverify.add_argument("--limit", type=positive_int, help="re-verify only the first L rollouts")
    reverify.add_argument("--force", action="store_true", help="re-verify with servers whose reverify mode is unknown or unsupported (files prefixed unsafe_)")
    reverify.add_argument("--overwrite", action="store_true", help="delete an existing output instead of refusing")
    reverify.add_argument("--resume", action="store_true", help="keep an existing output and re-verify only the rollouts it lacks")
    reverify.add_argument("--disable-aggregation", action="store_true", help="skip the aggregate metrics file")
    reverify.set_defaults(handler=handler("eval", "reverify"))
    profiling = eval_parser.add_parser("profile", help="statistics per task and per agent of a collection's rollouts, from the files alone")
    profiling.add_argument("--inputs", required=True, help="materialized inputs JSONL that rollout collection was fed")
    profiling.add_argument("--rollouts", required=True, help="rollouts JSONL it wrote; the profile goes beside it")
    profiling.add_argument("--allow-partial-rollouts", action="store_true", help="profile a partial collection (inputs without a rollout)")
    profiling.set_defaults(handler=handler("eval", "profile"))

    servers.add_commands(groups, add_search_dir)
    dataset.add_commands(groups, add_search_dir)
    sessions.add_commands(groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(as_flags(sys.argv[1:] if argv is None else argv))
    if unknown and not getattr(args, "takes_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.handler(args)
    except (ConfigError, ValueError, ConnectionError) as error:
        print(f"gym: error: {error}", file=sys.stderr)
        return 2
    except LaunchError as error:
        print(f"gym: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
