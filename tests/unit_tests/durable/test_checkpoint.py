"""The checkpoint's gate (two ``Gate`` objects on one directory stand for two workers of one host) and its admin endpoints."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.responses import JSONResponse

from nemo_gym.durable.store import open_store
from nemo_gym.durable.checkpoint import ADMIN_PREFIX, CheckpointAdmin, CheckpointGate, Gate, admin_credentials, admin_header, merged

SECRET = "checkpoint-unit-test-secret-0123456789abcdef"
INSTANCE = "counter"


async def served(scope, receive, send) -> None:
    await JSONResponse({"served": True})(scope, receive, send)


def test_a_pause_refuses_new_requests_on_every_worker_of_the_host_until_it_is_resumed(tmp_path):
    pauser, other = Gate(str(tmp_path)), Gate(str(tmp_path))
    assert asyncio.run(pauser.pause(60, 1))
    assert (other.enter(), pauser.enter()) == (False, False)
    pauser.resume()
    assert other.enter()


def test_a_pause_waits_for_the_requests_in_flight_on_another_worker_and_admits_none_meanwhile(tmp_path):
    pauser, busy = Gate(str(tmp_path)), Gate(str(tmp_path))

    async def scenario() -> tuple[bool, bool, bool]:
        assert busy.enter()
        pausing = asyncio.create_task(pauser.pause(60, 10))
        await asyncio.sleep(0.2)
        waited, admitted = not pausing.done(), busy.enter() or pauser.enter()
        busy.leave()
        return waited, admitted, await asyncio.wait_for(pausing, 5)

    assert asyncio.run(scenario()) == (True, False, True)


def test_a_pause_whose_requests_in_flight_do_not_finish_in_time_is_lifted(tmp_path):
    pauser, busy = Gate(str(tmp_path)), Gate(str(tmp_path))
    assert busy.enter()
    assert not asyncio.run(pauser.pause(60, 0.1))
    assert pauser.enter()


def test_a_pause_ends_by_itself_after_its_seconds(tmp_path):
    gate = Gate(str(tmp_path))
    assert asyncio.run(gate.pause(0.2, 1))
    assert not gate.enter()
    asyncio.run(asyncio.sleep(0.3))
    assert gate.enter()


def test_a_request_the_pause_meets_gets_503_with_retry_after_and_is_never_served(tmp_path):
    gate = Gate(str(tmp_path))
    asyncio.run(gate.pause(60, 1))
    reply = asyncio.run(call(CheckpointGate(served, gate), "POST", "/increment_counter"))
    assert (reply.status_code, reply.headers["retry-after"], "checkpoint" in reply.json()["detail"]) == (503, "1", True)


async def call(app, method: str, target: str, headers: dict | None = None) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://server") as client:
        return await client.request(method, target, headers=headers)


def signed(target: str, secret: str = SECRET, signed_target: str | None = None, instance: str = INSTANCE) -> dict:
    name, value = admin_header(admin_credentials(secret), "POST", signed_target or target, instance)
    return {name: value}


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
