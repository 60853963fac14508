"""The lost-session seam: a declared policy, and today's in-memory one (the session went with its owner: 410)."""

from __future__ import annotations

import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.routing.lost import LostSessionPolicy, LostWithOwner, Reply
from tests.unit_tests.conformance import assert_implements
from tests.unit_tests.replies import answered

pytestmark = pytest.mark.anyio

DEAD = "d" * 16


def test_the_in_memory_policy_implements_the_protocol():
    assert_implements(LostWithOwner, LostSessionPolicy)


@pytest.mark.parametrize("death", ["owner_gone", "owner_died"])
async def test_in_memory_a_dead_owners_session_is_lost_410_naming_the_worker(death):
    decision = await getattr(LostWithOwner(), death)(DEAD, {SESSION_ID_KEY: "s"})
    assert isinstance(decision, Reply)
    status, _, body = await answered(decision.response)
    assert status == 410 and DEAD in body["detail"] and "gone" in body["detail"]
