"""The benchmark's own server, and the two ways the benchmark runs a server it measures.

``BenchServer`` is a resources server whose ``/seed_session`` stores nothing (so a memory measurement
shows only the framework's own per-session cost) and whose ``/verify`` burns ``verify_cpu_ms`` of CPU
(so a CPU-bound measurement shows how throughput scales with workers). It lives here, not in
``resources_servers/``, because it is no environment anyone would train on.

Both commands read the config and instance name from the environment, and run uvicorn as
``nemo_gym.process.run`` does (its own code and options, not a copy):

    python -m scripts.bench.server serve --module scripts.bench.server
        ``nemo_gym.process.run.serve`` serves the module's server class (``num_workers`` workers).
    python -m scripts.bench.server worker --module resources_servers.example_session_state_mgmt.app --port P
        one worker of a routed server, in this process, on its own port; several such processes that
        share ``NEMO_GYM_SOCKET_DIR`` are the workers of one server, each reachable on its own port.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time

import uvicorn
from fastapi import FastAPI, Request
from starlette.types import ASGIApp

from nemo_gym.process import run as gym_serve
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.process.discovery import find_server_class
from nemo_gym.server import SimpleServer

# The module whose server ``serve`` runs, for its workers (uvicorn starts them by import string).
MODULE_ENV = "NEMO_GYM_BENCH_MODULE"


class BenchServerConfig(BaseResourcesServerConfig):
    verify_cpu_ms: float = 0.0


class BenchServer(SimpleResourcesServer):
    """Keeps nothing per session; ``/verify`` burns CPU, then rewards 1.0; ``/touch`` does nothing."""

    config: BenchServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/touch")(self.touch)
        return app

    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        burn_cpu(self.config.verify_cpu_ms / 1000)
        return BaseVerifyResponse(**{**body.model_dump(), "reward": 1.0})

    async def touch(self, request: Request) -> dict:
        """A request of a session that does nothing: what reaches a session's owner (a seed starts a new session)."""
        return {}


def burn_cpu(seconds: float) -> None:
    """Spin until this thread has used ``seconds`` of CPU (not wall time: a preempted burn still costs it)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def server_class_of(module: str) -> type[SimpleServer]:
    return find_server_class(importlib.import_module(module))


def serve(module: str) -> None:
    """``nemo_gym.process.run.serve`` for a module outside the server directories: its workers build their apps here."""
    os.environ[MODULE_ENV] = module
    gym_serve.serve(server_class_of(module), app_factory="scripts.bench.server:worker_app")


def worker_app() -> ASGIApp:
    """The app of one worker of ``serve``."""
    return server_class_of(os.environ[MODULE_ENV]).from_environment().build_app()


def worker(module: str, port: int) -> None:
    """One worker of the instance (its settings say how many there are), on ``port``."""
    server = server_class_of(module).from_environment()
    uvicorn.run(server.build_app(), **{**gym_serve.uvicorn_options(gym_serve.this_instance(), server.config), "port": port})


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
