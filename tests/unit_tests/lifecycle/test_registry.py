"""A worker's record of its sessions: each ends once, ended ones are remembered within bounds, busy ones are never idle."""

from __future__ import annotations

import time

from nemo_gym.lifecycle.registry import SessionRegistry


def test_a_session_ends_once_and_is_remembered_with_its_detail():
    registry = SessionRegistry()
    registry.start("s")
    assert registry.end("s", "closed") is True
    assert registry.end("s", "again") is False
    assert not registry.is_live("s") and registry.ended("s") == "closed"


def test_a_session_never_started_does_not_end():
    assert SessionRegistry().end("never", "x") is False


def test_the_tombstones_keep_only_the_newest_up_to_their_bound():
    registry = SessionRegistry(max_tombstones=3)
    for number in range(5):
        registry.start(f"s{number}")
        registry.end(f"s{number}", f"ended {number}")
    assert [registry.ended(f"s{number}") for number in range(5)] == [None, None, "ended 2", "ended 3", "ended 4"]


def test_a_tombstone_is_forgotten_after_its_lifetime():
    registry = SessionRegistry(tombstone_seconds=0.05)
    registry.start("s")
    registry.end("s", "closed")
    time.sleep(0.1)
    assert registry.ended("s") is None and len(registry.tombstones) == 0


def test_a_session_being_served_is_not_idle_however_old_its_last_use():
    registry = SessionRegistry()
    registry.start("busy", last_used=0.0)
    registry.start("idle", last_used=0.0)
    registry.enter("busy")
    registry.last_used["busy"] = 0.0
    assert registry.idle(time.time()) == ["idle"]
    registry.leave("busy")
    assert registry.idle(time.time() - 60) == ["idle"]  # its end was a use
