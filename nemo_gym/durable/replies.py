"""The replies a durable worker makes in place of the app's: a request applied already (its stored reply,
replayed) or being served now (409), and the refusals: the store unavailable or too slow, the lease not
renewed, a stored session not taken up, or owned by another worker now. Each 503 carries ``Retry-After``;
none quotes the store's location or its driver's words (those go to the worker's log)."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from nemo_gym.durable.applied import Applied

from nemo_gym.durable.lease import LeaseHolder
from nemo_gym.durable.store import StoreUnavailable
from nemo_gym.routing.replica import FORWARD_PORT_KEY, REPLICA_KEY
from nemo_gym.routing.request_id import ID_HEADER_NAME
from nemo_gym.sessions.replies import retry_later
from nemo_gym.sessions.worker import OWNER_KEY

# On a reply sent again for a request applied already (as Stripe's API names it).
REPLAYED_HEADER = "Idempotent-Replayed"


def store_unavailable(error: StoreUnavailable) -> JSONResponse:
    """503, saying only that the store is unavailable (where it is and what its driver said go to this
    worker's log: the store reports them, never to a client), and whether the change may have taken
    effect all the same: it did not if the store refused it or was never reached; it may have if the
    store did not answer in time."""
    if error.may_have_applied:
        outcome = ("the session store did not answer in time, so whether it took effect is unknown: it may be applied "
                   "when the store answers again. The session is served as of its last successful reply meanwhile")
    else:
        outcome = "the session store is unavailable, so it did not take effect: the session is as of its last successful reply"
    return retry_later(f"This request changed the session, and the change could not be stored: {outcome}. Retry later.")


def lease_not_renewed() -> JSONResponse:
    return retry_later(
        "This worker's owner lease could not be renewed (the session store is unavailable or did not answer in time), "
        "so it serves none of its sessions until it is: this request was not run. Retry it."
    )


def not_taken_up(error: StoreUnavailable | ValueError, session: str) -> JSONResponse:
    """The reply for a stored session this worker could not take over: its claim could not commit (503,
    retry), or its state does not load here (500, naming ``session``)."""
    if isinstance(error, StoreUnavailable):
        return store_unavailable(error)
    return JSONResponse(status_code=500, content={"detail": f"{session}: its stored state does not load here: {error}"})


def owned_elsewhere(session: dict, holder: LeaseHolder) -> JSONResponse:
    """The reply for a session another worker owns under a live lease: 503, and (sent through the session
    layer) the session's cookie naming that worker and its replica, where the retry goes."""
    for key in (REPLICA_KEY, FORWARD_PORT_KEY):
        session.pop(key, None)
    session.update({**holder.keys, OWNER_KEY: holder.worker})
    return retry_later(
        f"This session's owner in the store is worker {holder.worker} now (it took the session over while this "
        "worker's owner lease had expired); this request did not take effect here. Retry it: the cookie names that worker."
    )


def replayed(applied: Applied) -> Response:
    """The reply of a request its session applied already, sent again in place of running it a second time."""
    if applied.body is None:
        detail = f"This request ({ID_HEADER_NAME} {applied.request_id}) was applied already; its reply was too large to keep."
        return JSONResponse(status_code=applied.status, content={"detail": detail}, headers={REPLAYED_HEADER: "true"})
    headers = {name: value for name, value in applied.headers if name.lower() != "content-type"}
    media_type = next((value for name, value in applied.headers if name.lower() == "content-type"), None)
    return Response(applied.body, status_code=applied.status, headers={**headers, REPLAYED_HEADER: "true"}, media_type=media_type)


def in_flight(request: str) -> JSONResponse:
    detail = f"A request with {ID_HEADER_NAME} {request} is being served now; retry it once that one is answered."
    return retry_later(detail, status=409)
