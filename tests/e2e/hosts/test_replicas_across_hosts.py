"""One server, replicas on three hosts behind HAProxy round robin, a new connection per request (issue 20).

The counter at 2 workers runs on each of h1, h2 and h3 (network-namespace hosts, tests/hosts.py),
each with ``host`` its own address and the same ``session_secret``, started once for the module
(the ``replicas`` fixture). The test client runs in a host of its own. A session belongs to the host
whose address its signed cookie names (the owner replica). The last two tests take hosts down: the
whole-host kill h3, then the power-off h1.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import time
from http.cookies import SimpleCookie

import pytest

from nemo_gym.assembly import REPLICA_RETRY_SECONDS
from nemo_gym.sessions.cookie import session_cookie_name
from nemo_gym.sessions.secret import instance_key
from tests.e2e.hosts.conftest import PUBLIC_PORT
from tests.hosts import CLIENT_MODULE, run_client
from tests.hosts_client import PATIENCE_SECONDS
from tests.session_cookies import session_of

EPISODES = 200
CLIENTS = ["aiohttp_jar", "httpx_jar", "requests_session", "urllib_cookiejar", "replacing"]
EPISODES_TIMEOUT_SECONDS = 300
FREEZE_SECONDS = 10
FROZEN_SESSIONS = 60
DOWN_SESSIONS = 200
THINK_SECONDS = 1.0
# Beyond the bound itself, the seconds a down host's sessions have to get their 410: a worker counts the
# silence from its own first unanswered connect, and answers 410 only to a step that starts once it is over,
# so one more step (the silent replica retried for REPLICA_RETRY_SECONDS, then the think time), and the
# seconds steps are late on two shared, loaded cores (a CI run at 5 s of slack ended 18 sessions on 503s).
SLACK_SECONDS = REPLICA_RETRY_SECONDS + THINK_SECONDS + 10
READY_TIMEOUT_SECONDS = 120


@pytest.mark.parametrize("client", CLIENTS)
def test_every_counter_episode_of_every_standard_client_keeps_its_count_across_three_hosts(replicas, client):
    args = {"client": client, "url": replicas.url, "episodes": EPISODES}
    results = run_client(replicas.client, "episodes", args, EPISODES_TIMEOUT_SECONDS)
    errors = [result["error"] for result in results if "error" in result]
    assert sum(result["reward"] == 1.0 for result in results) == EPISODES, (len(errors), errors[:3])


def test_no_port_of_a_host_but_the_public_one_serves_a_request_from_outside_the_replicas(replicas):
    urls = [
        f"http://{host.address}:{port}"
        for host in replicas.replicas
        for port in sorted({port for _, port in host.listening()} - {PUBLIC_PORT})
    ]
    assert urls, "every host listens on its head endpoint's port at least"
    outcomes = run_client(replicas.client, "refused", {"urls": urls, "timeout": 30}, 60)
    served = {url: outcome for url, outcome in outcomes.items() if not (outcome == 401 or isinstance(outcome, str))}
    assert served == {}


def owner_host(replicas, record: dict) -> str | None:
    """The name of the host whose address the session's signed cookie names (None: no host's)."""
    cookie = SimpleCookie(record["cookie"] or "").get(session_cookie_name(replicas.instance))
    session = json.dumps(session_of(instance_key(replicas.secret, replicas.instance), cookie.value)) if cookie else ""
    return next((host.name for host in replicas.replicas if re.search(rf"(?<![\d.]){re.escape(host.address)}(?!\d)", session)), None)


def run_sessions(replicas, sessions: int, seconds: float, while_ready, mode: str = "sessions", **options) -> list[dict]:
    """Sessions (counter ones, or those of another of tests/hosts_client.py's modes) run from the client's host
    through ``replicas.url``; each session's record (the client's ``mode`` takes ``options`` too).

    Once every session is seeded and added to once, ``while_ready(client)`` is called; the sessions go
    on for ``seconds`` from the line it writes to the client's stdin."""
    args = {"url": replicas.url, "sessions": sessions, "seconds": seconds, "think": THINK_SECONDS, **options}
    client = replicas.client.python(
        "-m", CLIENT_MODULE, mode, json.dumps(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        ready, _, _ = select.select([client.stdout], [], [], READY_TIMEOUT_SECONDS)
        if not (ready and client.stdout.readline() == "ready\n"):
            client.kill()
            raise AssertionError(f"the client's sessions were not seeded:\n{client.communicate()[1][-3000:]}")
        while_ready(client)
        # The run, then each session's read and verify, each sent again while answered 503 for at most PATIENCE_SECONDS.
        out, err = client.communicate(timeout=seconds + READY_TIMEOUT_SECONDS + 2 * PATIENCE_SECONDS)
    finally:
        client.kill()
        client.wait()
    assert client.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])


def statuses(record: dict) -> list[int]:
    return [status for _, status, _, _ in record["steps"]]


def increments(record: dict, status: int) -> int:
    return sum(path == "/increment_counter" and code == status for path, code, _, _ in record["steps"])


def test_a_host_frozen_for_ten_seconds_loses_none_of_its_sessions(replicas):
    """h2 SIGSTOPped for 10 s while sessions run, then SIGCONTed: no session ends, every count is kept."""
    frozen = replicas.lan["h2"]

    def freeze_ten_seconds(client) -> None:
        client.stdin.write("go\n")
        client.stdin.flush()
        time.sleep(THINK_SECONDS)
        frozen.freeze()
        try:
            time.sleep(FREEZE_SECONDS)
        finally:
            frozen.thaw()

    records = run_sessions(replicas, FROZEN_SESSIONS, FREEZE_SECONDS + 4 * THINK_SECONDS, freeze_ten_seconds)
    ended = {record["start"]: statuses(record) for record in records if set(statuses(record)) - {200, 503}}
    assert ended == {}
    no_retry_after = [step for record in records for step in record["steps"] if step[1] == 503 and not step[2]]
    assert no_retry_after == []
    # A step answered 503 may still have been done by its owner once it thawed.
    wrong = [r for r in records if not (r["start"] + increments(r, 200) <= (r["count"] or 0) <= r["start"] + increments(r, 200) + increments(r, 503))]
    assert wrong == []
    frozen_sessions = [record for record in records if owner_host(replicas, record) == frozen.name]
    assert frozen_sessions and all(statuses(record)[-1] == 200 for record in frozen_sessions)


def assert_lost_and_kept(replicas, records: list[dict], gone, after: str) -> None:
    """The sessions of the host ``gone`` saw statuses matching ``after`` once it went (the last a 410 that
    names it; every 503 with Retry-After), and every other session kept its count."""
    others = [record for record in records if owner_host(replicas, record) != gone.name]
    not_kept = {r["start"]: statuses(r) for r in others if set(statuses(r)) != {200} or r["count"] != r["start"] + increments(r, 200)}
    assert not_kept == {}
    lost = [record for record in records if owner_host(replicas, record) == gone.name]
    assert lost and others
    seen = {r["start"]: "".join(f"{status} " for status in statuses(r)[2:]) for r in lost}
    assert {start: after_down for start, after_down in seen.items() if not re.fullmatch(after, after_down)} == {}
    assert [step for r in lost for step in r["steps"] if step[1] == 503 and not step[2]] == []
    details = [r["steps"][-1][3] for r in lost]
    assert all(gone.address in str(detail) for detail in details), details[:3]


def run_until_dead(replicas, take_down) -> list[dict]:
    """Sessions through the balancer; once seeded, ``take_down()``, then steps until the bound is over."""

    def down_then_go(client) -> None:
        take_down()
        client.stdin.write("go\n")
        client.stdin.flush()

    return run_sessions(replicas, DOWN_SESSIONS, replicas.peer_dead_after_seconds + SLACK_SECONDS, down_then_go)


def test_a_killed_hosts_sessions_get_410_naming_it_and_every_other_session_keeps_its_count(replicas):
    """Every process of h3 SIGKILLed, its kernel still refusing connections; h3 stays down."""
    killed = replicas.lan["h3"]
    records = run_until_dead(replicas, killed.kill)
    assert killed.processes() == set()
    assert_lost_and_kept(replicas, records, killed, r"(503 )*410 ")


def test_a_host_gone_from_the_network_has_its_sessions_answered_503_then_410_naming_it_and_the_others_kept(replicas):
    """After the kill of h3: h1 unplugged (nothing answers for it, not even a refusal) and every process of
    it SIGKILLed, as a host that lost power; h2 keeps serving."""
    gone = replicas.lan["h1"]

    def power_off() -> None:
        gone.unplug()
        gone.kill()

    records = run_until_dead(replicas, power_off)
    assert_lost_and_kept(replicas, records, gone, r"(503 )+410 ")
