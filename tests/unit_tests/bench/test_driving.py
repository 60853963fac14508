"""scripts/bench/driving.py: what one run's figures are made of."""

from __future__ import annotations

from collections import Counter

import pytest

from scripts.bench.driving import Run


def test_sessions_per_worker_spread_is_the_furthest_owner_from_the_mean():
    run = Run(8, 8, 0, 1.0, [], owners=Counter({"a": 3, "b": 1, "c": 2, "d": 2}))
    assert run.spread == pytest.approx(0.5)
    assert Run(1, 1, 0, 1.0, [], owners=Counter({"a": 1})).spread is None


def test_server_cpu_per_request_counts_the_requests_answered_not_the_episodes_planned():
    # 10 episodes planned; failures stopped some early, so 25 requests were answered, not 40.
    run = Run(10, 7, 3, 1.0, [0.001] * 25, server_cpu_s=0.05)
    assert run.server_cpu_ms == pytest.approx(5.0)
    assert run.server_cpu_request_ms == pytest.approx(2.0)
    assert Run(10, 10, 0, 1.0, [0.001] * 40).server_cpu_request_ms is None
