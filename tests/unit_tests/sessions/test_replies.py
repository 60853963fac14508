"""The replies a request for a session gets in place of being served: 410 (gone) and retry later (503 with Retry-After)."""

from __future__ import annotations

import pytest

from nemo_gym.sessions.replies import RETRY_AFTER_SECONDS, lost_session, retry_later, session_gone
from tests.unit_tests.replies import answered

pytestmark = pytest.mark.anyio


async def test_retry_later_is_a_503_that_says_when_to_come_back():
    status, headers, body = await answered(retry_later("busy"))
    assert (status, headers["retry-after"], body) == (503, str(RETRY_AFTER_SECONDS), {"detail": "busy"})


async def test_retry_later_may_be_a_409_that_says_when_to_come_back():
    status, headers, _ = await answered(retry_later("in flight", status=409))
    assert (status, headers["retry-after"]) == (409, str(RETRY_AFTER_SECONDS))


async def test_a_gone_session_is_410_with_no_retry_after():
    status, headers, body = await answered(session_gone("ended"))
    assert (status, body) == (410, {"detail": "ended"}) and "retry-after" not in headers


async def test_a_lost_session_names_its_dead_owner():
    status, _, body = await answered(lost_session("d" * 16))
    assert status == 410 and "d" * 16 in body["detail"] and "Start a new session" in body["detail"]
