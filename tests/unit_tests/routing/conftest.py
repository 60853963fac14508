"""Fixtures of the routing tests."""

from __future__ import annotations

import pytest

from tests.unit_tests.routing_workers import two_workers


@pytest.fixture
async def pair():
    """Workers A and B of the same server (same name, so the same secret), one socket directory."""
    async with two_workers() as workers:
        yield workers
