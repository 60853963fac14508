"""The head endpoint: serves the resolved config, credentials redacted, so a client started later finds the servers;
and ``GET /metrics``: the servers it found them (``nemo_gym_instance_workers``, a scrape target list) and its own process."""

from __future__ import annotations

import json
import os
import urllib.request

import uvicorn
from fastapi import FastAPI
from fastapi.responses import Response

from nemo_gym import config as gym_config
from nemo_gym.config.redaction import redact
from nemo_gym.metrics.layers import METRICS_PATH, TEXT_FORMAT
from nemo_gym.env import CONFIG_PATH_ENV, DEFAULT_HOST, HEAD_PORT_ENV
from nemo_gym.protocols.input_limits import InputLimits
from nemo_gym.process.parent import follow_parent


def build_app(config_path: str) -> FastAPI:
    with open(config_path) as file:
        resolved = redact(json.load(file))
    app = FastAPI(title="nemo_gym head")
    app.get("/")(lambda: {"status": "ok"})
    app.get("/global_config")(lambda: resolved)
    exposition = head_metrics(gym_config.parse(resolved, check_ports=False))
    app.get(METRICS_PATH)(lambda: Response(exposition(), media_type=TEXT_FORMAT))
    return app


def head_metrics(instances: dict[str, gym_config.Instance]):
    """What the head's ``GET /metrics`` answers: each instance's workers (its URL, what every server's own
    ``/metrics`` aggregates), and this process's CPU and memory."""
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    class Instances:
        def collect(self):
            family = GaugeMetricFamily("nemo_gym_instance_workers", "The workers of each server instance.", labels=["instance", "server_type", "url"])
            for instance in instances.values():
                family.add_metric([instance.name, instance.server_type, instance.url], instance.num_workers)
            yield family

    registry = CollectorRegistry()
    registry.register(Instances())
    ProcessCollector(registry=registry)
    return lambda: generate_latest(registry)


def fetch_instances(head_url: str, timeout: float = 10) -> dict[str, gym_config.Instance]:
    """The instances a running ``gym env start`` serves, as its head endpoint reports them."""
    try:
        with urllib.request.urlopen(f"{head_url.rstrip('/')}/global_config", timeout=timeout) as reply:
            data = json.load(reply)
    except OSError as error:
        raise ConnectionError(f"no Gym head endpoint at {head_url} ({error}); is `gym env start` running?") from None
    return gym_config.parse(data, check_ports=False)


def main() -> None:
    app = build_app(os.environ[CONFIG_PATH_ENV])
    port = int(os.environ[HEAD_PORT_ENV])
    # The default limits: the head endpoint has no settings of its own.
    uvicorn.run(app, host=DEFAULT_HOST, port=port, log_level="warning", access_log=False, http=InputLimits().protocol())


if __name__ == "__main__":
    follow_parent()
    main()
