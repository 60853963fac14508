"""Request ids: what names a request that may change a session, on every hop and every retry of it.

``Idempotency-Key`` (the IETF draft's header) is the client's own, or, on a request that may change
state and carries none, one the worker that sends it on to another assigns (the router's forward, the relay:
``new_id_header``), which every later hop, and a replay to an adopter, passes on with the rest of the head. A request
served where it landed is sent again by nothing and gets none. A durable server remembers the ids of the requests
that changed a session with its state (``nemo_gym.durable.applied``).
"""

from __future__ import annotations

import re
import secrets

ID_HEADER_NAME = "Idempotency-Key"
ID_HEADER = ID_HEADER_NAME.lower().encode()
# A request id: printable ASCII without spaces, at most this long (the draft's keys are UUIDs or the like).
MAX_ID_LENGTH = 255
# One match in C on every request that carries an id, where a loop over its bytes cost microseconds.
VALID_ID = re.compile(rb"[\x21-\x7e]{1,%d}" % MAX_ID_LENGTH)
# Methods that change nothing: their requests get no id.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def request_id(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name == ID_HEADER:
            return value
    return None


def id_of(scope: dict) -> str | None:
    """The request's id as text (a forwarded request that may change state always has one), or None."""
    value = request_id(scope["headers"])
    return None if value is None else value.decode("latin-1")


def valid_id(value: bytes) -> bool:
    return VALID_ID.fullmatch(value) is not None


def new_id_header() -> tuple[bytes, bytes]:
    """A request id of the worker's own, as a header: 128 random bits."""
    return ID_HEADER, secrets.token_hex(16).encode()
