"""The meters of one process, read through its exposition."""

from __future__ import annotations

from nemo_gym.metrics.exposition import Exposition
from nemo_gym.metrics.meters import METERS
from tests.unit_tests.metrics.scrape import value


def test_sessions_ended_are_counted_by_reason_and_leave_the_live_sessions():
    METERS.install("dddddddddddddddd", keeps_sessions=True)
    METERS.sessions_started.inc()
    METERS.live_sessions.inc(2)
    METERS.session_ended("idle")
    METERS.session_ended("close")
    text = Exposition(METERS).text().decode()
    assert value(text, "nemo_gym_sessions_ended_total", reason="idle") == 1 == value(text, "nemo_gym_sessions_ended_total", reason="close")
    assert value(text, "nemo_gym_live_sessions", worker="dddddddddddddddd") == 0


def test_hand_offs_are_counted_per_worker_and_forwards_not_handed_off_by_reason():
    METERS.install("eeeeeeeeeeeeeeee", keeps_sessions=True)
    METERS.hand_offs_sent.inc()
    METERS.hand_offs_received.inc(2)
    METERS.forwarded_not_handed_off("full").inc()
    assert METERS.forwarded_not_handed_off("full") is METERS.forwarded_not_handed_off("full")
    text = Exposition(METERS).text().decode()
    assert value(text, "nemo_gym_hand_offs_sent_total", worker="eeeeeeeeeeeeeeee") == 1
    assert value(text, "nemo_gym_hand_offs_received_total", worker="eeeeeeeeeeeeeeee") == 2
    assert value(text, "nemo_gym_forwards_not_handed_off_total", worker="eeeeeeeeeeeeeeee", reason="full") == 1
