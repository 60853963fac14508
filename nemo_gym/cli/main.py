"""``gym``: the command line. ``gym env start``, ``gym env test``, ``gym eval run``."""

from __future__ import annotations

import argparse
import sys

from nemo_gym.cli import env, eval as eval_cli
from nemo_gym.config import ConfigError
from nemo_gym.head import DEFAULT_HEAD_PORT
from nemo_gym.launcher import LaunchError


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


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """Which servers to run: config files, or the shortcut for one environment's trio."""
    parser.add_argument("--config", action="append", default=[], help="YAML config file; repeat to merge (later wins)")
    parser.add_argument("--resources-server", help="shortcut: run this resources server with a simple_agent and a model")
    parser.add_argument("--num-workers", type=positive_int, default=1, help="workers of the resources server (shortcut only)")
    parser.add_argument("--model-url", help="OpenAI-compatible base URL (shortcut only); default: the scripted backend")
    parser.add_argument("--model", help="model name to send to --model-url")
    parser.add_argument("--head-port", type=port_number, default=DEFAULT_HEAD_PORT, help="port of the head endpoint")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gym", description="Run and evaluate Gym environment servers.")
    groups = parser.add_subparsers(dest="group", required=True)

    env_parser = groups.add_parser("env", help="start or test environments").add_subparsers(dest="command", required=True)
    start = env_parser.add_parser("start", help="start every server of a config and keep them up until Ctrl-C")
    add_server_options(start)
    start.set_defaults(handler=env.start)
    test = env_parser.add_parser("test", help="run a resources server's tests and check its example data")
    test.add_argument("--resources-server", required=True)
    test.set_defaults(handler=env.test)

    eval_parser = groups.add_parser("eval", help="run rollouts").add_subparsers(dest="command", required=True)
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
    run.set_defaults(handler=eval_cli.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
