"""nemo_gym.durable.replies: a durable worker's replies in place of the app's: a stored reply replayed as it was,
409 for a request being served, and 503s with Retry-After that never quote the store's words."""

from __future__ import annotations

import json

from nemo_gym.durable.applied import Applied
from nemo_gym.durable.lease import LeaseHolder
from nemo_gym.durable.replies import REPLAYED_HEADER, in_flight, lease_not_renewed, not_taken_up, owned_elsewhere, replayed, store_unavailable
from nemo_gym.durable.store import StoreTimedOut, StoreUnavailable
from nemo_gym.routing.replica import FORWARD_PORT_KEY, REPLICA_KEY
from nemo_gym.routing.request_id import ID_HEADER_NAME
from nemo_gym.sessions.replies import RETRY_AFTER_SECONDS
from nemo_gym.sessions.worker import OWNER_KEY

SECRET_WORDS = "postgresql://gym:hunter2@db.internal:5432/sessions: connection refused"


def detail(response) -> str:
    return json.loads(response.body)["detail"]


def test_a_store_that_refused_says_the_change_did_not_take_effect_and_quotes_nothing_of_the_store():
    response = store_unavailable(StoreUnavailable(SECRET_WORDS))
    assert (response.status_code, response.headers["retry-after"]) == (503, str(RETRY_AFTER_SECONDS))
    assert "did not take effect" in detail(response) and "hunter2" not in detail(response) and "db.internal" not in detail(response)


def test_a_store_that_timed_out_after_the_change_was_sent_says_it_may_be_applied_yet():
    response = store_unavailable(StoreTimedOut(SECRET_WORDS, sent=True))
    assert response.status_code == 503 and "may be applied when the store answers again" in detail(response)
    assert "hunter2" not in detail(response)


def test_a_store_that_timed_out_before_the_change_was_sent_says_it_did_not_take_effect():
    assert "did not take effect" in detail(store_unavailable(StoreTimedOut(SECRET_WORDS, sent=False)))


def test_a_lease_not_renewed_is_a_503_saying_the_request_was_not_run():
    response = lease_not_renewed()
    assert (response.status_code, response.headers["retry-after"]) == (503, str(RETRY_AFTER_SECONDS))
    assert "was not run" in detail(response)


def test_a_session_not_taken_up_is_a_503_when_the_store_failed_and_a_500_naming_it_when_its_state_does_not_load():
    assert not_taken_up(StoreUnavailable(SECRET_WORDS), "s1").status_code == 503
    response = not_taken_up(ValueError("count: not an int"), "s1")
    assert response.status_code == 500 and "retry-after" not in response.headers
    assert detail(response) == "s1: its stored state does not load here: count: not an int"


def test_a_session_owned_elsewhere_names_the_new_owner_and_its_replica_in_the_session_and_drops_the_old_replica():
    session = {"id": "s1", OWNER_KEY: "a" * 16, REPLICA_KEY: "old:1", FORWARD_PORT_KEY: 7000}
    holder = LeaseHolder(worker="b" * 16, domain="counter", keys={REPLICA_KEY: "new:2", FORWARD_PORT_KEY: 8000}, live=True)
    response = owned_elsewhere(session, holder)
    assert session == {"id": "s1", OWNER_KEY: "b" * 16, REPLICA_KEY: "new:2", FORWARD_PORT_KEY: 8000}
    assert response.status_code == 503 and "b" * 16 in detail(response)


def test_a_holder_of_no_replica_leaves_the_session_naming_none():
    session = {"id": "s1", OWNER_KEY: "a" * 16, REPLICA_KEY: "old:1", FORWARD_PORT_KEY: 7000}
    owned_elsewhere(session, LeaseHolder(worker="b" * 16, domain="counter", keys={}, live=True))
    assert session == {"id": "s1", OWNER_KEY: "b" * 16}


def test_a_replayed_reply_is_the_stored_one_with_its_media_type_and_marked_replayed():
    applied = Applied("r1", 201, (("Content-Type", "text/plain; charset=utf-8"), ("X-Count", "3")), b"three")
    response = replayed(applied)
    assert (response.status_code, response.body) == (201, b"three")
    assert response.headers["content-type"] == "text/plain; charset=utf-8" and response.headers["x-count"] == "3"
    assert response.headers[REPLAYED_HEADER] == "true"
    assert len(response.headers.getlist("content-type")) == 1


def test_a_reply_too_large_to_keep_is_replayed_as_its_status_saying_so():
    response = replayed(Applied("r1", 200, (("Content-Type", "application/json"),), None))
    assert (response.status_code, response.headers[REPLAYED_HEADER]) == (200, "true")
    assert detail(response) == f"This request ({ID_HEADER_NAME} r1) was applied already; its reply was too large to keep."


def test_a_request_in_flight_is_a_409_with_retry_after_naming_it():
    response = in_flight("r1")
    assert (response.status_code, response.headers["retry-after"]) == (409, str(RETRY_AFTER_SECONDS))
    assert f"{ID_HEADER_NAME} r1" in detail(response)
