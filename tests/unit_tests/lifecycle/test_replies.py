"""nemo_gym.lifecycle.replies: what an ended session's 410 says for each way it ended, and a cap's 503."""

from __future__ import annotations

import pytest

from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.lifecycle.replies import end_detail, over_cap
from nemo_gym.sessions.replies import RETRY_AFTER_SECONDS
from tests.unit_tests.replies import answered


@pytest.mark.parametrize(
    "reason, why",
    [
        (EndReason.VERIFY, "ended with its /verify"),
        (EndReason.CLOSE, "ended by /close_session"),
        (EndReason.IDLE, "ended: idle for 91 s (session_idle_timeout_seconds: 90)"),
        (EndReason.EXPIRED, "expired: no request for 91 s, the session cookie's max age"),
        (EndReason.STOP, "its server stopped"),
        (EndReason.CONFLICT, "is no longer held by worker 0123456789abcdef: the store holds it for another worker"),
    ],
)
def test_an_ended_sessions_detail_names_it_says_why_and_to_seed_a_new_one(reason, why):
    detail = end_detail("s1", reason, idle_seconds=91.2, timeout=90.0, worker="0123456789abcdef")
    assert detail.startswith("Session s1 ") and why in detail
    assert detail.endswith("its state is gone. Seed a new session.")


def test_every_end_reason_has_its_own_detail():
    details = {end_detail("s1", reason, idle_seconds=1, timeout=1, worker="w") for reason in EndReason}
    assert len(details) == len(EndReason)


@pytest.mark.anyio
async def test_over_the_cap_is_a_503_with_retry_after_naming_the_cap_and_its_limit():
    status, headers, body = await answered(over_cap(8, "max_sessions"))
    assert (status, headers["retry-after"]) == (503, str(RETRY_AFTER_SECONDS))
    assert "Over the cap max_sessions" in body["detail"] and "holds 8 live sessions" in body["detail"]
