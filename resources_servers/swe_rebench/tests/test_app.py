"""swe_rebench in process: seed a sandbox, use the tools, verify; sandboxes never outlive a verify or the server."""

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from nemo_gym import config as gym_config
from nemo_gym.openai_utils import new_response
from resources_servers.swe_rebench.app import SweRebenchServer
from responses_api_models.scripted_backend.app import SWE_REBENCH_FIXES, swe_rebench_playbook
from tests.programs import lacking

DATA = Path(__file__).resolve().parents[1] / "data" / "example.jsonl"
ROWS = {row["task_id"]: row for row in map(json.loads, DATA.read_text().splitlines())}


@pytest.fixture
def sandbox_dir(tmp_path):
    return tmp_path / "sandboxes"


@pytest.fixture
def server(sandbox_dir):
    return make_server(sandbox_dir)


def make_server(sandbox_dir, **settings) -> SweRebenchServer:
    if "bwrap" not in settings and not settings.get("unsafe_no_jail") and (reason := lacking("bwrap")):
        pytest.skip(reason)
    data = {"swe_rebench": {"resources_servers": {"swe_rebench": {"sandbox_dir": str(sandbox_dir), **settings}}}}
    return SweRebenchServer.for_instance("swe_rebench", gym_config.parse(data))


@pytest.fixture
def client(server):
    with TestClient(server.build_app()) as client:
        yield client


def seeded(client, task_id="clamp_upper"):
    reply = client.post("/seed_session", json=ROWS[task_id])
    assert reply.status_code == 200, reply.text
    return client


def verify(client, task_id="clamp_upper"):
    reply = client.post("/verify", json={**ROWS[task_id], "response": new_response().model_dump(mode="json")})
    assert reply.status_code == 200, reply.text
    return reply.json()


def sandboxes_left(sandbox_dir):
    """The sandboxes in the instance's root, whichever worker directory holds them."""
    return sorted(path.name for path in sandbox_dir.glob("worker-*/sandbox-*"))


def test_seed_makes_a_git_working_copy_whose_visible_test_fails(client, sandbox_dir):
    seeded(client)
    assert len(sandboxes_left(sandbox_dir)) == 1
    tests = client.post("/run_tests", json={}).json()
    assert tests["passed"] is False and "FAILED" in tests["output"]
    log = client.post("/run_command", json={"command": "git log --oneline | wc -l; git status --short"}).json()
    assert log["output"].split() == ["1"]


def test_the_hidden_tests_are_not_in_the_sandbox(client):
    seeded(client)
    listing = client.post("/run_command", json={"command": "find . -name '*hidden*' -not -path './.git/*'"}).json()
    assert listing["exit_code"] == 0 and listing["output"] == ""


def test_a_correct_fix_scores_one_and_the_patch_is_recorded(client, sandbox_dir):
    seeded(client)
    written = client.post("/write_file", json={"path": "bounds.py", "content": SWE_REBENCH_FIXES["bounds.py"]})
    assert written.status_code == 200, written.text
    assert client.post("/run_tests", json={}).json()["passed"] is True
    result = verify(client)
    assert result["reward"] == 1.0 and result["tests_passed"] is True and result["reason"] is None
    assert "-        return low\n+        return high\n" in result["patch"]
    assert result["patch"].startswith("diff --git a/bounds.py b/bounds.py")
    assert sandboxes_left(sandbox_dir) == []


def test_no_fix_scores_zero_with_an_empty_patch_and_a_reason(client, sandbox_dir):
    seeded(client)
    result = verify(client)
    assert result["reward"] == 0.0 and result["tests_passed"] is False
    assert result["patch"] == ""
    assert "FAIL_TO_PASS test" in result["reason"] and "empty" in result["reason"]
    assert sandboxes_left(sandbox_dir) == []


def test_a_wrong_fix_scores_zero_and_its_patch_is_kept(client):
    seeded(client)
    client.post("/run_command", json={"command": "sed -i 's/return low$/return value/' bounds.py"})
    result = verify(client)
    assert result["reward"] == 0.0 and "FAIL_TO_PASS test" in result["reason"]
    assert "+        return value" in result["patch"]


def test_new_files_are_part_of_the_patch(client):
    seeded(client)
    client.post("/write_file", json={"path": "notes/why.txt", "content": "upper bound\n"})
    result = verify(client)
    assert "diff --git a/notes/why.txt b/notes/why.txt" in result["patch"]


def test_changes_committed_in_the_sandbox_still_count(client):
    seeded(client)
    client.post("/write_file", json={"path": "bounds.py", "content": SWE_REBENCH_FIXES["bounds.py"]})
    committed = client.post("/run_command", json={"command": "git commit -qam fix && git log --oneline | wc -l"}).json()
    assert committed["output"].strip() == "2"
    assert verify(client)["reward"] == 1.0


def test_a_patch_cannot_replace_the_graders_unittest(client):
    seeded(client)
    client.post("/write_file", json={"path": "unittest.py", "content": "import sys\nsys.exit(0)\n"})
    result = verify(client)
    assert result["reward"] == 0.0 and "+sys.exit(0)" in result["patch"]


def test_verify_for_an_unknown_session_says_so(client):
    result = verify(client)
    assert result["reward"] == 0.0 and result["patch"] is None
    assert "no sandbox for this session" in result["reason"]


def test_a_second_verify_gets_410_saying_the_session_ended_with_its_verify(client):
    seeded(client)
    client.post("/write_file", json={"path": "bounds.py", "content": SWE_REBENCH_FIXES["bounds.py"]})
    assert verify(client)["reward"] == 1.0
    again = client.post("/verify", json={**ROWS["clamp_upper"], "response": new_response().model_dump(mode="json")})
    assert again.status_code == 410 and "ended with its /verify" in again.json()["detail"]


def test_verify_naming_another_task_scores_zero(client, sandbox_dir):
    seeded(client, "clamp_upper")
    result = verify(client, "slug_case")
    assert result["reward"] == 0.0 and "seeded with task 'clamp_upper'" in result["reason"]
    assert sandboxes_left(sandbox_dir) == []


@pytest.mark.parametrize("path", ["../escape.txt", "/tmp/escape.txt", "link/escape.txt"])
def test_path_arguments_that_leave_the_sandbox_are_refused(client, sandbox_dir, path):
    seeded(client)
    client.post("/run_command", json={"command": f"ln -s {sandbox_dir.parent} link"})
    for tool, arguments in [("write_file", {"path": path, "content": "x"}), ("read_file", {"path": path})]:
        reply = client.post(f"/{tool}", json=arguments)
        assert reply.status_code == 400, reply.text
        assert reply.json()["detail"].startswith("refused:")
    assert not (sandbox_dir.parent / "escape.txt").exists()


def test_reading_a_missing_file_or_a_directory_is_a_clear_error(client):
    seeded(client)
    assert client.post("/read_file", json={"path": "nope.py"}).json()["detail"] == "no such file: 'nope.py'"
    assert "is a directory" in client.post("/read_file", json={"path": "."}).json()["detail"]


def test_writing_below_a_file_is_a_clear_error(client):
    seeded(client)
    reply = client.post("/write_file", json={"path": "bounds.py/inner.txt", "content": "x"})
    assert reply.status_code == 400 and reply.json()["detail"].startswith("cannot write 'bounds.py/inner.txt'")


def test_tools_before_seeding_are_refused(client):
    reply = client.post("/read_file", json={"path": "bounds.py"})
    assert reply.status_code == 404 and "/seed_session" in reply.json()["detail"]


def test_an_unknown_task_is_refused(client, sandbox_dir):
    reply = client.post("/seed_session", json={"task_id": "nope"})
    assert reply.status_code == 422 and "clamp_upper" in reply.json()["detail"]
    assert sandboxes_left(sandbox_dir) == []


def test_commands_are_bounded_by_the_timeout_and_the_output_cap(sandbox_dir):
    server = make_server(sandbox_dir, command_timeout_seconds=0.5, max_output_bytes=100)
    with TestClient(server.build_app()) as client:
        seeded(client)
        slow = client.post("/run_command", json={"command": "sleep 20"}).json()
        assert slow["timed_out"] is True and slow["exit_code"] is None
        loud = client.post("/run_command", json={"command": "yes | head -c 5000"}).json()
        assert loud["truncated"] is True and loud["output"] == "y\n" * 50
        big = client.post("/read_file", json={"path": "bounds.py"}).json()
        assert big["truncated"] is True and len(big["content"]) == 100


def test_a_seed_with_a_live_sessions_cookie_starts_a_new_session_with_a_sandbox_of_its_own(client, sandbox_dir):
    # /seed_session always starts a new session (docs/lifecycle.md): the old one, and its sandbox,
    # stay until it ends (verify, close, idleness).
    seeded(client)
    first = sandboxes_left(sandbox_dir)
    seeded(client, "slug_case")
    assert len(sandboxes_left(sandbox_dir)) == 2 and set(first) < set(sandboxes_left(sandbox_dir))


def test_sandboxes_never_verified_are_removed_when_the_server_stops(server, sandbox_dir):
    app = server.build_app()
    with TestClient(app) as client:
        seeded(client)
        for task_id in ["slug_case", "mean_divisor"]:
            seeded(TestClient(app), task_id)  # other sessions: clients without the first one's cookie
        assert len(sandboxes_left(sandbox_dir)) == 3
    assert not sandbox_dir.exists()


@pytest.mark.parametrize("task_id", sorted(ROWS))
def test_every_task_is_solved_by_the_scripted_fix_and_not_without_it(sandbox_dir, task_id):
    server = make_server(sandbox_dir)
    with TestClient(server.build_app()) as client:
        assert verify(seeded(client, task_id), task_id)["reward"] == 0.0
        task = ROWS[task_id]["responses_create_params"]["input"][0]["content"]
        seeded(client, task_id)
        for tool, arguments in swe_rebench_playbook(task):
            assert client.post(f"/{tool}", json=arguments).status_code == 200
        assert verify(client, task_id)["reward"] == 1.0
