"""``gym sessions export`` / ``restore``: a whole file restores every session, any other file none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.cli.main import main
from nemo_gym.durable.store import SessionStore, store_path
from nemo_gym.durable.transfer import digest

INSTANCE = "counter"
OWNER = "a" * 16


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("NEMO_GYM_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def stored(instance: str = INSTANCE) -> dict[str, str]:
    store = SessionStore(store_path(instance))
    try:
        return {row.session_id: row.state for row in store.all()}
    finally:
        store.close()


@pytest.fixture
def exported(state_dir: Path, tmp_path: Path, monkeypatch) -> Path:
    """Three sessions exported from one state directory, which then moves to a fresh one."""
    store = SessionStore(store_path(INSTANCE))
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
    assert "session 2 is malformed" in capsys.readouterr().err
    assert stored() == {}


def test_sessions_of_another_instance_are_refused(exported, capsys):
    assert restore(exported, "other") == 2
    assert "holds the sessions of instance 'counter'" in capsys.readouterr().err
    assert stored("other") == {}


def test_a_restore_that_meets_a_session_already_held_restores_none(exported, capsys):
    store = SessionStore(store_path(INSTANCE))
    store.write("s1", OWNER, "kept")
    store.close()
    assert restore(exported) == 2
    assert "already holds session s1" in capsys.readouterr().err
    assert stored() == {"s1": "kept"}


def test_export_of_an_instance_without_a_store_says_so(state_dir, tmp_path, capsys):
    assert main(["sessions", "export", "--instance", "nothing", "--output", str(tmp_path / "x.json")]) == 2
    assert "has no session store" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
