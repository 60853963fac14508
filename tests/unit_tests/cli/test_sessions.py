"""nemo_gym.cli.sessions: ``gym sessions export|restore|checkpoint``: the commands say what they moved, and a
checkpoint beside a request that does not finish fails having refused no request."""

from __future__ import annotations

import argparse
import asyncio

import httpx
import pytest

from nemo_gym.cli.main import main
from nemo_gym.cli.sessions import CheckpointFailed, take_checkpoint
from nemo_gym.durable.checkpoint import CheckpointGate, Gate
from nemo_gym.durable.checkpoint_admin import CheckpointAdmin
from nemo_gym.durable.sqlite_store import SQLiteStore, store_path
from tests.unit_tests.durable.test_checkpoint import served
from tests.unit_tests.durable.test_checkpoint_admin import INSTANCE, SECRET
from tests.unit_tests.in_process_server import serving


def test_a_checkpoint_beside_a_request_that_does_not_finish_fails_having_refused_no_request(tmp_path):
    """The drain waits for the requests in flight while the host still serves; it gives up after
    ``--drain-seconds`` and nothing was refused: no 503 at all, however long the drain time."""
    gate = Gate(str(tmp_path))
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o600)
    held, release = asyncio.Event(), asyncio.Event()

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/hold":
            held.set()
            await release.wait()
        await served(scope, receive, send)

    admin = CheckpointAdmin(CheckpointGate(app, gate), gate, INSTANCE, SECRET, str(tmp_path / "store.sqlite3"))

    async def scenario() -> tuple[list[int], str]:
        async with serving(admin) as url, httpx.AsyncClient(base_url=url) as client:
            holding = asyncio.create_task(client.post("/hold"))
            await asyncio.wait_for(held.wait(), 5)
            options = {"drain_seconds": 2, "hold_seconds": 0.5, "pause_seconds": 60}
            arguments = argparse.Namespace(instance=INSTANCE, url=[url], output=str(tmp_path / "out.json"), secret_file=str(secret_file), **options)
            checkpoint = asyncio.create_task(take_checkpoint(arguments))
            statuses = []
            while not checkpoint.done():
                statuses.append((await client.post("/increment_counter")).status_code)
                await asyncio.sleep(0.02)
            with pytest.raises(CheckpointFailed) as failed:
                await checkpoint
            release.set()
            assert (await holding).status_code == 200
            return statuses, str(failed.value)

    statuses, failure = asyncio.run(scenario())
    assert "did not finish within 2 s" in failure
    assert len(statuses) > 10 and set(statuses) == {200}


def test_export_and_restore_say_how_many_sessions_of_which_instance_they_moved_and_where(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NEMO_GYM_STATE_DIR", str(tmp_path / "state"))
    store = SQLiteStore(store_path(INSTANCE))
    for number in range(3):
        store.write(f"s{number}", "a" * 16, str(number))
    store.close()
    path = tmp_path / "sessions.json"
    assert main(["sessions", "export", "--instance", INSTANCE, "--output", str(path)]) == 0
    assert capsys.readouterr().out == f"exported 3 sessions of {INSTANCE} to {path}\n"
    monkeypatch.setenv("NEMO_GYM_STATE_DIR", str(tmp_path / "fresh"))
    assert main(["sessions", "restore", "--instance", INSTANCE, "--input", str(path)]) == 0
    assert capsys.readouterr().out == f"restored 3 sessions of {INSTANCE} from {path}; a live worker takes each up on its first request\n"


def test_exporting_an_instance_that_has_no_store_is_an_error_naming_where_it_looked_and_makes_none(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NEMO_GYM_STATE_DIR", str(tmp_path / "state"))
    assert main(["sessions", "export", "--instance", "nowhere", "--output", str(tmp_path / "out.json")]) != 0
    assert f"instance 'nowhere' has no session store at {store_path('nowhere')}" in capsys.readouterr().err
    assert not store_path("nowhere").exists() and not (tmp_path / "out.json").exists()
