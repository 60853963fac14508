"""The benchmark's own server, and the two ways scripts/bench_routing.py runs a server it measures.

``BenchServer`` is a resources server whose ``/seed_session`` stores nothing (so a memory measurement
shows only the framework's own per-session cost) and whose ``/verify`` burns ``verify_cpu_ms`` of CPU
(so a CPU-bound measurement shows how throughput scales with workers). It lives here, not in
``resources_servers/``, because it is no environment anyone would train on.

Both commands read the config and instance name from the environment, as ``nemo_gym.serve`` does:

    python -m scripts.bench_servers serve --module scripts.bench_servers
        uvicorn's own multi-worker supervisor serves the module's server class (``num_workers`` workers).
    python -m scripts.bench_servers worker --module resources_servers.example_session_state_mgmt.app --port P
        one worker of a routed server, in this process, on its own port; several such processes that
        share ``NEMO_GYM_SOCKET_DIR`` are the workers of one server, each reachable on its own port.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time

import uvicorn
from fastapi import Request
from starlette.types import ASGIApp

from nemo_gym import config as gym_config
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.routing.transport.unix import make_socket_dir, remove_socket_dir
from nemo_gym.routing.worker import SOCKET_DIR_ENV
from nemo_gym.global_config import CONFIG_PATH_ENV, INSTANCE_ENV
from nemo_gym.server import SimpleServer, find_server_class

KEEP_ALIVE_SECONDS = 75  # as nemo_gym.serve
# The module whose server ``serve`` runs, for its workers (uvicorn starts them by import string).
MODULE_ENV = "NEMO_GYM_BENCH_MODULE"


class BenchServerConfig(BaseResourcesServerConfig):
    verify_cpu_ms: float = 0.0


class BenchServer(SimpleResourcesServer):
    """Keeps nothing per session; ``/verify`` burns CPU, then rewards 1.0."""

    config: BenchServerConfig

    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        burn_cpu(self.config.verify_cpu_ms / 1000)
        return BaseVerifyResponse(**{**body.model_dump(), "reward": 1.0})


def burn_cpu(seconds: float) -> None:
    """Spin until this thread has used ``seconds`` of CPU (not wall time: a preempted burn still costs it)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def instance_from_environment() -> gym_config.Instance:
    name = os.environ[INSTANCE_ENV]
    with open(os.environ[CONFIG_PATH_ENV]) as file:
        return gym_config.parse(json.load(file), check_ports=False)[name]


def uvicorn_options(host: str, port: int) -> dict:
    return dict(host=host, port=port, log_level="warning", access_log=False, timeout_keep_alive=KEEP_ALIVE_SECONDS, timeout_graceful_shutdown=5)


def serve(module: str) -> None:
    """What ``nemo_gym.serve`` does, for a module outside the server directories."""
    os.environ[MODULE_ENV] = module
    instance = instance_from_environment()
    options = uvicorn_options(instance.host, instance.port)
    if instance.num_workers == 1:
        uvicorn.run(worker_app(), **options)
        return
    made_here = not os.environ.get(SOCKET_DIR_ENV)
    if made_here:
        os.environ[SOCKET_DIR_ENV] = make_socket_dir()
    socket_dir = os.environ[SOCKET_DIR_ENV]
    try:
        uvicorn.run("scripts.bench_servers:worker_app", factory=True, workers=instance.num_workers, **options)
    finally:
        if made_here:
            remove_socket_dir(socket_dir)


def server_of(module: str) -> SimpleServer:
    """The server ``module`` defines, for the instance the environment names."""
    return find_server_class(importlib.import_module(module)).from_environment()


def worker_app() -> ASGIApp:
    """The app of one worker of ``serve``."""
    return server_of(os.environ[MODULE_ENV]).build_app()


def worker(module: str, port: int) -> None:
    """One worker of the instance (its settings say how many there are), on ``port``."""
    server = server_of(module)
    uvicorn.run(server.build_app(), **uvicorn_options(server.config.host, port))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["serve", "worker"])
    parser.add_argument("--module", required=True, help="the module whose server class to serve")
    parser.add_argument("--port", type=int, help="worker: this worker's own port")
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.module)
    else:
        worker(args.module, args.port)


if __name__ == "__main__":
    main()
