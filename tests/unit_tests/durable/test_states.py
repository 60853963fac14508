"""nemo_gym.durable.states: ``SessionStates``, a dict of session states that exports each as JSON and restores it
validated by its type; any object with its three methods is a ``DurableState``."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from nemo_gym.durable.states import DurableState, SessionStates
from tests.unit_tests.conformance import assert_implements


class Board(BaseModel):
    moves: list[str] = []


def test_a_state_exports_as_json_and_restores_as_its_type_on_another_worker():
    here, there = SessionStates(Board), SessionStates(Board)
    here["s1"] = Board(moves=["e4"])
    here["s1"].moves.append("e5")  # changed in place: what is exported is the value as it is now
    there.restore("s1", here.export("s1"))
    assert there["s1"] == Board(moves=["e4", "e5"]) and isinstance(there["s1"], Board)


def test_a_session_this_worker_keeps_nothing_for_exports_none():
    assert SessionStates(int).export("s1") is None


def test_restoring_data_that_is_not_of_the_type_is_refused_and_holds_nothing():
    states = SessionStates(int)
    with pytest.raises(ValidationError):
        states.restore("s1", '"three"')
    assert "s1" not in states


def test_ending_a_session_drops_its_state_once_and_ending_it_again_is_harmless():
    states = SessionStates(int)
    states.restore("s1", "3")
    states.end("s1")
    states.end("s1")
    assert states == {}


def test_session_states_implement_the_durable_state_protocol():
    assert_implements(SessionStates, DurableState)
