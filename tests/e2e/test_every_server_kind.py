"""What every server kind promises about hostile input, and its metrics, on real processes: a resources server
at 2 workers, an agent, a model server and its backend, and the head endpoint in front of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from nemo_gym import config as gym_config
from nemo_gym.process import discovery
from nemo_gym.process.launcher import Launcher

SECRET = "a-configured-session-secret-nobody-may-see"
API_KEY = "sk-an-api-key-nobody-may-see"
STACK = {
    "counter": {"resources_servers": {"example_session_state_mgmt": {"num_workers": 2, "session_secret": SECRET}}},
    "counter_agent": {
        "responses_api_agents": {
            "simple_agent": {
                "resources_server": {"type": "resources_servers", "name": "counter"},
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
            }
        }
    },
    "policy_model": {
        "responses_api_models": {
            "vllm_model": {"backend_server": {"type": "responses_api_models", "name": "scripted_backend"}, "api_key": API_KEY}
        }
    },
    "scripted_backend": {"responses_api_models": {"scripted_backend": {}}},
}
# One route of each server that takes a JSON body.
JSON_ROUTES = {
    "counter": "/seed_session",
    "counter_agent": "/run",
    "policy_model": "/v1/responses",
    "scripted_backend": "/v1/chat/completions",
}
BIG_BODY_BYTES = 50 * 1024 * 1024
BIG_REQUESTS = 4
RSS_GROWTH_LIMIT_KB = 20 * 1024


@pytest.fixture(scope="module")
def stack() -> Iterator[Launcher]:
    instances = gym_config.parse(STACK)
    discovery.check_settings(instances)
    with Launcher(instances, gym_config.free_port()) as launcher:
        yield launcher


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


def serving_processes(pid: int) -> list[int]:
    """The processes that serve requests: the server's own, or, with several workers, its uvicorn workers."""
    children = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and (entry / "stat").exists() and parent_of(entry) == pid and "resource_tracker" not in cmdline(entry)
    ]
    return children or [pid]


def parent_of(proc_entry: Path) -> int | None:
    try:
        return int((proc_entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def cmdline(proc_entry: Path) -> str:
    try:
        return (proc_entry / "cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def big_chunks() -> Iterator[bytes]:
    chunk = b"x" * (1024 * 1024)
    for _ in range(BIG_BODY_BYTES // len(chunk)):
        yield chunk


def post_big(url: str, cookies: dict[str, str], chunked: bool) -> int:
    """POST a 50 MB body, declared (Content-Length) or chunked, and return the status."""
    body = big_chunks() if chunked else b"x" * BIG_BODY_BYTES
    return requests.post(url, data=body, cookies=cookies, headers={"Content-Type": "application/json"}, timeout=60).status_code


@pytest.mark.parametrize("name", JSON_ROUTES)
@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_in_a_body_gets_422_from_every_server_kind(stack, name, constant):
    url = stack.instances[name].url + JSON_ROUTES[name]
    reply = requests.post(url, data=f'{{"value": {constant}}}', headers={"Content-Type": "application/json"}, timeout=30)
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"][0]["ctx"]["error"] == f"{constant} is not valid JSON"


@pytest.mark.parametrize("name", JSON_ROUTES)
def test_a_50_mb_body_gets_413_and_grows_no_worker_by_20_mb(stack, name):
    instance = stack.instances[name]
    url = instance.url + JSON_ROUTES[name]
    # A session of the server's, so that at 2 workers some of the big requests are forwarded.
    cookies = requests.post(instance.url + "/no_such_route", timeout=30).cookies.get_dict()
    assert cookies
    workers = serving_processes(stack.processes[name].pid)
    assert len(workers) == instance.num_workers
    before = {pid: rss_kb(pid) for pid in workers}
    statuses = [post_big(url, cookies, chunked) for chunked in (False, True) for _ in range(BIG_REQUESTS)]
    growth = {pid: rss_kb(pid) - before[pid] for pid in workers}
    assert statuses == [413] * 2 * BIG_REQUESTS
    assert max(growth.values()) < RSS_GROWTH_LIMIT_KB, growth
    assert requests.get(instance.url + "/", timeout=30).json() == {"status": "ok"}


def test_the_head_endpoint_serves_no_credential(stack):
    reply = requests.get(f"{stack.head_url}/global_config", timeout=30)
    assert reply.status_code == 200
    assert SECRET not in reply.text and API_KEY not in reply.text
    served = reply.json()
    assert served["counter"]["resources_servers"]["example_session_state_mgmt"]["session_secret"] == "<redacted>"
    assert served["policy_model"]["responses_api_models"]["vllm_model"]["api_key"] == "<redacted>"
    assert served["counter"]["resources_servers"]["example_session_state_mgmt"]["port"] == stack.instances["counter"].port


@pytest.mark.parametrize("name", [*STACK, "head"])
def test_every_server_kind_and_the_head_answer_metrics_in_prometheus_text_without_a_cookie(stack, name):
    url = stack.head_url if name == "head" else stack.instances[name].url
    reply = requests.get(f"{url}/metrics", timeout=30)
    assert reply.status_code == 200 and reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "Set-Cookie" not in reply.headers
    families = {family.name for family in text_string_to_metric_families(reply.text)}
    assert ("nemo_gym_instance_workers" if name == "head" else "nemo_gym_requests_served_here") in families
