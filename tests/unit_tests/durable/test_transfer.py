"""``gym sessions export`` / ``restore``: a whole file restores every session, any other file none."""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nemo_gym.cli.main import main
from nemo_gym.durable.sqlite_store import SQLiteStore, store_path
from nemo_gym.durable.tombstones import tombstone
from nemo_gym.durable.transfer import TransferError, digest, restore_sessions
from nemo_gym.sessions.worker import is_worker_id

INSTANCE = "counter"
OWNER = "a" * 16


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("NEMO_GYM_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def stored(instance: str = INSTANCE) -> dict[str, str]:
    store = SQLiteStore(store_path(instance))
    try:
        return {row.session_id: row.state for row in store.export()}
    finally:
        store.close()


@pytest.fixture
def exported(state_dir: Path, tmp_path: Path, monkeypatch) -> Path:
    """Three sessions exported from one state directory, which then moves to a fresh one."""
    store = SQLiteStore(store_path(INSTANCE))
    for number in range(3):
        store.write(f"s{number}", OWNER, str(number))
    store.close()
    path = tmp_path / "sessions.json"
    assert main(["sessions", "export", "--instance", INSTANCE, "--output", str(path)]) == 0
    monkeypatch.setenv("NEMO_GYM_STATE_DIR", str(tmp_path / "fresh"))
    return path


def restore(path: Path, instance: str = INSTANCE) -> int:
    return main(["sessions", "restore", "--instance", instance, "--input", str(path)])


def test_export_then_restore_into_a_fresh_store_brings_back_every_session(exported):
    assert restore(exported) == 0
    assert stored() == {"s0": "0", "s1": "1", "s2": "2"}


def edit(path: Path, change) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda path: path.write_text(path.read_text()[:-40]), "cut short or corrupt"),
        (lambda path: edit(path, lambda d: d["sessions"].pop()), "partial"),
        (lambda path: edit(path, lambda d: d["sessions"][1].update(state="99")), "do not match their SHA-256"),
        (lambda path: edit(path, lambda d: d.update(format="other")), "not a sessions file"),
        (lambda path: path.unlink(), "cannot read"),
    ],
    ids=["truncated", "a session missing", "a state altered", "another format", "no file"],
)
def test_a_corrupt_or_partial_file_restores_nothing_and_says_why(exported, damage, reason, capsys):
    damage(exported)
    assert restore(exported) == 2
    assert reason in capsys.readouterr().err
    assert stored() == {}


def test_a_malformed_session_restores_nothing(exported, capsys):
    def bad_owner(document):
        document["sessions"][2]["owner"] = "../etc"
        document["sha256"] = digest(document["sessions"])

    edit(exported, bad_owner)
    assert restore(exported) == 2
    assert "session 2 ('s2') is malformed: owner" in capsys.readouterr().err
    assert stored() == {}


def test_sessions_of_another_instance_are_refused(exported, capsys):
    assert restore(exported, "other") == 2
    assert "holds the sessions of instance 'counter'" in capsys.readouterr().err
    assert stored("other") == {}


def test_a_restore_that_meets_a_session_already_held_restores_none(exported, capsys):
    store = SQLiteStore(store_path(INSTANCE))
    store.write("s1", OWNER, "kept")
    store.close()
    assert restore(exported) == 2
    assert "already holds session s1" in capsys.readouterr().err
    assert stored() == {"s1": "kept"}


def test_a_restore_replaces_the_tombstone_of_a_session_that_ended_meanwhile(exported):
    store = SQLiteStore(store_path(INSTANCE))
    store.write("s1", OWNER, tombstone("Session s1 ended by /close_session"))
    store.close()
    assert restore(exported) == 0
    assert stored() == {"s0": "0", "s1": "1", "s2": "2"}


def test_tombstones_are_not_exported(state_dir, tmp_path):
    store = SQLiteStore(store_path(INSTANCE))
    store.write("live", OWNER, "1")
    store.write("ended", OWNER, tombstone("Session ended ended with its /verify"))
    store.close()
    path = tmp_path / "sessions.json"
    assert main(["sessions", "export", "--instance", INSTANCE, "--output", str(path)]) == 0
    assert [session["session_id"] for session in json.loads(path.read_text())["sessions"]] == ["live"]


def test_export_of_an_instance_without_a_store_says_so(state_dir, tmp_path, capsys):
    assert main(["sessions", "export", "--instance", "nothing", "--output", str(tmp_path / "x.json")]) == 2
    assert "has no session store" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_export_and_restore_use_the_store_they_are_given(state_dir, tmp_path):
    store = SQLiteStore(tmp_path / "from.sqlite3")
    store.write("s0", OWNER, "0")
    store.close()
    path = tmp_path / "x.json"
    assert main(["sessions", "export", "--instance", INSTANCE, "--store", str(tmp_path / "from.sqlite3"), "--output", str(path)]) == 0
    assert main(["sessions", "restore", "--instance", INSTANCE, "--store", str(tmp_path / "to.sqlite3"), "--input", str(path)]) == 0
    store = SQLiteStore(tmp_path / "to.sqlite3")
    try:
        assert [(row.session_id, row.owner, row.state) for row in store.export()] == [("s0", None, "0")]
    finally:
        store.close()
    assert not store_path(INSTANCE).exists()


def resealed(path: Path, change) -> None:
    """The file changed as a hand or a bug would, its SHA-256 made to match again."""

    def change_and_seal(document):
        change(document)
        document["count"] = len(document["sessions"])
        document["sha256"] = digest(document["sessions"])

    edit(path, change_and_seal)


@pytest.mark.parametrize(
    "field, value, reason",
    [
        ("expires_at", math.nan, "expires_at: must be a finite number"),
        ("expires_at", math.inf, "expires_at: must be a finite number"),
        ("revision", -1, "revision: must be at least 0"),
        ("revision", 2**70, "revision: must be at most"),
        ("state", "{", "state: not JSON text"),
    ],
    ids=["NaN expiry", "infinite expiry", "negative revision", "2^70 revision", "state not JSON"],
)
def test_a_session_with_a_bad_field_restores_nothing_and_the_error_names_it(exported, capsys, field, value, reason):
    resealed(exported, lambda document: document["sessions"][1].update({field: value}))
    assert restore(exported) == 2
    error = capsys.readouterr().err
    assert f"session 1 ('s1') is malformed: {reason}" in error
    assert "already holds" not in error
    assert stored() == {}


def test_a_file_naming_one_session_twice_restores_nothing_and_names_both_rows(exported, capsys):
    resealed(exported, lambda document: document["sessions"].append(dict(document["sessions"][0], state="7")))
    assert restore(exported) == 2
    error = capsys.readouterr().err
    assert "session 3 ('s0') has the same id as session 0" in error
    assert "already holds" not in error
    assert stored() == {}


def test_sessions_already_expired_are_skipped_and_counted_as_such(exported, capsys):
    resealed(exported, lambda document: document["sessions"][2].update(expires_at=time.time() - 60))
    assert restore(exported) == 0
    out = capsys.readouterr().out
    assert "restored 2 sessions of counter" in out
    assert "1 had expired and was skipped" in out
    assert stored() == {"s0": "0", "s1": "1"}


def test_restored_sessions_belong_to_no_worker_until_a_request_takes_them_up(exported):
    assert restore(exported) == 0
    store = SQLiteStore(store_path(INSTANCE))
    try:
        assert {row.session_id: row.owner for row in store.export()} == {"s0": None, "s1": None, "s2": None}
    finally:
        store.close()


def test_export_writes_a_0600_file_through_a_fresh_temporary_never_through_a_planted_symlink(state_dir, tmp_path):
    store = SQLiteStore(store_path(INSTANCE))
    store.write("s0", OWNER, "0")
    store.close()
    out = tmp_path / "out"
    out.mkdir()
    victim, other_victim = tmp_path / "victim", tmp_path / "other_victim"
    victim.write_text("precious")
    other_victim.write_text("precious too")
    (out / "x.json.partial").symlink_to(victim)
    (out / "x.json").symlink_to(other_victim)
    assert main(["sessions", "export", "--instance", INSTANCE, "--output", str(out / "x.json")]) == 0
    assert victim.read_text() == "precious" and other_victim.read_text() == "precious too"
    written = out / "x.json"
    assert not written.is_symlink()
    assert json.loads(written.read_text())["count"] == 1
    assert written.stat().st_mode & 0o777 == 0o600
    assert sorted(entry.name for entry in out.iterdir()) == ["x.json", "x.json.partial"]


NOW = time.time()
ROW_VALUES = {
    "session_id": st.sampled_from(["a", "b", "c", "d"]),
    "owner": st.sampled_from([None, OWNER, "../etc", 5]),
    "revision": st.one_of(st.integers(-3, 3), st.sampled_from([2**63 - 1, 2**63, 2**70]), st.just("1")),
    "state": st.sampled_from(["1", '"text"', "[1, 2]", "{", "", 3]),
    "expires_at": st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, NOW - 3600, NOW + 10**6]), st.floats(NOW + 3600, NOW + 10**8)),
}


def is_bad(row: dict) -> bool:
    """The restore's rules, read independently: which rows no store may take."""
    try:
        json.loads(row["state"])
    except (TypeError, ValueError):
        return True
    revision, expires_at = row["revision"], row["expires_at"]
    return (
        not (row["owner"] is None or is_worker_id(row["owner"]))
        or type(revision) is not int
        or not 0 <= revision < 2**63
        or not math.isfinite(expires_at)
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries(ROW_VALUES), max_size=5))
def test_any_file_restores_whole_or_restores_nothing_with_an_error_naming_a_row(sessions):
    ids = [row["session_id"] for row in sessions]
    refused = any(is_bad(row) for row in sessions) or len(set(ids)) != len(ids)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "sessions.json"
        path.write_text(json.dumps({"format": "nemo_gym.sessions/1", "instance": INSTANCE, "count": len(sessions), "sha256": digest(sessions), "sessions": sessions}))
        store = SQLiteStore(Path(directory) / "store.sqlite3")
        try:
            try:
                outcome = restore_sessions(store, INSTANCE, path)
            except TransferError as error:
                assert refused, error
                assert any(f"session {number} ({row['session_id']!r})" in str(error) for number, row in enumerate(sessions)), error
                assert store.export() == []
                return
            assert not refused
            live = {row["session_id"]: row["state"] for row in sessions if row["expires_at"] > NOW}
            assert {row.session_id: row.state for row in store.export()} == live
            assert (outcome.restored, outcome.expired) == (len(live), len(sessions) - len(live))
        finally:
            store.close()
