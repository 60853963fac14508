"""The meters of one process, read through its exposition."""

from __future__ import annotations

from nemo_gym.metrics.exposition import Exposition
from nemo_gym.metrics.meters import METERS
from tests.unit_tests.metrics.scrape import value


def test_a_session_ended_by_a_worker_that_did_not_hold_it_is_counted_and_leaves_its_live_sessions_alone():
    METERS.install("dddddddddddddddd", keeps_sessions=True)
    METERS.sessions_started.inc()
    METERS.live_sessions.inc()
    METERS.session_ended("idle", held=False)
    METERS.session_ended("close")
    text = Exposition(METERS).text().decode()
    assert value(text, "nemo_gym_sessions_ended_total", reason="idle") == 1 == value(text, "nemo_gym_sessions_ended_total", reason="close")
    assert value(text, "nemo_gym_live_sessions", worker="dddddddddddddddd") == 0
