"""Fixtures of the metrics tests."""

from __future__ import annotations

import pytest

from tests.unit_tests.routing_workers import two_workers


@pytest.fixture
async def pair():
    """Workers A and B of one server in this process (so they count into one set of metrics), one socket directory."""
    async with two_workers() as workers:
        yield workers
