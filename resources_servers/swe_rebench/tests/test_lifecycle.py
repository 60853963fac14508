"""swe_rebench's sessions end with their sandbox: /close_session and idleness remove it; max_sandbox_disk_mb refuses
a seed over the total before any sandbox is made."""

import time

import pytest
from starlette.testclient import TestClient

from resources_servers.swe_rebench.tests.test_app import ROWS, make_server, sandbox_dir, sandboxes_left  # noqa: F401 (a fixture)


def seed(client: TestClient) -> dict[str, str]:
    """A new session (no cookie sent): its cookies."""
    client.cookies.clear()
    reply = client.post("/seed_session", json=ROWS["clamp_upper"])
    assert reply.status_code == 200, reply.text
    return dict(reply.cookies)


def test_close_removes_the_sandbox_and_a_second_close_is_already_closed(sandbox_dir):
    with TestClient(make_server(sandbox_dir).build_app()) as client:
        seed(client)
        assert len(sandboxes_left(sandbox_dir)) == 1
        assert client.post("/close_session").json()["status"] == "closed"
        assert sandboxes_left(sandbox_dir) == []
        assert client.post("/close_session").json()["status"] == "already closed"
        gone = client.post("/run_tests", json={})
        assert gone.status_code == 410 and "ended by /close_session" in gone.json()["detail"]


def test_an_idle_session_loses_its_sandbox(sandbox_dir):
    with TestClient(make_server(sandbox_dir, session_idle_timeout_seconds=0.5).build_app()) as client:
        seed(client)
        deadline = time.monotonic() + 30
        while sandboxes_left(sandbox_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sandboxes_left(sandbox_dir) == []
        gone = client.post("/read_file", json={"path": "bounds.py"})
        assert gone.status_code == 410 and "idle for" in gone.json()["detail"]


def test_a_seed_over_max_sandbox_disk_mb_gets_503_before_a_sandbox_is_made(sandbox_dir):
    with TestClient(make_server(sandbox_dir, max_disk_mb=16, max_sandbox_disk_mb=40).build_app()) as client:
        first, _ = seed(client), seed(client)
        client.cookies.clear()
        refused = client.post("/seed_session", json=ROWS["clamp_upper"])
        assert refused.status_code == 503 and refused.headers["Retry-After"]
        assert "max_sandbox_disk_mb (40 MB, 16 MB per sandbox)" in refused.json()["detail"]
        assert len(sandboxes_left(sandbox_dir)) == 2
        client.cookies.clear()
        client.cookies.update(first)
        assert client.post("/close_session").json()["status"] == "closed"
        seed(client)
        assert len(sandboxes_left(sandbox_dir)) == 2


def test_a_total_smaller_than_one_sandbox_is_a_config_error(sandbox_dir):
    with pytest.raises(ValueError, match="leaves no room for one sandbox"):
        make_server(sandbox_dir, max_disk_mb=64, max_sandbox_disk_mb=32)
