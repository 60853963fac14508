"""swe_rebench's durable sessions: a sandbox exported, re-attached by another worker and ended; sweeps spare durable
sandboxes; a stored state naming a gone sandbox, or anything outside the sandbox root, is refused and touches nothing."""

import json
import os
import re
import tempfile

import pytest
from starlette.testclient import TestClient

from nemo_gym.durable.sqlite_store import SQLiteStore
from nemo_gym.openai_utils import new_response
from nemo_gym.routing.request_id import ID_HEADER_NAME
from resources_servers.swe_rebench.app import DEFAULT_TASKS_DIR, MIB
from resources_servers.swe_rebench.cgroups import Cgroups
from resources_servers.swe_rebench.sandbox import load_tasks
from resources_servers.swe_rebench.sandbox_root import SANDBOX_UIDS, SandboxRoot
from resources_servers.swe_rebench.sessions import sandbox_names
from resources_servers.swe_rebench.tests.test_app import ROWS, make_server, sandboxes_left, seeded, verify
from resources_servers.swe_rebench.tmpfs import mounts_under, remove_tree
from responses_api_models.scripted_backend.app import SWE_REBENCH_FIXES
from tests.full_filesystem import full, mounted_tmpfs, needs_mount
from tests.unit_tests.durable.filling import commit_until_refused

FIX = SWE_REBENCH_FIXES["bounds.py"]
# A verify sent under an id of its own, as Gym's client sends it: stored with its reply, or not at all.
ONCE = {ID_HEADER_NAME: "verify-once"}


@pytest.fixture
def sandbox_dir(tmp_path):
    """The sandbox root; whatever the test kept in it is unmounted and removed after it, cgroups included."""
    yield tmp_path / "sandboxes"
    remove_tree(tmp_path / "sandboxes")
    cgroups = Cgroups.for_root((tmp_path / "sandboxes").resolve(), MIB, 1)
    cgroups.sweep(set)
    cgroups.close()


@pytest.fixture
def exported(sandbox_dir):
    """A session seeded and fixed in one worker, which then stopped sparing its sandbox: (session id, state, cookies, uid)."""
    server = make_server(sandbox_dir)
    with TestClient(server.build_app()) as client:
        seeded(client)
        assert client.post("/write_file", json={"path": "bounds.py", "content": FIX}).status_code == 200
        ((session_id, sandbox),) = server.sandboxes.items()
        state = server.sandboxes.export(session_id)
        server.root.kept = lambda: sandbox_names([state])
        cookies = dict(client.cookies)
    return session_id, state, cookies, sandbox.uid


@pytest.fixture
def adopter(sandbox_dir, exported):
    """Another worker of the same instance, running, keeping the exported session's sandbox in its sweeps."""
    server = make_server(sandbox_dir)
    server.root.kept = lambda: sandbox_names([exported[1]])
    with TestClient(server.build_app(), cookies=exported[2]) as client:
        yield server, client


def verify_row() -> dict:
    return {**ROWS["clamp_upper"], "response": new_response().model_dump(mode="json")}


def verify_reply(client):
    return client.post("/verify", json=verify_row())


def forged(state: str, **changes) -> str:
    return json.dumps({**json.loads(state), **changes})


def test_a_seeded_session_exports_its_task_its_sandbox_under_the_root_and_its_seed_commit(sandbox_dir, exported):
    _, state, _, _ = exported
    fields = json.loads(state)
    assert fields.keys() == {"task_id", "sandbox", "base_commit"}
    assert fields["task_id"] == "clamp_upper" and re.fullmatch("[0-9a-f]{40}", fields["base_commit"])
    assert [fields["sandbox"]] == [f"{path.parent.name}/{path.name}" for path in sandbox_dir.glob("worker-*/sandbox-*")]


def test_a_stopping_worker_spares_its_durable_sandbox_mounted_with_its_files(sandbox_dir, exported):
    (sandbox,) = sandbox_dir.glob("worker-*/sandbox-*")
    assert mounts_under(sandbox_dir) == [sandbox]
    assert (sandbox / "repo" / "bounds.py").read_text() == FIX


def test_a_restored_session_continues_in_its_own_sandbox_jailed_as_before(sandbox_dir, exported, adopter):
    session_id, state, _, uid = exported
    server, client = adopter
    server.sandboxes.restore(session_id, state)
    assert client.post("/read_file", json={"path": "bounds.py"}).json()["content"] == FIX
    look = {"command": "id -u; pwd; ls -a / /tmp"}
    adopted = client.post("/run_command", json=look).json()["output"].split("\n", 2)
    fresh = seeded(TestClient(client.app)).post("/run_command", json=look).json()["output"].split("\n", 2)
    assert adopted[:2] == [str(uid), "/repo"] and uid in SANDBOX_UIDS
    # The same jail as a session seeded here: the same view of the system, nothing of the host's sandboxes.
    assert adopted[2] == fresh[2] and fresh[0] != adopted[0]
    assert verify(client)["reward"] == 1.0
    assert not (sandbox_dir / json.loads(state)["sandbox"]).exists()


def test_an_export_names_nothing_for_a_session_this_worker_does_not_hold_or_is_still_seeding(adopter):
    server, _ = adopter
    assert server.sandboxes.export("never-seeded") is None
    server.sandboxes["seeding"] = server.root.make(load_tasks(DEFAULT_TASKS_DIR)["clamp_upper"])
    assert server.sandboxes.export("seeding") is None


def test_a_restored_session_whose_sandbox_is_gone_gets_410_with_the_reason_never_a_fresh_sandbox(sandbox_dir, exported, adopter):
    session_id, state, _, _ = exported
    server, client = adopter
    (sandbox,) = sandbox_dir.glob("worker-*/sandbox-*")
    remove_tree(sandbox)
    server.sandboxes.restore(session_id, state)
    reply = client.post("/read_file", json={"path": "bounds.py"})
    assert reply.status_code == 410 and f"{sandbox.parent.name}/{sandbox.name}" in reply.json()["detail"]
    assert "is gone" in reply.json()["detail"] and "seed" in reply.json()["detail"]
    assert "on the disk of another host" in reply.json()["detail"], "a store shared across hosts can hand it to a host that never had it"
    # Its row goes at the next write, and the session stays lost: no fresh sandbox, no grade of an empty patch.
    assert server.sandboxes.export(session_id) is None
    assert client.post("/run_tests", json={}).status_code == 410
    assert verify_reply(client).status_code == 410
    assert sandboxes_left(sandbox_dir) == []


def test_verify_of_a_lost_session_answers_410_not_a_reward(exported, adopter, sandbox_dir):
    session_id, state, _, _ = exported
    server, client = adopter
    server.sandboxes.restore(session_id, forged(state, sandbox="worker-gone/sandbox-gone"))
    reply = verify_reply(client)
    assert reply.status_code == 410 and "worker-gone/sandbox-gone" in reply.json()["detail"]


def test_a_lost_session_seeded_again_gets_a_fresh_sandbox_and_scores(exported, adopter):
    session_id, state, _, _ = exported
    server, client = adopter
    server.sandboxes.restore(session_id, forged(state, sandbox="worker-gone/sandbox-gone"))
    seeded(client)
    assert client.post("/write_file", json={"path": "bounds.py", "content": FIX}).status_code == 200
    assert verify(client)["reward"] == 1.0


@pytest.fixture
def outside(tmp_path):
    """A directory beside the sandbox root that looks like a sandbox: what a forged row would aim at."""
    target = tmp_path / "outside" / "sandbox-x"
    (target / "repo").mkdir(parents=True)
    (target / "repo" / "bounds.py").write_text("precious\n")
    return target


def assert_untouched(outside) -> None:
    assert (outside / "repo" / "bounds.py").read_text() == "precious\n"


@pytest.mark.parametrize(
    "name",
    [
        "../outside/sandbox-x",
        "worker-a/../../outside/sandbox-x",
        "worker-a/sandbox-b/../../../outside/sandbox-x",
        "{outside}",
        "worker-a/sandbox-b/repo",
        "",
    ],
)
def test_a_state_naming_a_path_outside_the_root_is_refused_and_nothing_there_is_touched(exported, adopter, outside, name):
    session_id, state, _, _ = exported
    server, client = adopter
    server.sandboxes.restore(session_id, forged(state, sandbox=name.format(outside=outside)))
    reply = client.post("/run_command", json={"command": "echo owned > bounds.py"})
    assert reply.status_code == 410 and "not a sandbox of this server's root" in reply.json()["detail"]
    server.sandboxes.end(session_id)
    assert_untouched(outside)


def test_a_symlink_in_the_root_leading_out_is_refused_and_its_target_untouched(sandbox_dir, exported, adopter, outside):
    session_id, state, _, _ = exported
    server, client = adopter
    (sandbox_dir / "worker-link").symlink_to(outside.parent)
    server.sandboxes.restore(session_id, forged(state, sandbox="worker-link/sandbox-x"))
    reply = client.post("/run_command", json={"command": "echo owned > bounds.py"})
    assert reply.status_code == 410 and "symlink" in reply.json()["detail"]
    server.sandboxes.end(session_id)
    assert_untouched(outside)


def test_a_plain_directory_posing_as_a_sandbox_is_refused_so_no_command_runs_as_its_owner(sandbox_dir, exported, adopter):
    session_id, state, _, _ = exported
    server, client = adopter
    fake = sandbox_dir / "worker-fake" / "sandbox-fake"
    (fake / "repo").mkdir(parents=True)
    server.sandboxes.restore(session_id, forged(state, sandbox="worker-fake/sandbox-fake"))
    reply = client.post("/run_command", json={"command": "id -u"})
    assert reply.status_code == 410 and "not a jailed sandbox" in reply.json()["detail"]


@pytest.mark.parametrize(
    "change, says",
    [
        ({"task_id": "no_such_task"}, "no_such_task"),
        ({"base_commit": "--output=/repo/x"}, "base_commit"),
        ({"owner": "extra field"}, "owner"),
    ],
)
def test_a_malformed_state_is_refused_with_what_is_wrong(exported, adopter, change, says):
    session_id, state, _, _ = exported
    server, client = adopter
    server.sandboxes.restore(session_id, forged(state, **change))
    reply = client.post("/read_file", json={"path": "bounds.py"})
    assert reply.status_code == 410 and says in reply.json()["detail"]


def test_a_state_that_is_not_json_is_refused(exported, adopter):
    session_id, _, _, _ = exported
    server, client = adopter
    server.sandboxes.restore(session_id, "not json")
    reply = client.post("/read_file", json={"path": "bounds.py"})
    assert reply.status_code == 410 and "malformed" in reply.json()["detail"]


def test_ending_a_restored_session_removes_its_sandbox(sandbox_dir, exported, adopter):
    session_id, state, _, _ = exported
    server, _ = adopter
    server.sandboxes.restore(session_id, state)
    server.sandboxes.end(session_id)
    assert sandboxes_left(sandbox_dir) == [] and session_id not in server.sandboxes
    assert mounts_under(sandbox_dir) == []


def test_a_session_forgotten_here_keeps_its_sandbox_for_the_worker_that_holds_it_now(sandbox_dir, exported, adopter):
    session_id, state, _, _ = exported
    server, _ = adopter
    server.sandboxes.restore(session_id, state)
    server.sandboxes.forget(session_id)
    assert session_id not in server.sandboxes and sandboxes_left(sandbox_dir) == [json.loads(state)["sandbox"].split("/")[1]]


def test_a_sweep_spares_a_gone_workers_durable_sandboxes_and_removes_the_rest(sandbox_dir):
    path = sandbox_dir
    task = load_tasks(DEFAULT_TASKS_DIR)["clamp_upper"]
    kept: set[str] = set()
    gone = SandboxRoot(path, disk_bytes=MIB, kept=lambda: kept)
    gone.open()
    durable, scratch = gone.make(task), gone.make(task)
    kept.add(f"{durable.root.parent.name}/{durable.root.name}")
    gone.close()
    assert list(path.glob("worker-*/sandbox-*")) == [durable.root] and mounts_under(path) == [durable.root]
    assert not scratch.root.exists()
    other = SandboxRoot(path, disk_bytes=MIB, kept=lambda: kept)
    other.open()
    assert durable.repo.is_dir() and os.path.ismount(durable.root)
    kept.clear()
    other.close()
    assert not path.exists() and mounts_under(path) == []


def test_stored_states_name_their_sandboxes_and_malformed_ones_name_none(tmp_path):
    store = SQLiteStore(tmp_path / "store.sqlite3")
    good = json.dumps({"task_id": "clamp_upper", "sandbox": "worker-a/sandbox-b", "base_commit": "0" * 40})
    store.write("one", "w1", good)
    store.write("two", "w1", "[1, 2]")
    store.write("three", "w1", forged(good, sandbox="../../etc"))
    assert sandbox_names(stored.state for stored in store.export()) == {"worker-a/sandbox-b"}
    store.close()


@needs_mount
def test_a_verify_the_full_store_refused_keeps_its_sandbox_and_its_retry_scores_one(sandbox_dir, tmp_path):
    """A durable server whose store's file system is full when a fixed session verifies (under an id, so its
    reply is to be stored with its tombstone): 503 saying the verify did not take effect, and it did not (the
    sandbox is there, with the fix); once there is room the retry grades the same sandbox, scores 1.0, and
    the sandbox goes with the session's end."""
    (tmp_path / "state").mkdir()
    with mounted_tmpfs(tmp_path / "state", "2m") as state:
        server = make_server(sandbox_dir, num_workers=2, session_store=str(state / "swe.sqlite3"))  # durable: routed, so two workers
        with tempfile.TemporaryDirectory(prefix="ngw-test-", dir="/tmp") as socket_dir, TestClient(server.build_app(socket_dir)) as client:
            seeded(client)
            assert client.post("/write_file", json={"path": "bounds.py", "content": FIX}).status_code == 200
            store = server._assembly.durable.store
            with full(state):
                client.portal.call(commit_until_refused, store)
                refused = client.post("/verify", json=verify_row(), headers=ONCE)
                assert refused.status_code == 503 and "did not take effect" in refused.json()["detail"], refused.text
            (sandbox,) = sandbox_dir.glob("worker-*/sandbox-*")
            assert (sandbox / "repo" / "bounds.py").read_text() == FIX
            retried = client.post("/verify", json=verify_row(), headers=ONCE)
            assert retried.status_code == 200 and retried.json()["reward"] == 1.0, retried.text
            assert sandboxes_left(sandbox_dir) == []
        store.close()  # the worker's, which its process's exit closes
