"""Export from one replica set, restore into a fresh one on other hosts (issue 21, item 4): every session continues.

The durable counter at 2 workers on h1 (SQLite in h1's own /tmp) behind HAProxy round robin, which also
lists h2 and h3 (down at first). 200 sessions are seeded and added to once through it; then
``gym sessions export`` runs on h1, h1 is killed whole, the file is restored (``gym sessions restore``)
into the store of h2 and of h3 (each its own SQLite, other hosts, other worker ids), and the counter is
started there. The sessions go on with the cookies h1 gave them (naming h1's replica and workers): each
is taken up on its first request by the host that request reaches, and served there from then on. Beside
them, sessions driven with requests and httpx under request ids of their own send their increments again
once restored: each gets its original reply, applied once.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

from nemo_gym.client.reading import cookie_header

from nemo_gym.sessions.cookie import session_cookie_name
from nemo_gym.sessions.secret import instance_key
from tests.e2e.hosts.conftest import COUNTER, PUBLIC_PORT, REPLICA_HOSTS, SESSION_SECRET, PEER_DEAD_AFTER_SECONDS, START_TIMEOUT_SECONDS, ReplicaSet, counter_config
from tests.e2e.hosts.test_replicas_across_hosts import increments, owner_host, run_sessions, statuses
from tests.hosts import Host, Remote, run_json, start_balancer, start_gym, wait_in_rotation
from tests.session_cookies import session_of

SESSIONS = 200
CONTINUE_SECONDS = 3
STATE_FILE = "/tmp/nemo_gym_state/sessions/counter.sqlite3"
CLI_TIMEOUT_SECONDS = 60
KEYED_SESSIONS = 24
KEYED_START = 5000
# Bounds, never expectations: how long a request of the keyed sessions may take, and may be answered 503 (each
# retried after its Retry-After, as a client is told to).
REQUEST_BOUND_SECONDS = 60
RETRY_SECONDS = 30


@dataclass
class Keyed:
    """A counter session driven with ``client`` (requests or httpx), its increments by request id and their replies."""

    client: str
    start: int
    cookies: dict[str, str]
    replies: dict[str, tuple[int, Any]] = field(default_factory=dict)

    def owner_host(self, replicas: ReplicaSet) -> str | None:
        return owner_host(replicas, {"cookie": cookie_header(self.cookies)})


def keyed_sessions(remote: Remote, url: str, retry_seconds: float) -> list[Keyed]:
    """``KEYED_SESSIONS`` sessions, alternately with requests and httpx, each incremented twice under ids of its own."""
    sessions = []
    for number in range(KEYED_SESSIONS):
        session = Keyed(("requests", "httpx")[number % 2], KEYED_START + 10 * number, {})
        seeded = remote.retried(retry_seconds, url, "/seed_session", {"initial_count": session.start}, {}, client=session.client)
        assert seeded["status"] == 200, seeded
        session.cookies = seeded["cookies"]
        for _ in range(2):
            key = f"keyed-{uuid.uuid4()}"
            reply = remote.retried(retry_seconds, url, "/increment_counter", {"count": 1}, session.cookies, key, session.client)
            assert reply["status"] == 200 and reply["replayed"] is None, reply
            session.cookies, session.replies[key] = reply["cookies"], (reply["status"], reply["body"])
        sessions.append(session)
    return sessions


def sent_again(remote: Remote, url: str, sessions: list[Keyed], retry_seconds: float) -> dict[int, tuple]:
    """Every increment sent again with its id (and the cookies the session holds now), and the count read: per session
    whose replies are not the originals marked Idempotent-Replayed, or whose count is not its start + 2, what it got."""
    wrong = {}
    for session in sessions:
        replies = []
        for key in session.replies:
            reply = remote.retried(retry_seconds, url, "/increment_counter", {"count": 1}, session.cookies, key, session.client)
            session.cookies = reply["cookies"]
            replies.append((reply["status"], reply["body"], reply["replayed"]))
        read = remote.retried(retry_seconds, url, "/get_counter_value", {}, session.cookies, client=session.client)
        if replies != [(status, body, "true") for status, body in session.replies.values()] or read["body"] != {"count": session.start + 2}:
            wrong[session.start] = (replies, read["status"], read["body"])
    return wrong


def durable(host: Host) -> dict:
    config = counter_config(host)
    config[COUNTER]["resources_servers"]["example_session_state_mgmt"]["durable_sessions"] = True
    return config


def gym_sessions(host: Host, *args: str) -> str:
    """``gym sessions ARGS --instance counter`` on ``host`` (its own state directory): what it printed."""
    process = host.python("-m", "nemo_gym.cli.main", "sessions", *args, "--instance", COUNTER, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = process.communicate(timeout=CLI_TIMEOUT_SECONDS)
    assert process.returncode == 0, out
    return out


def session_id(record: dict) -> str:
    return session_of(instance_key(SESSION_SECRET, COUNTER), SimpleCookie(record["cookie"]).get(session_cookie_name(COUNTER)).value)["session_id"]


def owners(host: Host) -> dict[str, str | None]:
    """Each session's owner in the host's store, read on the host (SQLite resolves /proc/PID/root to this process's own /tmp)."""
    code = f"import json, sqlite3; print(json.dumps(dict(sqlite3.connect({STATE_FILE!r}).execute('SELECT session_id, owner FROM sessions'))))"
    return run_json(host, ["-c", code], CLI_TIMEOUT_SECONDS)


def test_sessions_exported_from_one_replica_set_continue_in_a_fresh_one_on_other_hosts(lan):
    old, new = lan[REPLICA_HOSTS[0]], [lan[name] for name in REPLICA_HOSTS[1:]]
    start_gym([(old, durable(old))], START_TIMEOUT_SECONDS)
    start_balancer(lan["balancer"], PUBLIC_PORT, [(host.address, PUBLIC_PORT) for host in [old, *new]])
    replicas = ReplicaSet(lan, [old, *new], f"http://balancer:{PUBLIC_PORT}", COUNTER, SESSION_SECRET, PEER_DEAD_AFTER_SECONDS)
    keyed_wrong: list[dict] = []

    def move_to_new_hosts(client) -> None:
        keyed = keyed_sessions(remote, replicas.url, RETRY_SECONDS)
        gym_sessions(old, "export", "--output", "/tmp/sessions.json")
        old.kill()
        for host in new:
            shutil.copyfile(old.path("/tmp/sessions.json"), host.path("/tmp/sessions.json"))
            gym_sessions(host, "restore", "--input", "/tmp/sessions.json")
        start_gym([(host, durable(host)) for host in new], START_TIMEOUT_SECONDS)
        for number, _ in enumerate(new, 2):  # until HAProxy's checks find the new hosts (its servers s2, s3) up
            wait_in_rotation(lan["balancer"], "haproxy", number, START_TIMEOUT_SECONDS)
        keyed_wrong.append(sent_again(remote, replicas.url, keyed, RETRY_SECONDS))
        client.stdin.write("go\n")
        client.stdin.flush()

    with Remote(lan["client"], REQUEST_BOUND_SECONDS) as remote:
        records = run_sessions(replicas, SESSIONS, CONTINUE_SECONDS, move_to_new_hosts)
    assert keyed_wrong == [{}]
    print("sessions taken up per host:", Counter(owner_host(replicas, record) for record in records))
    assert [owner_host(replicas, r) for r in records].count(None) == 0
    not_continued = {r["start"]: (r["steps"][2:], r["count"]) for r in records if set(statuses(r)) - {200, 503} or r["count"] != r["start"] + increments(r, 200)}
    assert not_continued == {}
    assert [step for r in records for step in r["steps"] if step[1] == 503 and not step[2]] == []
    taken_up = Counter(owner_host(replicas, record) for record in records)
    assert set(taken_up) <= {host.name for host in new}, taken_up
    stores = [owners(host) for host in new]
    owned_twice_or_never = [r["start"] for r in records if sum(store.get(session_id(r)) is not None for store in stores) != 1]
    assert owned_twice_or_never == []
