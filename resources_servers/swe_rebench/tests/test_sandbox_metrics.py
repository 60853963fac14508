"""swe_rebench's ``GET /metrics``: the sandboxes on disk and the disk they take, as seeds make them and verifies remove them."""

from starlette.testclient import TestClient

from resources_servers.swe_rebench.tests.test_app import make_server, seeded, verify
from tests.unit_tests.metrics.scrape import value


def sandbox_gauges(client) -> tuple[float, float]:
    text = client.get("/metrics").text
    return value(text, "nemo_gym_sandboxes"), value(text, "nemo_gym_sandbox_disk_bytes")


def test_metrics_count_the_sandboxes_on_disk_and_the_disk_they_take(tmp_path):
    with TestClient(make_server(tmp_path / "sandboxes").build_app()) as client:
        assert sandbox_gauges(client) == (0, 0)
        seeded(client)
        count, disk = sandbox_gauges(client)
        assert count == 1 and disk > 0
        client.post("/write_file", json={"path": "big.txt", "content": "x" * 200_000})
        assert sandbox_gauges(client)[1] >= disk + 200_000
        verify(client)
        assert sandbox_gauges(client) == (0, 0)
