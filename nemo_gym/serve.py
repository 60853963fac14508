"""The process of one server instance: ``python -m nemo_gym.serve`` with the launcher's environment.

One worker: uvicorn serves the module's ``app`` in this process. Several: uvicorn's own supervisor
spawns the workers, each importing the module-level ``app``; this process serves no requests.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import uvicorn

from nemo_gym import config as gym_config
from nemo_gym.routing.worker import SOCKET_DIR_ENV, make_socket_dir, remove_socket_dir
from nemo_gym.server import CONFIG_PATH_ENV, INSTANCE_ENV
from nemo_gym.signing_secret import SecretError, session_secret

KEEP_ALIVE_SECONDS = 75


def main() -> None:
    name = os.environ[INSTANCE_ENV]
    with open(os.environ[CONFIG_PATH_ENV]) as file:
        instance = gym_config.parse(json.load(file), check_ports=False)[name]
    module = importlib.import_module(instance.module)
    try:
        session_secret(name, instance.settings.get("session_secret"))
    except SecretError as error:
        sys.exit(f"server {name!r} cannot start: {error}")
    options = dict(
        host=instance.host,
        port=instance.port,
        log_level="warning",
        access_log=False,
        lifespan="on",  # an app that cannot start makes the process exit, not serve 500s
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=5,
        # A worker replacing a dead one must start within this; 8 workers importing at once on 2 busy
        # cores can take longer than uvicorn's 5 s default, which would kill and restart them in a loop.
        timeout_worker_healthcheck=30,
    )
    if instance.num_workers == 1:
        uvicorn.run(module.app, **options)
        return
    server_class = module.app.server_class
    if not server_class.is_routed(server_class.config_class.model_validate(instance.settings)):
        uvicorn.run(f"{instance.module}:app", workers=instance.num_workers, **options)
        return
    # Every worker serves a private socket in this directory; it goes when the server stops. A
    # launcher may hand one over, so that it can remove it even if this process is killed.
    if os.environ.get(SOCKET_DIR_ENV):
        uvicorn.run(f"{instance.module}:app", workers=instance.num_workers, **options)
        return
    os.environ[SOCKET_DIR_ENV] = socket_dir = make_socket_dir()
    try:
        uvicorn.run(f"{instance.module}:app", workers=instance.num_workers, **options)
    finally:
        remove_socket_dir(socket_dir)


if __name__ == "__main__":
    main()
