"""scripts/bench/server.py: the benchmark's server is served by nemo_gym.process.run's own code, with its uvicorn options."""

from __future__ import annotations

from pathlib import Path

import pytest
import uvicorn

from nemo_gym.process import run as gym_serve
from nemo_gym.env import CONFIG_PATH_ENV, ENTRYPOINT_ENV, INSTANCE_ENV, NUM_WORKERS_ENV, SOCKET_DIR_ENV, WORKER_ENV
from nemo_gym.metrics.exposition import MULTIPROC_DIR_ENV
from scripts.bench import server as bench
from scripts.bench.servers import BENCH_MODULE, bench_server, write_config


@pytest.fixture
def uvicorn_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, dict]]:
    """Each call of ``uvicorn.run`` (app, options) instead of serving; whatever serving sets in the environment is undone."""
    for name in (WORKER_ENV, ENTRYPOINT_ENV, NUM_WORKERS_ENV, SOCKET_DIR_ENV, MULTIPROC_DIR_ENV, bench.MODULE_ENV):
        # Set first, so that monkeypatch removes it at the end even if it was not set before.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    calls: list[tuple[object, dict]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: calls.append((app, options)))
    return calls


def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int):
    instances, config_path = write_config(tmp_path, "bench", {"bench": bench_server(num_workers=workers, verify_cpu_ms=1.0)})
    monkeypatch.setenv(CONFIG_PATH_ENV, str(config_path))
    monkeypatch.setenv(INSTANCE_ENV, "bench")
    return instances["bench"]


def serves_options(options: dict) -> dict:
    """Options comparable by value: uvicorn's ``http`` is a partial made afresh for each call."""
    http = options["http"]
    return {**options, "http": (http.func, http.args, http.keywords)}


def expected_options(bench_instance, hand_off: bool = False) -> dict:
    config = bench.BenchServer.validate_config(bench_instance.name, bench_instance.settings)
    return serves_options(gym_serve.uvicorn_options(bench_instance, config, hand_off))


def test_one_worker_is_served_as_nemo_gym_serve_serves_it(tmp_path, monkeypatch, uvicorn_runs):
    bench_instance = instance(tmp_path, monkeypatch, 1)
    bench.serve(BENCH_MODULE)
    [(app, options)] = uvicorn_runs
    assert serves_options(options) == expected_options(bench_instance)
    assert options["lifespan"] == "on" and options["timeout_worker_healthcheck"] == 30
    assert not isinstance(app, str)  # the app itself, built in this process


def test_several_workers_are_served_by_uvicorns_supervisor_with_nemo_gym_serves_options(tmp_path, monkeypatch, uvicorn_runs):
    bench_instance = instance(tmp_path, monkeypatch, 2)
    bench.serve(BENCH_MODULE)
    [(app, options)] = uvicorn_runs
    assert app == "scripts.bench.server:worker_app"
    # Its workers hand connections to each other (uvicorn's supervisor serves them all on one port).
    assert serves_options(options) == {**expected_options(bench_instance, hand_off=True), "workers": 2, "factory": True}


def test_a_worker_of_its_own_port_has_nemo_gym_serves_options_but_the_port(tmp_path, monkeypatch, uvicorn_runs):
    bench_instance = instance(tmp_path, monkeypatch, 2)
    bench.worker(BENCH_MODULE, 12345)
    [(_, options)] = uvicorn_runs
    assert serves_options(options) == {**expected_options(bench_instance), "port": 12345}

