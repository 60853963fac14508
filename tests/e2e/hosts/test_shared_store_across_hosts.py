"""Sessions that survive their host (issue 21): one PostgreSQL store shared by replicas on three hosts.

The durable counter at 2 workers on each of h1, h2, h3 (network-namespace hosts, tests/hosts.py), every
worker's store the one PostgreSQL on the host ``db`` (tests/postgres.py), behind HAProxy round robin, a
new connection per request; started once for the module. Owner leases of ``LEASE_SECONDS``; a host
silent for ``PEER_DEAD_AFTER_SECONDS`` counts as dead to the others (then its sessions' owners are judged
by their leases). swe_rebench runs beside it on each host (2 workers, the same store, the default owner
lease, its sandboxes in the host's own /tmp, behind HAProxy round robin on ``SWE_PORT``). The counter's sessions run with every standard
client (cookies kept each its own way) and, where a test says so, over MCP with the token alone.

What each test leaves behind, in order: the checkpoint, every host up; the freeze of h2 past its lease, h2
thawed; the freeze of h2 just after it committed a forwarded request, h2 thawed; the freeze of h2 with an MCP token
session of its own, adopted by h1, h2 thawed; the freeze of PostgreSQL,
PostgreSQL thawed (every lease lapsed meanwhile and renewed since); the kill of the host owning the most counter
sessions, that host down; the requests sent again with their ids, after killing the busiest host left and
starting the dead ones again, the host owning the most then killed, down; the swe_rebench test starts every
dead host again and then kills the host owning the most swe_rebench sessions, down.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from nemo_gym.client.reading import cookie_header
from nemo_gym.client.rollouts import read_rows
from nemo_gym.durable.applied import unwrap
from nemo_gym.durable.postgresql_store import SESSIONS_TABLE
from nemo_gym.durable.lease import OWNER_LEASE_SECONDS
from nemo_gym.durable.store import STORE_TIMEOUT_SECONDS
from nemo_gym.sessions.cookie import session_cookie_name
from nemo_gym.sessions.secret import instance_key
from nemo_gym.sessions.token import TOKEN_HEADER
from resources_servers.swe_rebench.app import MIB
from resources_servers.swe_rebench.cgroups import Cgroups
from responses_api_models.scripted_backend.app import SWE_REBENCH_FIXES
from tests.e2e.hosts.conftest import COUNTER, PUBLIC_PORT, REPLICA_HOSTS, SESSION_SECRET, START_TIMEOUT_SECONDS, WORKERS, ReplicaSet, counter_config
from tests.e2e.hosts.test_stacks_across_hosts import SWE_DATA, SWE_PORT, sandbox_dir
from tests.e2e.hosts.test_replicas_across_hosts import THINK_SECONDS, increments, owner_host, run_sessions, statuses
from tests.e2e.hosts.test_restore_across_hosts import Keyed, keyed_sessions, sent_again, session_id
from tests.hosts import CLIENT_MODULE, Host, Hosts, Remote, balancer_cut, server_log_lines, start_balancer, start_gym, wait_in_rotation
from tests.postgres import DATABASE, USER, Postgres, PostgresUnavailable
from tests.programs import needs
from tests.session_cookies import session_of

# Every test here starts swe_rebench, whose commands run in a bubblewrap jail.
pytestmark = needs("bwrap")

SESSIONS = 200
# Below 10 s - 2 (the freeze must stay inside a replica credential's window, below) yet not so short that a loaded
# machine lets it lapse (pg's e2e saw 2-5 s leases lapse).
LEASE_SECONDS = 6
# Shorter than conftest's: the frozen host must count as dead (so that its sessions are adopted) well
# within the freeze.
PEER_DEAD_AFTER_SECONDS = 8
# Long enough for h1 to count h2 dead, h2's lease to expire, and h1 to adopt h2's sessions; shorter than a
# replica credential's window (10 s + peer_dead_after_seconds), for the requests forwarded to h2 before it
# froze, which it reads when thawed (docs/replicas.md, its credentials: past the window they would get 401).
FREEZE_SECONDS = PEER_DEAD_AFTER_SECONDS + LEASE_SECONDS + 2
# Beyond the lease, the seconds a dead host's session has for its first 200: the refused connection is
# seen at once, then each try is a 503 waited out (Retry-After 1, at most the think time), so one more
# step, and what two shared, loaded cores make late (as tests/e2e/hosts/test_replicas_across_hosts.py).
ADOPTION_BOUND_SECONDS = THINK_SECONDS + 10
RUN_AFTER_KILL_SECONDS = LEASE_SECONDS + ADOPTION_BOUND_SECONDS
AFTER_THAW_SECONDS = 8 * THINK_SECONDS
STALE_TIMEOUT_SECONDS = 60
FENCED = re.compile(r"owner in the store is worker|owner lease of session .* lapsed")
SWE = "swe_rebench"
SWE_BALANCER = "haproxy-swe"
# Few: each session is a jailed sandbox (a tmpfs, a cgroup, bwrap for its tests) on two shared cores.
SWE_SESSIONS = 30
# What a failed swe_rebench test prints of the survivors' server logs: leases lapsed, the store failing, adoptions.
SERVERS_SAW = r"lease|session store|adopt|Traceback|Error"
SWE_TASK = read_rows(SWE_DATA)[0]  # clamp_upper: its fix is bounds.py as the scripted policy writes it
SWE_FIX_PATH = "bounds.py"
# swe_rebench keeps the default owner lease, as its users would: its verifies (30 jailed test runs at once) load the
# two shared cores, under which CI saw PostgreSQL not answer a survivor's renewal within the store's deadline; a
# lease that lapses then lets another host take the survivor's sessions, whose sandboxes stay on the survivor's disk.
SWE_LEASE_SECONDS = OWNER_LEASE_SECONDS
# How long a session's verify is tried again while answered 503 (a bound; each must end on 200 or 410 within it).
SWE_VERIFY_SECONDS = 2 * (SWE_LEASE_SECONDS + ADOPTION_BOUND_SECONDS)
# What a session whose sandbox is on the dead host's disk is told (resources_servers/swe_rebench/sandbox_root.py).
SANDBOX_ON_ANOTHER_HOST = re.compile(
    r"sandbox cannot be taken over: sandbox worker-\w+/sandbox-\w+ is gone from /tmp/swe-sandboxes-h\d on this host: .*on the disk of another host"
)
# The counter's sessions of the fault tests: one in each of these clients' hands (tests/hosts_client.py).
COOKIE_CLIENTS = ["aiohttp_cookies", "aiohttp_jar", "replacing", "requests_session", "httpx_jar"]
START = 1000
# Bounds, never expectations: how long a request of the tests' own, or a wait on the store, may take.
REQUEST_BOUND_SECONDS = 60
POLL_SECONDS = 0.01
# PostgreSQL hung (SIGSTOP) past every owner lease, so that reads get 503 too once the leases lapse.
STORE_FROZEN_SECONDS = 24
STORE_SESSIONS = 120
# A write waits at most three store deadlines (the forwarding worker's check of the owner's lease, the owner's
# renewal of its own, its commit) and what two shared, loaded cores make late, the client's own process included
# (L19: 64 writes at 18.7 to 18.9 s as the client timed them, none over 17 s at the balancer, against 3 s of slack);
# the freeze is longer, so a write that waits out the store is caught.
WRITE_BOUND_SECONDS = 3 * STORE_TIMEOUT_SECONDS + 6
HEALTH_BOUND_SECONDS = 5
HEALTH_INTERVAL_SECONDS = 0.5
# A 503 that says the request was not applied (every other 503 leaves it unknown).
NOT_APPLIED = re.compile(r"did not take effect|was not run")
# How long a request is sent again while answered 503 with Retry-After (``Remote.retried``): past a dead
# owner's lease and the adoption's bound.
RETRY_SECONDS = LEASE_SECONDS + ADOPTION_BOUND_SECONDS


def shared_config(host: Host, store: str) -> dict:
    """The durable counter and swe_rebench on ``host``, both with the shared ``store``."""
    durable = dict(durable_sessions=True, session_store=store, owner_lease_seconds=LEASE_SECONDS, peer_dead_after_seconds=PEER_DEAD_AFTER_SECONDS)
    config = counter_config(host)
    config[COUNTER]["resources_servers"]["example_session_state_mgmt"].update(durable)
    config[COUNTER]["resources_servers"]["example_session_state_mgmt"]["expose_tools_over_mcp"] = True
    swe = {"host": host.address, "port": SWE_PORT, "num_workers": WORKERS, "session_secret": SESSION_SECRET, "sandbox_dir": sandbox_dir(host)}
    swe.update(durable, owner_lease_seconds=SWE_LEASE_SECONDS)
    config[SWE] = {"resources_servers": {"swe_rebench": swe}}
    return config


@pytest.fixture(scope="module")
def database(lan: Hosts):
    try:
        database = Postgres(host=lan["db"])
    except PostgresUnavailable as error:
        pytest.skip(f"no PostgreSQL here: {error}")
    try:
        database.start()
        yield database
    finally:
        database.close()


@pytest.fixture(scope="module")
def shared(lan: Hosts, database: Postgres):
    hosts = [lan[name] for name in REPLICA_HOSTS]
    start_gym([(host, shared_config(host, database.dsn())) for host in hosts], START_TIMEOUT_SECONDS)
    start_balancer(lan["balancer"], PUBLIC_PORT, [(host.address, PUBLIC_PORT) for host in hosts])
    start_balancer(lan["balancer"], SWE_PORT, [(host.address, SWE_PORT) for host in hosts], name=SWE_BALANCER)
    return ReplicaSet(lan, hosts, f"http://balancer:{PUBLIC_PORT}", COUNTER, SESSION_SECRET, PEER_DEAD_AFTER_SECONDS)


def exact(record: dict, more: int = 0) -> bool:
    """The count read back is the seed plus every acknowledged increment (and ``more``), and the episode verified with 1.0."""
    return record["count"] == record["start"] + increments(record, 200) + more and record["reward"] == 1.0


def seeded_cookies(client) -> list[str]:
    """The line after ``ready`` of a ``sessions`` client run with ``report_seeded``."""
    return json.loads(client.stdout.readline())


def host_of(replicas: ReplicaSet, cookie: str | None) -> str | None:
    return owner_host(replicas, {"cookie": cookie})


def bounded(condition: Callable[[], Any], what: str) -> Any:
    """``condition()``, asked until it is true, within ``REQUEST_BOUND_SECONDS``; AssertionError saying ``what`` if never."""
    deadline = time.monotonic() + REQUEST_BOUND_SECONDS
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(POLL_SECONDS)
    return found


def counter_session_id(cookies: dict[str, str]) -> str:
    return session_of(instance_key(SESSION_SECRET, COUNTER), cookies[session_cookie_name(COUNTER)])["session_id"]


def store_connection(database: Postgres, autocommit: bool = True) -> psycopg.Connection:
    """A connection of this process to the shared store, over PostgreSQL's Unix socket in the db host's /tmp."""
    return psycopg.connect(host=str(database.view(database.socket_dir)), port=database.port, user=USER, dbname=DATABASE, autocommit=autocommit)


def stored_count(connection: psycopg.Connection, session_id: str) -> int:
    (row,), = connection.execute(f"SELECT state FROM {SESSIONS_TABLE} WHERE instance = %s AND session_id = %s", (COUNTER, session_id)).fetchall()
    return int(unwrap(row)[0])


def within_bounds(record: dict) -> bool:
    """acknowledged <= count <= acknowledged + unknown: no acknowledged increment lost, none applied twice, none
    applied that a 503 said did not take effect (so count == acknowledged where every reply said what happened)."""
    acknowledged = record["start"] + increments(record, 200)
    unknown = sum(path == "/increment_counter" and status == 503 and not NOT_APPLIED.search(str(detail)) for path, status, _, detail in record["steps"])
    return isinstance(record["count"], int) and acknowledged <= record["count"] <= acknowledged + unknown


def test_a_checkpoint_of_the_live_run_on_three_hosts_holds_every_acknowledged_increment(shared):
    """``gym sessions checkpoint`` given each replica's URL, run on the client's host while 200 sessions add 1
    every second through the balancer: every replica pauses, the shared store is exported once per replica
    (the rows merged), the file written, every replica resumed; the run goes on."""
    client_host = shared.client
    client_host.path("/tmp/secret").write_text(SESSION_SECRET)
    client_host.path("/tmp/secret").chmod(0o600)
    urls = [arg for host in shared.replicas for arg in ("--url", f"http://{host.name}:{PUBLIC_PORT}")]
    taken: list = []

    def checkpoint(client) -> None:
        client.stdin.write("go\n")
        client.stdin.flush()
        time.sleep(2 * THINK_SECONDS)
        began = time.monotonic()
        command = client_host.python(
            "-m", "nemo_gym.cli.main", "sessions", "checkpoint", "--instance", COUNTER, *urls, "--output", "/tmp/checkpoint.json",
            "--secret-file", "/tmp/secret", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        out, _ = command.communicate(timeout=STALE_TIMEOUT_SECONDS)
        taken.append((began, command.returncode, out))
        client.stdin.write("read\n")  # the sessions end (verify) only once the checkpoint is taken
        client.stdin.flush()

    records = run_sessions(shared, SESSIONS, 6 * THINK_SECONDS, checkpoint, verify=True, hold=True)
    (began, code, out), = taken
    assert code == 0 and f"checkpointed {SESSIONS} sessions of {COUNTER} from 3 replicas" in out, out
    assert {status for record in records for status in statuses(record)} <= {200, 503}
    assert [step for record in records for step in record["steps"] if step[1] == 503 and not step[2]] == []
    saved = {row["session_id"]: int(unwrap(row["state"])[0]) for row in json.loads(client_host.path("/tmp/checkpoint.json").read_text())["sessions"]}
    outside = {}
    for record in records:
        acked = [at for at, step in zip(record["times"], record["steps"]) if step[0] == "/increment_counter" and step[1] == 200]
        in_file = saved[session_id(record)] - record["start"]
        if not sum(at < began for at in acked) <= in_file <= len(acked) or not exact(record):
            outside[record["start"]] = (sum(at < began for at in acked), in_file, len(acked), record["count"], record["reward"])
    assert outside == {}


def test_a_host_frozen_past_its_lease_loses_no_acknowledged_write_and_its_stale_requests_are_fenced(shared):
    """h2 SIGSTOPped past its lease while sessions run through the balancer. Meanwhile each of its sessions
    is added to at h1 (it counts h2 dead once silent, and adopts the session once h2's lease has expired),
    then added to at h2 with the cookie from before (stale: h2 reads it when thawed). Thawed, h2 answers
    those 503 with the cookie naming the adopter, where the retry is served; every count read is the sum
    of the increments acknowledged to either client."""
    frozen, adopter = shared.lan["h2"], shared.lan["h1"]
    stale: list = []

    def freeze_past_the_lease(client) -> None:
        cookies = seeded_cookies(client)
        client.stdin.write("go\n")
        client.stdin.flush()
        time.sleep(THINK_SECONDS)
        frozen.freeze()
        try:
            mine = [(number, cookie) for number, cookie in enumerate(cookies) if host_of(shared, cookie) == frozen.name]
            args = {"adopt_url": f"http://{adopter.name}:{PUBLIC_PORT}", "stale_url": f"http://{frozen.name}:{PUBLIC_PORT}", "cookies": [c for _, c in mine], "seconds": FREEZE_SECONDS}
            stale.append((mine, shared.client.python("-m", CLIENT_MODULE, "stale", json.dumps(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
            time.sleep(FREEZE_SECONDS)
        finally:
            frozen.thaw()
        out, err = stale[0][1].communicate(timeout=STALE_TIMEOUT_SECONDS)
        assert stale[0][1].returncode == 0, err[-3000:]
        stale[0] = (stale[0][0], json.loads(out.splitlines()[-1]))
        client.stdin.write("read\n")  # the counts are read once every stale increment is answered
        client.stdin.flush()

    records = run_sessions(
        shared, SESSIONS, FREEZE_SECONDS + AFTER_THAW_SECONDS, freeze_past_the_lease, verify=True, report_seeded=True, hold=True, clients=COOKIE_CLIENTS
    )
    (mine, answers), = stale
    ended = {record["start"]: statuses(record) for record in records if set(statuses(record)) - {200, 503}}
    assert ended == {}
    assert [step for record in records for step in record["steps"] if step[1] == 503 and not step[2]] == []
    stale_acked = Counter()
    for (number, _), answer in zip(mine, answers):
        stale_acked[number] += sum(status == 200 for _, status, _ in answer["replies"])
    wrong = {r["start"]: (r["count"], r["start"] + increments(r, 200) + stale_acked[n], r["reward"]) for n, r in enumerate(records) if not exact(r, stale_acked[n])}
    assert wrong == {}
    stale_url = f"http://{frozen.name}:{PUBLIC_PORT}"
    at_frozen = [[reply for reply in answer["replies"] if reply[0] == stale_url][0] for answer in answers]
    not_fenced = [reply for reply in at_frozen if not (reply[1] == 503 and FENCED.search(str(reply[2])))]
    assert mine and not_fenced == []
    # Adopted by h1 (the stale client's first increments) or by h3 (the balancer's clients' first), whichever came first.
    adopters = Counter(host_of(shared, answer["retry_cookie"]) for answer in answers)
    assert [answer["replies"][-1][1] for answer in answers] == [200] * len(mine) and set(adopters) <= {"h1", "h3"}, adopters
    print(f"{len(mine)} sessions of {frozen.name}, adopted by {dict(adopters)}: each stale increment fenced (503), its retry served by the adopter")


def test_a_request_forwarded_to_a_host_frozen_after_committing_it_is_replayed_to_the_adopter_and_applied_once_with_its_original_reply(shared, database):
    """A session of h2 incremented through h1, with no Idempotency-Key (h1's router gives the request one, which every
    hop passes on). h2's worker commits it and h2 is SIGSTOPped whole before it replies: the test holds the row's lock,
    so the commit waits in PostgreSQL, freezes h2 there, then lets the lock go, and the commit goes through. h1 gives
    the forward up once h2's lease has expired and replays it to itself, the adopter: the row holds its id, so the
    reply is the one h2 committed, marked Idempotent-Replayed, and the count holds the increment once. Thawed, h2
    answers the session's stale cookie 503 naming the adopter (its copy is fenced), and the count stays right."""
    owner, via = shared.lan["h2"], shared.lan["h1"]
    owner_url, via_url = f"http://{owner.name}:{PUBLIC_PORT}", f"http://{via.name}:{PUBLIC_PORT}"
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = 'nemo_gym' AND query LIKE '%WITH input%'"
    with Remote(shared.client, REQUEST_BOUND_SECONDS) as remote:
        seeded = remote.post(owner_url, "/seed_session", {"initial_count": START}, {})
        cookies = seeded["cookies"]
        session_id = counter_session_id(cookies)
        assert seeded["status"] == 200 and host_of(shared, cookie_header(cookies)) == owner.name, seeded
        with store_connection(database, autocommit=False) as lock, store_connection(database) as watch:
            lock.execute(f"SELECT 1 FROM {SESSIONS_TABLE} WHERE instance = %s AND session_id = %s FOR UPDATE", (COUNTER, session_id))
            remote.send(via_url, "/increment_counter", {"count": 1}, cookies)
            bounded(lambda: watch.execute(waiting).fetchone()[0], "the owner's commit never waited on the row")
            owner.freeze()
            try:
                lock.commit()
                bounded(lambda: stored_count(watch, session_id) == START + 1, "the frozen owner's commit did not go through")
                reply = remote.receive()
            finally:
                owner.thaw()
        stale = remote.post(owner_url, "/increment_counter", {"count": 1}, cookies)
        again = remote.retried(RETRY_SECONDS, shared.url, "/increment_counter", {"count": 1}, stale["cookies"])
        read = remote.post(shared.url, "/get_counter_value", {}, again["cookies"])
    assert (reply["status"], reply["replayed"], reply["body"]) == (200, "true", {"success": True}), reply
    assert host_of(shared, cookie_header(reply["cookies"])) == via.name
    assert stale["status"] == 503 and FENCED.search(str(stale["body"])), stale
    assert (again["status"], read["body"]) == (200, {"count": START + 2}), (again, read)


def test_an_mcp_token_session_taken_over_while_its_owner_was_frozen_is_served_by_the_adopter_when_the_token_reaches_the_thawed_owner(shared):
    """A counter session seeded at h2, then used over MCP with its token alone, which names h2's worker for the
    session's whole life. h2 SIGSTOPped past its lease: a tool call through h1 is forwarded to h2, given up once
    h2's lease has expired, and h1 adopts the session. Thawed, h2 renews its lease and serves on, but no longer
    holds the session: the token's tool calls that reach h2 (sent to it, and through the balancer) are served
    where the session lives, not answered 503 naming the adopter (which a token client cannot follow), and the
    count holds each increment once."""
    owner, via = shared.lan["h2"], shared.lan["h1"]
    owner_url, via_url = f"http://{owner.name}:{PUBLIC_PORT}", f"http://{via.name}:{PUBLIC_PORT}"
    with Remote(shared.client, REQUEST_BOUND_SECONDS) as remote:
        seeded = remote.post(owner_url, "/seed_session", {"initial_count": START}, {})
        assert seeded["status"] == 200 and host_of(shared, cookie_header(seeded["cookies"])) == owner.name, seeded
        tool = {"client": "mcp", "token": seeded["body"]["mcp"]["headers"][TOKEN_HEADER]}
        owner.freeze()
        try:
            adopted = remote.retried(FREEZE_SECONDS, via_url, "/increment_counter", {"count": 1}, {}, **tool)
        finally:
            owner.thaw()
        at_owner = remote.retried(RETRY_SECONDS, owner_url, "/increment_counter", {"count": 1}, {}, **tool)
        balanced = [remote.retried(RETRY_SECONDS, shared.url, "/increment_counter", {"count": 1}, {}, **tool) for _ in shared.replicas]
        read = remote.retried(RETRY_SECONDS, owner_url, "/get_counter_value", {}, {}, **tool)
    assert adopted["status"] == 200, adopted
    assert (at_owner["status"], [reply["status"] for reply in balanced]) == (200, [200] * len(balanced)), (at_owner, balanced)
    assert read["body"] == {"count": START + 2 + len(balanced)}, read


def test_while_postgresql_is_frozen_writes_get_503_within_the_deadline_get_slash_answers_everywhere_and_no_count_is_wrong(shared, database):
    """PostgreSQL on its host SIGSTOPped for ``STORE_FROZEN_SECONDS`` (a hung host: connections open, nothing
    answered), past every owner lease, while sessions of every cookie client and of MCP token clients add 1 every
    second through the balancer, and ``GET /`` is asked of every replica throughout. Every reply is 200 or 503
    with Retry-After, within ``WRITE_BOUND_SECONDS``; every ``GET /`` answers 200 within ``HEALTH_BOUND_SECONDS``;
    and for every session, acknowledged <= count <= acknowledged + the 503s that did not say it was not applied."""
    probes: list[subprocess.Popen] = []

    def freeze_the_store(client) -> None:
        urls = [f"http://{host.name}:{PUBLIC_PORT}" for host in shared.replicas]
        args = {"urls": urls, "seconds": STORE_FROZEN_SECONDS + 2 * THINK_SECONDS, "interval": HEALTH_INTERVAL_SECONDS, "timeout": HEALTH_BOUND_SECONDS}
        probes.append(shared.client.python("-m", CLIENT_MODULE, "health", json.dumps(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        client.stdin.write("go\n")
        client.stdin.flush()
        time.sleep(THINK_SECONDS)
        database.freeze()
        try:
            time.sleep(STORE_FROZEN_SECONDS)
        finally:
            database.thaw()

    clients = [*COOKIE_CLIENTS, "mcp_token"]
    records = run_sessions(shared, STORE_SESSIONS, STORE_FROZEN_SECONDS + AFTER_THAW_SECONDS, freeze_the_store, clients=clients)
    out, err = probes[0].communicate(timeout=REQUEST_BOUND_SECONDS)
    assert probes[0].returncode == 0, err[-3000:]
    health = json.loads(out.splitlines()[-1])
    steps = [(step, took) for record in records for step, took in zip(record["steps"], record["took"])]
    refused = [step for step, _ in steps if step[1] == 503]
    assert refused and [step for step, _ in steps if step[1] not in (200, 503)] == [] and [step for step in refused if not step[2]] == []
    assert [(step[:2], round(took, 1)) for step, took in steps if took > WRITE_BOUND_SECONDS] == []
    assert {url: [answer for answer in answers if answer[1] != 200 or answer[0] > HEALTH_BOUND_SECONDS] for url, answers in health.items()} == {url: [] for url in health}
    assert min(len(answers) for answers in health.values()) > STORE_FROZEN_SECONDS / HEALTH_BOUND_SECONDS
    wrong = {r["start"]: (r["count"], increments(r, 200), [step[1:] for step in r["steps"] if step[1] != 200]) for r in records if not within_bounds(r)}
    assert wrong == {}
    print(f"{len(refused)} of {len(steps)} replies 503 while the store was frozen; slowest reply {max(took for _, took in steps):.1f} s, slowest GET / {max(a[0] for answers in health.values() for a in answers):.2f} s")


def test_the_sessions_of_a_host_killed_whole_are_adopted_within_the_lease_and_every_episode_scores(shared):
    """The host owning the most sessions SIGKILLed whole between +1 and +2; it stays down."""
    killed: list[tuple[Host, float, int]] = []

    def kill_the_busiest(client) -> None:
        owners = Counter(host_of(shared, cookie) for cookie in seeded_cookies(client))
        (name, held), = owners.most_common(1)
        host = shared.lan[name]
        host.kill()
        killed.append((host, time.monotonic(), held))
        client.stdin.write("go\n")
        client.stdin.flush()

    records = run_sessions(shared, SESSIONS, RUN_AFTER_KILL_SECONDS, kill_the_busiest, verify=True, report_seeded=True, clients=COOKIE_CLIENTS)
    (host, at, held), = killed
    assert host.processes() == set()
    wrong = {r["start"]: ([step[1:] for step in r["steps"] if step[1] != 200], r["count"], r["reward"]) for r in records if set(statuses(r)) - {200, 503} or not exact(r)}
    assert wrong == {}, balancer_cut(shared.lan["balancer"])
    late = {r["start"]: first_200_after(r, at) for r in records if (first_200_after(r, at) or float("inf")) - at > LEASE_SECONDS + ADOPTION_BOUND_SECONDS}
    assert late == {}
    assert held > 0 and Counter(owner_host(shared, r) for r in records)[host.name] == 0
    print(f"killed {host.name}, owner of {held} sessions; slowest first 200 after the kill: {max(first_200_after(r, at) - at for r in records):.1f} s")


def first_200_after(record: dict, moment: float) -> float | None:
    """When the session's first request after ``moment`` answered 200 came back (monotonic; the client's host shares the clock)."""
    return next((at for at, step in zip(record["times"], record["steps"]) if at > moment and step[1] == 200), None)


def revive(shared: ReplicaSet, database: Postgres) -> None:
    """Start again (new workers, the same store) every replica host an earlier test killed, and wait until the
    swe_rebench balancer has it back in its rotation."""
    down = [host for host in shared.replicas if not host.processes()]
    start_gym([(host, shared_config(host, database.dsn())) for host in down], START_TIMEOUT_SECONDS)
    for host in down:
        wait_in_rotation(shared.lan["balancer"], SWE_BALANCER, shared.replicas.index(host) + 1, START_TIMEOUT_SECONDS)


def kill_the_busiest_of(shared: ReplicaSet, sessions: list[Keyed]) -> Host:
    (name, _), = Counter(session.owner_host(shared) for session in sessions).most_common(1)
    shared.lan[name].kill()
    return shared.lan[name]


def test_an_increment_sent_again_with_its_id_after_its_host_was_killed_and_after_a_restart_is_applied_once_with_its_original_reply(shared, database):
    """Sessions through the balancer with requests and httpx, each incremented twice under ids of its own (after the
    kill above, on the two hosts left). The host owning the most is killed whole, and every increment is sent again
    with its id (its sessions adopted by the host left): its original reply comes back, marked Idempotent-Replayed,
    and the count holds it once. Then the dead hosts are started again, and the host left, the owner of every
    session now, is killed whole: each session is taken up from the store by a new worker of a restarted host, and
    the same again. A request is sent again as a client is told to: after a 503's Retry-After, and, under its id,
    after the balancer's own 502 (the first request after a kill got one now and then: printed)."""
    with Remote(shared.client, REQUEST_BOUND_SECONDS) as remote:
        sessions = keyed_sessions(remote, shared.url, RETRY_SECONDS)
        killed = kill_the_busiest_of(shared, sessions)
        after_kill = sent_again(remote, shared.url, sessions, RETRY_SECONDS)
        revive(shared, database)
        last = kill_the_busiest_of(shared, sessions)
        after_restart = sent_again(remote, shared.url, sessions, RETRY_SECONDS)
        bad_gateways = remote.bad_gateways
    assert (after_kill, after_restart) == ({}, {})
    survivors = {session.owner_host(shared) for session in sessions}
    assert killed != last and survivors.isdisjoint({last.name}) and None not in survivors, survivors
    print(f"killed {killed.name} then {last.name}; balancer's 502s sent again under their ids: {[(bad['path'], bad['body'][:60]) for bad in bad_gateways]}")


def test_the_swe_rebench_sessions_of_a_host_killed_whole_get_410_naming_why_and_the_others_score(shared, database):
    """swe_rebench sessions seeded and fixed on three hosts; the host owning the most SIGKILLed whole; then each
    verifies. A session whose sandbox was on the dead host is taken over by a survivor (its owner's lease lapsed)
    but its sandbox is on the dead host's disk: 410 saying so, never a 200 (no grade of a fresh sandbox or an
    empty patch) and never a silent new session; every other session verifies with 1.0."""
    revive(shared, database)
    swe = replace(shared, url=f"http://balancer:{SWE_PORT}", instance=SWE)
    killed: list[tuple[str, list[str | None]]] = []

    def kill_the_busiest(client) -> None:
        owners = [host_of(swe, cookie) for cookie in seeded_cookies(client)]
        (name, _), = Counter(owners).most_common(1)
        shared.lan[name].kill()
        killed.append((name, owners))
        client.stdin.write("go\n")
        client.stdin.flush()

    fix = {"row": SWE_TASK, "path": SWE_FIX_PATH, "content": SWE_REBENCH_FIXES[SWE_FIX_PATH]}
    try:
        records = run_sessions(swe, SWE_SESSIONS, SWE_VERIFY_SECONDS, kill_the_busiest, mode="swe_sessions", **fix)
    finally:
        for name, _ in killed:  # the dead host's sandbox cgroups (empty; the host's tmpfs went with it)
            cgroups = Cgroups.for_root(Path(sandbox_dir(shared.lan[name])), MIB, 1)
            cgroups.sweep(set)
            cgroups.close()
    (dead, owners), = killed
    assert set(owners) == set(REPLICA_HOSTS)
    assert [step[:2] for record in records for step in record["steps"][:2] if step[1] != 200] == []
    ends = [(owner, record["steps"][-1][1], record["steps"][-1][3], record["reward"]) for owner, record in zip(owners, records)]
    lost = [end for end in ends if end[0] == dead]
    assert lost and [end for end in lost if not (end[1] == 410 and SANDBOX_ON_ANOTHER_HOST.search(str(end[2])))] == []
    failed = [(owner, record["steps"]) for owner, record, end in zip(owners, records, ends) if owner != dead and end[1:] != (200, None, 1.0)]
    assert failed == [], {name: server_log_lines(shared.lan[name], SERVERS_SAW)[-40:] for name in REPLICA_HOSTS if name != dead}
    verified = {status for record in records for path, status, _, _ in record["steps"] if path == "/verify"}
    assert verified <= {200, 410, 503}
    print(f"killed {dead}, owner of {len(lost)} of {SWE_SESSIONS} swe_rebench sessions: each 410 naming its sandbox on another host; the other {SWE_SESSIONS - len(lost)} scored 1.0")
