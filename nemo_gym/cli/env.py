"""``gym env start``, ``gym env test``, ``gym env resolve``, ``gym env validate``, ``gym env status`` and ``gym env init``."""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from nemo_gym import config as gym_config
from nemo_gym.cli.scaffold import scaffold
from nemo_gym.client.rollouts import read_rows
from nemo_gym.config.paths import find_implementation, make_importable, search_roots, server_module_checked
from nemo_gym.config.presets import environment_trio
from nemo_gym.config.redaction import redact
from nemo_gym.env import DEFAULT_HOST, EXTRA_ROOTS_ENV
from nemo_gym.cli.upstream_keys import gives_config_paths
from nemo_gym.process.head import fetch_instances
from nemo_gym.openai_utils import new_response
from nemo_gym.process import discovery
from nemo_gym.process.launcher import Launcher


def uses_config(args: argparse.Namespace) -> bool:
    """Config files given: ``--config``, or upstream's ``+config_paths=[...]``."""
    return bool(args.config) or gives_config_paths(args.overrides)


def config_layers(args: argparse.Namespace) -> dict[str, Any]:
    """What ``gym_config.resolve``/``load`` take from the command line: files or the shortcut, overrides, search roots.

    With config files, ``--model-url``, ``--model`` and ``--model-api-key`` set upstream's variables
    ``policy_base_url``, ``policy_model_name`` and ``policy_api_key``; the explicit overrides come after, and win.
    """
    if uses_config(args) == bool(args.resources_server):
        raise ValueError("give either --config FILE ... or --resources-server NAME")
    layers: dict[str, Any] = {"paths": args.config, "overrides": list(args.overrides), "roots": search_roots(args.search_dir)}
    if uses_config(args):
        variables = {"policy_base_url": args.model_url, "policy_model_name": args.model, "policy_api_key": args.model_api_key}
        layers["overrides"][:0] = [f"++{key}={value}" for key, value in variables.items() if value is not None]
    else:
        trio = environment_trio(args.resources_server, args.num_workers, args.model_url, args.model)
        layers["initial"] = ("--resources-server", trio)
    return layers


def config_from_args(args: argparse.Namespace) -> tuple[dict, dict[str, gym_config.Instance]]:
    """The config's top-level settings (``ray_head_node_address`` ...) and its instances."""
    return discovery.load_config(**config_layers(args))


def resolve(args: argparse.Namespace) -> int:
    """Print the merged, interpolated config as YAML, after checking it as ``env start`` would."""
    layers = config_layers(args)
    data, sources = gym_config.resolve(layers["paths"], layers["overrides"], layers["roots"], layers.get("initial"))
    discovery.check_settings(gym_config.parse(data, sources, check_ports=False), layers["roots"])
    print(yaml.safe_dump(redact(data), sort_keys=False), end="")
    return 0


def validate(args: argparse.Namespace) -> int:
    """Check a config as ``env start`` would (files, keys, each server's own config model), starting nothing."""
    if args.workload and "=" in args.workload:
        # A KEY=VALUE where the workload name may stand is an override, as upstream reads it.
        args.overrides, args.workload = [args.workload, *args.overrides], None
    if args.workload:
        raise ValueError(
            f"gym env validate {args.workload}: manifest-backed workloads are not supported here; validate a config with --config FILE or --resources-server NAME"
        )
    layers = config_layers(args)
    data, sources = gym_config.resolve(layers["paths"], layers["overrides"], layers["roots"], layers.get("initial"))
    discovery.check_settings(gym_config.parse(data, sources, check_ports=False), layers["roots"])
    print("✓ Config is valid.")
    return 0


def probe(url: str, timeout: float = 2) -> str:
    """Upstream's health words for ``GET url``: success, connection_error, timeout or unknown_error."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return "success"
    except (TimeoutError, socket.timeout):
        return "timeout"
    except urllib.error.URLError as error:
        return "timeout" if isinstance(error.reason, (TimeoutError, socket.timeout)) else "connection_error"
    except (ConnectionError, http.client.HTTPException):
        return "connection_error"
    except OSError:
        return "unknown_error"


def status(args: argparse.Namespace) -> int:
    """The servers of a running ``gym env start``, as its head endpoint lists them, each asked ``GET /``."""
    try:
        instances = fetch_instances(args.head_url or f"http://127.0.0.1:{args.head_port}")
    except ConnectionError as error:
        print(f"could not reach the head endpoint: {error}", file=sys.stderr)
        instances = {}
    servers = [
        {"process_name": name, "server_type": i.server_type, "name": i.implementation, "host": i.host, "port": i.port, "url": i.url,
         "num_workers": i.num_workers, "status": probe(i.url)}
        for name, i in instances.items()
    ]
    if args.json:
        print(json.dumps(servers))
        return 0
    if not servers:
        print("No NeMo Gym servers found running.")
        return 0
    print("\nNeMo Gym Server Status:\n")
    for number, server in enumerate(servers, 1):
        mark = "✓" if server["status"] == "success" else "✗"
        print(f"[{number}] {mark} {server['process_name']} ({server['server_type']}/{server['name']})")
        print(f"    {server['url']}  workers: {server['num_workers']}  status: {server['status']}")
    healthy = sum(server["status"] == "success" for server in servers)
    print(f"\n{len(servers)} servers found ({healthy} healthy, {len(servers) - healthy} unhealthy)\n")
    return 0


def init(args: argparse.Namespace) -> int:
    directory = scaffold(args.name, Path(args.dir))
    print(f"made {directory}\ntry: gym env test --resources-server {args.name}" + (f" --search-dir {args.dir}" if args.dir != "." else ""))
    return 0


def start(args: argparse.Namespace) -> int:
    settings, instances = config_from_args(args)
    try:
        head_port_taken = gym_config.port_in_use(DEFAULT_HOST, args.head_port)
    except OSError as error:
        raise ValueError(f"--head-port: cannot listen on port {args.head_port}: {error.strerror or error}") from None
    if head_port_taken:
        raise ValueError(f"--head-port: port {args.head_port} is already in use (another `gym env start`?)")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with Launcher(instances, args.head_port, start_timeout=args.start_timeout, settings=settings) as launcher:
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


def resources_server_directory(value: str, roots: list[Path]) -> Path:
    """``--resources-server``: a name looked up in the search roots, or a path to ``.../resources_servers/<name>``."""
    if os.sep in value or value in (".", "..") or Path(value).is_dir():
        directory = Path(value).resolve()
        if directory.parent.name != "resources_servers" or not (directory / "app.py").is_file():
            raise ValueError(f"--resources-server: {value} is not a resources server directory (<root>/resources_servers/<name>/ with an app.py)")
        return directory
    try:
        directory = find_implementation("resources_servers", value, roots)
    except LookupError as error:
        raise ValueError(f"--resources-server: {error}") from None
    if not (directory / "app.py").is_file():
        raise ValueError(f"--resources-server: no app.py in {directory}")
    return directory


def check_example_data(directory: Path, path: str | Path | None = None) -> int:
    """Validate every row of the server's data/example.jsonl (or ``path``) against its seed_session and verify models.

    Prints each bad row with its number and returns how many there were.
    """
    make_importable(directory)
    module_name = f"resources_servers.{directory.name}.app"
    try:
        with server_module_checked(module_name) as module:
            server_class = discovery.find_server_class(module)
    except (ImportError, LookupError) as error:
        raise ValueError(f"{directory / 'app.py'}: cannot load a server app from {module_name}: {error!r}") from None
    seed_model, verify_model = body_model(server_class.seed_session), body_model(server_class.verify)
    path = Path(path) if path else directory / "data" / "example.jsonl"
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


def server_to_test(args: argparse.Namespace) -> str:
    """``--resources-server``, or upstream's ``+entrypoint=resources_servers/NAME`` (a directory, from the working directory)."""
    entrypoints = [value for key, _, value in (item.partition("=") for item in args.overrides) if key.lstrip("+") == "entrypoint"]
    others = [item for item in args.overrides if item.partition("=")[0].lstrip("+") != "entrypoint"]
    if others:
        raise ValueError(f"gym env test takes no config keys but +entrypoint=...; got {' '.join(others)}")
    if bool(args.resources_server) + len(entrypoints) != 1:
        raise ValueError("give --resources-server NAME|DIR (or upstream's +entrypoint=resources_servers/NAME), once")
    return args.resources_server or entrypoints[0]


def uses_anyio(directory: Path) -> bool:
    """Whether a server's tests run their async tests with anyio's plugin (this project's do), which
    pytest-asyncio's auto mode would take over."""
    return any("pytest.mark.anyio" in path.read_text(errors="replace") for path in directory.rglob("*.py"))


def pytest_command(directory: Path) -> list[str]:
    """Pytest as upstream's ``ng_test`` runs it: in auto mode when pytest-asyncio is installed, unless the
    server's tests are anyio's."""
    command = [sys.executable, "-m", "pytest", "-q"]
    if importlib.util.find_spec("pytest_asyncio") is not None and not uses_anyio(directory):
        command += ["-o", "asyncio_mode=auto"]
    return command


def test(args: argparse.Namespace) -> int:
    """Check the example data, then run the server's tests as upstream's ``ng_test`` does: from the server's
    directory, with it and its root (also handed on as a search root) first on ``PYTHONPATH``."""
    directory = resources_server_directory(server_to_test(args), search_roots(args.search_dir))
    problems = check_example_data(directory)
    root = directory.parent.parent
    env = {**os.environ, EXTRA_ROOTS_ENV: os.pathsep.join(filter(None, [str(root), os.environ.get(EXTRA_ROOTS_ENV)]))}
    paths = dict.fromkeys([str(directory), str(root), str(gym_config.REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    tests = subprocess.run(pytest_command(directory), cwd=directory, env=env)
    return 1 if problems or tests.returncode else 0
