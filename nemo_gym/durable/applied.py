"""Requests applied to a session, remembered in its row with its state, so that none is applied twice.

Every request that may change a session carries a request id (``Idempotency-Key``: the client's own, or
one the first worker that received it assigned, passed on every hop). When a request changes its
session's state, its id and its reply go into the session's row in the same commit as the state: the
last ``WINDOW`` of them. A request whose id the row holds is not run again, on any worker of any host,
after an adoption, a restore or a restart: its stored reply is sent instead. So a forward given up on a
frozen owner that had committed it, replayed to the adopter, or a client's retry after a 503 that said
it may have taken effect, is applied once.

A row with remembered requests holds the JSON object ``{"nemo_gym.state": STATE, "nemo_gym.applied":
[...]}`` in place of the server's state text (no server's state is that object: the keys are the
framework's); a row without any holds the state text as it is. A reply body over ``KEPT_BODY_BYTES``
is not kept: its request is still never applied twice, and a repeat of it gets its status with a body
that says so.
"""

from __future__ import annotations

import base64
import functools
import json
from dataclasses import dataclass, field
# ``json.dumps`` of a string, as its C encoder writes it (ASCII, escapes as json writes them), without the
# encoder's set-up on each call.
from json.encoder import encode_basestring_ascii as json_string

STATE_KEY = "nemo_gym.state"
APPLIED_KEY = "nemo_gym.applied"
PREFIX = json.dumps({STATE_KEY: ""})[:-3]
# Between the state's JSON and the remembered requests' in a row, as ``json.dumps`` writes the object.
APPLIED_INFIX = f", {json.dumps(APPLIED_KEY)}: ["
# How many of a session's latest applied requests its row remembers: a retry comes within a few requests.
WINDOW = 16
KEPT_BODY_BYTES = 16 * 1024
# Reply headers that belong to the reply as sent, not to what it says: the session layer sets the cookie
# again, and the server frames the body again.
NOT_KEPT = {b"set-cookie", b"content-length", b"date", b"server", b"transfer-encoding"}


@dataclass(frozen=True)
class Applied:
    """A request applied to a session, and its reply (``body`` None: too large to keep)."""

    request_id: str
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes | None

    # Its JSON text in a row, made once (with it): a row is written again with every change of its session,
    # and holds each request through the next ``WINDOW`` of them.
    encoded: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Written piece by piece, as ``json.dumps`` of ``to_json`` would (base64 needs no escapes); a reply's
        # headers are most often those of the previous reply.
        body = "null" if self.body is None else f'"{base64.b64encode(self.body).decode()}"'
        object.__setattr__(self, "encoded", f"[{json_string(self.request_id)}, {self.status:d}, {encoded_headers(self.headers)}, {body}]")

    def to_json(self) -> list:
        """What its row holds of it, as ``encoded`` writes it."""
        return [self.request_id, self.status, [list(header) for header in self.headers], None if self.body is None else base64.b64encode(self.body).decode()]

    @classmethod
    def from_json(cls, data: list) -> Applied:
        request_id, status, headers, body = data
        return cls(request_id, status, tuple((name, value) for name, value in headers), None if body is None else base64.b64decode(body))


@functools.lru_cache(maxsize=64)
def encoded_headers(headers: tuple[tuple[str, str], ...]) -> str:
    return json.dumps([list(header) for header in headers])


def kept_headers(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str], ...]:
    return tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in headers if name.lower() not in NOT_KEPT)


def wrap(state: str, applied: list[Applied]) -> str:
    """The row text of ``state`` with ``applied`` remembered (the state as it is when none is)."""
    if not applied:
        return state
    # As json.dumps({STATE_KEY: state, APPLIED_KEY: [...]}) writes it, with each request's text made once.
    return f"{PREFIX}{json_string(state)}{APPLIED_INFIX}{', '.join([item.encoded for item in applied])}]}}"


def remembered(row: str, request_id: str) -> Applied | None:
    """The request ``request_id`` as the row remembers it, if it does."""
    return next((applied for applied in unwrap(row)[1] if applied.request_id == request_id), None)


def unwrap(row: str) -> tuple[str, list[Applied]]:
    """The state text a row holds, and the requests it remembers."""
    data = remembering(row)
    return (row, []) if data is None else (data[STATE_KEY], [Applied.from_json(item) for item in data[APPLIED_KEY]])


def state_of(row: str) -> str:
    """The state text a row holds (``unwrap``'s, without making the requests it remembers)."""
    data = remembering(row)
    return row if data is None else data[STATE_KEY]


def remembering(row: str) -> dict | None:
    """The object of a row that remembers requests, as JSON reads it; None for a row that is the state as it is."""
    if not row.startswith(PREFIX):
        return None
    try:
        data = json.loads(row)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != {STATE_KEY, APPLIED_KEY}:
        return None
    return data
