"""The servers the benchmark measures: their configs, the checkout each runs from, and their cookies' owners.

A server runs from a checkout of this project (``Tree``): the current one, which this script is part of,
or a baseline given by ``--baseline PATH``, whose servers then run their own code side by side with the
current tree's. Both read the same resolved config file, so the launcher-process contract (the
environment names, the config's shape) and the life names of workers must be the same in both trees.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from itsdangerous import BadSignature

from nemo_gym import config as gym_config
from nemo_gym.config import REPO_ROOT
from nemo_gym.env import CONFIG_PATH_ENV, INSTANCE_ENV, SOCKET_DIR_ENV, STATE_DIR_ENV
from nemo_gym.process.launcher import default_start_timeout
from nemo_gym.routing.transport.unix import make_socket_dir, remove_socket_dir
from scripts.bench.processes import Spawned
from tests.session_cookies import cookie_owner

COUNTER = "example_session_state_mgmt"
COUNTER_MODULE = f"resources_servers.{COUNTER}.app"
# The benchmark's own server (scripts/bench/server.py), run by import path.
BENCH_MODULE = "scripts.bench.server"
BENCH_SERVE = (BENCH_MODULE, "serve", "--module", BENCH_MODULE)
# Every instance signs with this, so the benchmark can read a cookie's owner for its own bookkeeping.
SECRET = "bench-routing-secret-of-at-least-32-bytes"


# The command that serves one instance, as the launcher runs it: None for the module of the tree's own
# layout (nemo_gym.process.run, or nemo_gym.serve in a checkout from before the layout of issue 19).
SERVE = None


@dataclass(frozen=True)
class Tree:
    """A checkout of this project whose servers the benchmark starts: its code is what they run."""

    label: str
    root: Path

    def server(self, name: str, config_path: Path, log_dir: Path, socket_dir: str | None = None, module: tuple[str, ...] | None = SERVE) -> Spawned:
        """The instance ``name`` of the config, served by ``python -m <module>`` from this checkout."""
        env = server_env(config_path, name, socket_dir, self.root)
        if module is None:
            module = ("nemo_gym.process.run",) if (self.root / "nemo_gym" / "process" / "run.py").exists() else ("nemo_gym.serve",)
        return Spawned(name, [sys.executable, "-m", *module], log_dir, env, cwd=self.root)


CURRENT = Tree("current", REPO_ROOT)


class Servers:
    """Server processes started together, each from its checkout, and stopped together, each by its PID.

    As the launcher does, each multi-worker server is handed a socket directory made here, removed when
    the servers stop, and a server is ready once every one of its workers serves.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: dict[str, tuple[Spawned, gym_config.Instance, str | None]] = {}

    def start(self, instance: gym_config.Instance, config_path: Path, tree: Tree = CURRENT, module: tuple[str, ...] | None = SERVE) -> Spawned:
        socket_dir = make_socket_dir() if instance.num_workers > 1 else None
        server = tree.server(instance.name, config_path, self.log_dir, socket_dir, module)
        self.started[instance.name] = (server, instance, socket_dir)
        return server

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until every worker of every server started serves; ``timeout`` as the launcher's by default."""
        if timeout is None:
            timeout = default_start_timeout({name: instance for name, (_, instance, _) in self.started.items()})
        deadline = time.monotonic() + timeout
        for server, instance, socket_dir in self.started.values():
            server.wait_ready(f"{instance.url}/", max(1.0, deadline - time.monotonic()), socket_dir, instance.num_workers)

    def pid(self, name: str) -> int:
        return self.started[name][0].pid

    def socket_dir(self, name: str) -> str | None:
        return self.started[name][2]

    def stop(self) -> None:
        for server, _, socket_dir in self.started.values():
            server.stop()
            if socket_dir is not None:
                remove_socket_dir(socket_dir)
        self.started.clear()

    def __enter__(self) -> "Servers":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def write_config(log_dir: Path, name: str, config: dict) -> tuple[dict[str, gym_config.Instance], Path]:
    instances = gym_config.parse(config)
    path = log_dir / f"{name}.json"
    path.write_text(json.dumps({k: v for i in instances.values() for k, v in i.to_dict().items()}))
    return instances, path


def server_env(config_path: Path, instance: str, socket_dir: str | None = None, root: Path = REPO_ROOT) -> dict[str, str]:
    """The environment of a server process run from the checkout at ``root`` (first on its import path), with
    a state directory of its own beside the config, so that a durable server starts with an empty store."""
    env = {**os.environ, CONFIG_PATH_ENV: str(config_path), INSTANCE_ENV: instance, "PYTHONUNBUFFERED": "1"}
    env[STATE_DIR_ENV] = str(config_path.parent / "state")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    if socket_dir is not None:
        env[SOCKET_DIR_ENV] = socket_dir
    return env


def resource_server(implementation: str, **settings: Any) -> dict:
    return {"resources_servers": {implementation: {"session_secret": SECRET, **settings}}}


def bench_server(**settings: Any) -> dict:
    """An instance of scripts/bench/server.py's BenchServer. The config names the counter's directory only
    because a config must name an existing server directory; the process runs BenchServer's module."""
    return resource_server(COUNTER, **settings)


def session_owner(cookies: dict[str, str]) -> str | None:
    """The owner named in whichever Gym session cookie these are (None for a server without owners)."""
    for name in cookies:
        if name.endswith("_session"):
            return owner_of(cookies, name.removesuffix("_session"))
    return None


def owner_of(cookies: dict[str, str], instance: str) -> str | None:
    """The owner worker named in an instance's session cookie (the benchmark knows the secret); None for a
    cookie signed otherwise (a baseline from before cookies were signed with the instance's key)."""
    try:
        return cookie_owner(cookies, instance, SECRET)
    except BadSignature:
        return None
