"""An ended durable session's row: kept in the store in place of its state, so that any worker knows it ended, and why.

A tombstone is a row whose state is the JSON object ``{"nemo_gym.ended": DETAIL}`` (no server's state is
that object: the key is the framework's). It is written as any state is (``SessionStore.commit``), so a
store needs nothing of its own for it, and it lives as a row does: until its ``expires_at``, the cookie's
max age after the end, when the store's purge takes it (one small row per ended session meanwhile). No
worker adopts or restores a tombstone; a request for its session gets 410 with the detail, but for a
request the session applied already: a tombstone written by a request of its session (``/verify``)
remembers the requests its row did, that one with its reply (``durable.applied``), so a verify sent again
with its id gets its reward again.
"""

from __future__ import annotations

import json

from nemo_gym.durable.applied import STATE_KEY, state_of

KEY = "nemo_gym.ended"
PREFIX = json.dumps({KEY: ""})[:-3]
# A tombstone with the requests its row remembers (``applied.wrap``), as its row's text begins.
REMEMBERING_PREFIX = json.dumps({STATE_KEY: PREFIX})[:-2]


def tombstone(detail: str) -> str:
    return json.dumps({KEY: detail})


def ended_detail(state: str | None) -> str | None:
    """The detail a tombstone carries (one that remembers requests too), or None for a state that is no tombstone."""
    if state is not None and state.startswith(REMEMBERING_PREFIX):
        state = state_of(state)
    if state is None or not state.startswith(PREFIX):
        return None
    try:
        data = json.loads(state)
    except ValueError:
        return None
    return data[KEY] if isinstance(data, dict) and len(data) == 1 and isinstance(data.get(KEY), str) else None
