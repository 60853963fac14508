"""The checkpoint's endpoints (``durable.checkpoint_admin``): their credential, drain, pause, export and resume, and the merge of exports."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from nemo_gym.durable.checkpoint import Gate
from nemo_gym.durable.checkpoint_admin import ADMIN_PREFIX, CheckpointAdmin, admin_credentials, admin_header, merged
from nemo_gym.durable.store import open_store
from tests.unit_tests.durable.test_checkpoint import call, served

SECRET = "checkpoint-unit-test-secret-0123456789abcdef"
INSTANCE = "counter"

def signed(target: str, secret: str = SECRET, signed_target: str | None = None, instance: str = INSTANCE) -> dict:
    name, value = admin_header(admin_credentials(secret), "POST", signed_target or target, instance)
    return {name: value}


def test_a_drain_without_a_valid_credential_gets_401_and_moves_no_request(tmp_path):
    gate = Gate(str(tmp_path))
    admin = CheckpointAdmin(served, gate, INSTANCE, SECRET, str(tmp_path / "store.sqlite3"))
    forged = signed(ADMIN_PREFIX + "drain", secret="another-secret-of-another-replica-set-0123")
    reply = asyncio.run(call(admin, "POST", ADMIN_PREFIX + "drain", forged))
    assert (reply.status_code, gate.generation()) == (401, 0)
    assert asyncio.run(call(admin, "POST", ADMIN_PREFIX + "drain", signed(ADMIN_PREFIX + "drain"))).json() == {"drained": True}
    assert gate.generation() == 1


@pytest.mark.parametrize(
    "headers",
    [
        {},
        signed(ADMIN_PREFIX + "pause", secret="another-secret-of-another-replica-set-0123"),
        signed(ADMIN_PREFIX + "pause", signed_target=ADMIN_PREFIX + "resume"),
        signed(ADMIN_PREFIX + "pause", instance="another_instance"),
        {"X-NeMo-Gym-Admin-Auth": "0 garbage"},
    ],
    ids=["none", "another secret", "another target", "another instance", "garbage"],
)
def test_a_checkpoint_request_without_a_valid_credential_gets_401_and_pauses_nothing(tmp_path, headers):
    gate = Gate(str(tmp_path))
    admin = CheckpointAdmin(served, gate, INSTANCE, SECRET, str(tmp_path / "store.sqlite3"))
    reply = asyncio.run(call(admin, "POST", ADMIN_PREFIX + "pause", headers))
    assert (reply.status_code, gate.paused_until()) == (401, 0.0)


def test_the_admin_endpoints_pause_export_only_while_paused_and_resume(tmp_path):
    gate = Gate(str(tmp_path))
    open_store(str(tmp_path / "store.sqlite3"), INSTANCE).close()
    admin = CheckpointAdmin(served, gate, INSTANCE, SECRET, str(tmp_path / "store.sqlite3"))

    def post(action: str) -> httpx.Response:
        return asyncio.run(call(admin, "POST", ADMIN_PREFIX + action, signed(ADMIN_PREFIX + action)))

    assert post("export").status_code == 409
    assert post("pause").status_code == 200 and gate.paused_until() > 0
    assert post("export").json() == {"sessions": []}
    assert post("resume").status_code == 200 and gate.paused_until() == 0.0
    assert asyncio.run(call(admin, "POST", "/increment_counter")).json() == {"served": True}


def test_merged_rows_keep_each_sessions_highest_revision():
    row = {"owner": None, "state": "1", "expires_at": 1.0}
    exports = [[{**row, "session_id": "a", "revision": 1}, {**row, "session_id": "b", "revision": 3}], [{**row, "session_id": "a", "revision": 4, "state": "5"}]]
    assert merged(exports) == [{**row, "session_id": "a", "revision": 4, "state": "5"}, {**row, "session_id": "b", "revision": 3}]
