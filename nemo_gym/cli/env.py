"""``gym env start`` and ``gym env test``."""

from __future__ import annotations

import argparse
import importlib
import inspect
import signal
import subprocess
import sys
import threading
from pathlib import Path

from pydantic import ValidationError

from nemo_gym import config as gym_config
from nemo_gym.launcher import Launcher
from nemo_gym.openai_utils import new_response
from nemo_gym.presets import environment_trio
from nemo_gym.rollouts import read_rows


def instances_from_args(args: argparse.Namespace) -> dict[str, gym_config.Instance]:
    if bool(args.config) == bool(args.resources_server):
        raise ValueError("give either --config FILE ... or --resources-server NAME")
    if args.config:
        return gym_config.load(args.config)
    data = environment_trio(args.resources_server, args.num_workers, args.model_url, args.model)
    instances = gym_config.parse(data, {name: "--resources-server" for name in data})
    gym_config.check_settings(instances)
    return instances


def start(args: argparse.Namespace) -> int:
    instances = instances_from_args(args)
    try:
        head_port_taken = gym_config.port_in_use(gym_config.DEFAULT_HOST, args.head_port)
    except OSError as error:
        raise ValueError(f"--head-port: cannot listen on port {args.head_port}: {error.strerror or error}") from None
    if head_port_taken:
        raise ValueError(f"--head-port: port {args.head_port} is already in use (another `gym env start`?)")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with Launcher(instances, args.head_port) as launcher:
        print(launcher.table(), flush=True)
        print("All servers are up. Ctrl-C stops them.", flush=True)
        while not stop.wait(1):
            for name, process in launcher.processes.items():
                if process.poll() is not None:
                    print(f"server {name!r} exited with code {process.returncode}:\n{launcher.log_tail(name)}", file=sys.stderr)
                    return 1
    return 0


def body_model(handler) -> type:
    """The pydantic model of a handler's ``body`` parameter (string annotations resolved)."""
    return inspect.signature(handler, eval_str=True).parameters["body"].annotation


def check_example_data(name: str, path: str | Path | None = None) -> int:
    """Validate every row of the server's data/example.jsonl (or ``path``) against its seed_session and verify models.

    Prints each bad row with its number and returns how many there were.
    """
    module = importlib.import_module(f"resources_servers.{name}.app")
    server_class = module.app.server_class
    seed_model, verify_model = body_model(server_class.seed_session), body_model(server_class.verify)
    path = Path(path) if path else gym_config.REPO_ROOT / "resources_servers" / name / "data" / "example.jsonl"
    problems = 0
    response = new_response().model_dump(mode="json", by_alias=True)
    rows = read_rows(path)
    for number, row in enumerate(rows, 1):
        try:
            seed_model.model_validate(row)
            verify_model.model_validate({**row, "response": response})
        except ValidationError as error:
            problems += 1
            print(f"{path}: row {number}: {error}", file=sys.stderr)
    print(f"{path}: {len(rows) - problems} of {len(rows)} rows match the request models")
    return problems


def test(args: argparse.Namespace) -> int:
    directory = gym_config.REPO_ROOT / "resources_servers" / args.resources_server
    if not (directory / "app.py").is_file():
        raise ValueError(f"--resources-server: no resources server at {directory}")
    problems = check_example_data(args.resources_server)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", str(directory / "tests")], cwd=gym_config.REPO_ROOT)
    return 1 if problems or tests.returncode else 0
