"""Build a server's app in a fresh interpreter the way a worker process does, and report what it imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from nemo_gym import config as gym_config
from nemo_gym.env import CONFIG_PATH_ENV, INSTANCE_ENV, SOCKET_DIR_ENV, WORKER_ENV
from nemo_gym.routing.transport.unix import make_socket_dir, remove_socket_dir

REPO = Path(__file__).resolve().parents[2]
IMPORT_TIMEOUT_SECONDS = 120
REPORT = """
import json, sys
from nemo_gym.process.run import worker_app
app = worker_app()
while not hasattr(app, "routes"):  # the FastAPI app, inside the middlewares that wrap it
    app = app.app
paths = sorted({getattr(route, "path", "") for route in app.routes})
print(json.dumps({"modules": sorted(sys.modules), "paths": paths, "probe": eval(sys.argv[1]) if sys.argv[1] else None}))
"""


def worker_imports(name: str, server_type: str, implementation: str, settings: dict[str, Any], probe: str = "") -> dict[str, Any]:
    """What a worker of this instance holds once its app is built (``nemo_gym.process.run.worker_app``): its modules,
    the app's paths, and the value of the expression ``probe`` evaluated there."""
    instance = gym_config.parse({name: {server_type: {implementation: {"entrypoint": "app.py", **settings}}}})[name]
    several = instance.num_workers > 1
    socket_dir = make_socket_dir() if several else ""
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            config_path = Path(run_dir, "resolved_config.json")
            config_path.write_text(json.dumps(instance.to_dict()))
            env = {**os.environ, "PYTHONPATH": str(REPO), CONFIG_PATH_ENV: str(config_path), INSTANCE_ENV: name, SOCKET_DIR_ENV: socket_dir}
            if several:
                env[WORKER_ENV] = "1"
            done = subprocess.run(
                [sys.executable, "-c", REPORT, probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=IMPORT_TIMEOUT_SECONDS
            )
    finally:
        if several:
            remove_socket_dir(socket_dir)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def holds(modules: list[str], package: str) -> bool:
    return any(module == package or module.startswith(package + ".") for module in modules)
