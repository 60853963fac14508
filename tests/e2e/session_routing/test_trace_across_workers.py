"""A W3C trace sent on a forwarded request reaches the owner's handler: real processes, a server at 4 workers."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.config.paths import search_roots
from nemo_gym.process import discovery
from nemo_gym.process.launcher import Launcher
from nemo_gym.sessions.worker import WORKER_HEADER
from nemo_gym.client.owner_pool import cookie_owner
from nemo_gym.sessions.cookie import session_cookie_name

ROOT = Path(__file__).resolve().parents[2] / "servers"
NAME = "trace_echo"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACESTATE = "rojo=00f067aa0ba902b7"


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    config = tmp_path_factory.mktemp("trace") / "trace.yaml"
    # Forwarded, not handed off: a handed-off connection's bytes reach the owner untouched, a forward's are rebuilt.
    settings = {"entrypoint": "app.py", "num_workers": 4, "domain": "other", "place_sessions": True, "hand_off": False}
    config.write_text(json.dumps({NAME: {"resources_servers": {NAME: settings}}}))
    instances = discovery.load([config], roots=search_roots([ROOT]))
    launcher = Launcher(instances, gym_config.free_port(), {"NEMO_GYM_STATE_DIR": str(tmp_path_factory.mktemp("trace_state"))}).start(90)
    yield launcher
    launcher.stop()


def post(url: str, cookie: str | None = None) -> tuple[dict, str, dict[str, str]]:
    """One request on a connection of its own: the echo, the receiving worker, the reply's cookies."""
    headers = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE, "Content-Type": "application/json"}
    if cookie:
        headers["Cookie"] = cookie
    with urllib.request.urlopen(urllib.request.Request(f"{url}/trace", data=b"{}", headers=headers), timeout=30) as reply:
        cookies = dict(header.split(";", 1)[0].split("=", 1) for header in reply.headers.get_all("Set-Cookie") or [])
        return json.load(reply), reply.headers[WORKER_HEADER], cookies


def test_a_trace_sent_on_a_forwarded_request_reaches_the_owners_handler(launcher):
    url = launcher.instances[NAME].url
    forwarded = []
    for _ in range(12):
        echo, receiving, cookies = post(url)
        owner = cookie_owner(cookies[session_cookie_name(NAME)])  # the cookie's payload, read without the secret
        echo_again, receiving_again, _ = post(url, "; ".join(f"{key}={value}" for key, value in cookies.items()))
        assert echo["worker"] == echo_again["worker"] == owner
        forwarded += [echo for echo, worker in ((echo, receiving), (echo_again, receiving_again)) if worker != owner]
    assert forwarded, "some requests were received by a worker other than their owner"
    assert all((echo["traceparent"], echo["tracestate"]) == (TRACEPARENT, TRACESTATE) for echo in forwarded)
