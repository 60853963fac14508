"""The process of one server instance: ``python -m nemo_gym.serve`` with the launcher's environment.

One worker: uvicorn serves the module's ``app`` in this process. Several: uvicorn's own supervisor
spawns the workers, each importing the module-level ``app``; this process serves no requests.
"""

from __future__ import annotations

import importlib
import json
import os

import uvicorn

from nemo_gym import config as gym_config
from nemo_gym.server import CONFIG_PATH_ENV, INSTANCE_ENV
from nemo_gym.sessions import session_secret

KEEP_ALIVE_SECONDS = 75


def main() -> None:
    name = os.environ[INSTANCE_ENV]
    with open(os.environ[CONFIG_PATH_ENV]) as file:
        instance = gym_config.parse(json.load(file), check_ports=False)[name]
    module = importlib.import_module(instance.module)
    session_secret(name, instance.settings.get("session_secret"))
    options = dict(
        host=instance.host,
        port=instance.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=5,
    )
    if instance.num_workers == 1:
        uvicorn.run(module.app, **options)
    else:
        uvicorn.run(f"{instance.module}:app", workers=instance.num_workers, **options)


if __name__ == "__main__":
    main()
