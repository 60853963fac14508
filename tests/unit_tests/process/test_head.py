"""The head endpoint's ``GET /metrics``: every instance of the config it serves, with its workers and URL."""

from __future__ import annotations

import json

from starlette.testclient import TestClient

from nemo_gym.process.head import build_app
from tests.unit_tests.metrics.scrape import value


def test_head_metrics_list_every_instance_with_its_workers_and_url(tmp_path):
    config = {
        "counter": {"resources_servers": {"example_session_state_mgmt": {"entrypoint": "app.py", "host": "127.0.0.1", "port": 18080, "num_workers": 4}}},
        "policy": {"responses_api_models": {"vllm_model": {"entrypoint": "app.py", "host": "127.0.0.1", "port": 18081}}},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    reply = TestClient(build_app(str(path))).get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = reply.text
    assert value(text, "nemo_gym_instance_workers", instance="counter", server_type="resources_servers", url="http://127.0.0.1:18080") == 4
    assert value(text, "nemo_gym_instance_workers", instance="policy", server_type="responses_api_models", url="http://127.0.0.1:18081") == 1
    assert value(text, "process_resident_memory_bytes") > 0
