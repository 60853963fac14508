"""One worker's record of its sessions: the live ones with their last use, and the ended ones with why.

A session is live from its first request on this worker until it ends; it ends once (``end`` says whether
this call ended it), which is what makes the teardown hook run once. An ended session is remembered, with
the detail its later requests get in their 410, in a bounded set: at most ``max_tombstones`` of them, each
for at most ``tombstone_seconds`` (the cookie's max age: a cookie can come back no later). Past either
bound the worker no longer knows the session, and a request for it is one of a new session; a durable
session's tombstone row (``nemo_gym.durable.tombstones``) still answers for it once its owner is gone.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from enum import StrEnum

from nemo_gym.sessions.cookie import SESSION_MAX_AGE_SECONDS

MAX_TOMBSTONES = 100_000


class EndReason(StrEnum):
    """Why a session ended: the ``reason`` that ``on_session_end`` receives."""

    VERIFY = "verify"
    CLOSE = "close"
    IDLE = "idle"
    EXPIRED = "expired"
    # The store holds the session for another worker now (it adopted it): this worker's copy is dropped.
    CONFLICT = "conflict"
    # The worker stopped with the session live in its memory only (a durable session lives on, for a restart).
    STOP = "stop"


class SessionRegistry:
    def __init__(self, max_tombstones: int = MAX_TOMBSTONES, tombstone_seconds: float = SESSION_MAX_AGE_SECONDS) -> None:
        self.max_tombstones = max_tombstones
        self.tombstone_seconds = tombstone_seconds
        # Session id -> when it was last used (time.time(): durable rows keep it across workers).
        self.last_used: dict[str, float] = {}
        # Requests of each live session being served now: such a session is never idle.
        self.busy: Counter[str] = Counter()
        # Session id -> (when it ended, the detail of its 410), oldest first.
        self.tombstones: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.last_used)

    def is_live(self, session_id: str) -> bool:
        return session_id in self.last_used

    def start(self, session_id: str, last_used: float | None = None) -> None:
        """The session is live (again, after a restore brought it back: its tombstone goes)."""
        self.tombstones.pop(session_id, None)
        self.last_used[session_id] = time.time() if last_used is None else last_used

    def enter(self, session_id: str) -> None:
        """A request of the live session starts."""
        self.busy[session_id] += 1
        self.last_used[session_id] = time.time()

    def leave(self, session_id: str) -> None:
        """A request of the session is done; its end counts as a use (a long request is no idleness)."""
        self.busy[session_id] -= 1
        if self.busy[session_id] <= 0:
            del self.busy[session_id]
        if session_id in self.last_used:
            self.last_used[session_id] = time.time()

    def ended(self, session_id: str) -> str | None:
        """The 410 detail of an ended session still remembered, or None."""
        entry = self.tombstones.get(session_id)
        if entry is None:
            return None
        if time.time() - entry[0] > self.tombstone_seconds:
            del self.tombstones[session_id]
            return None
        return entry[1]

    def end(self, session_id: str, detail: str) -> bool:
        """End a live session: True if this call ended it (it was live), False if it was not (ended already, or never started)."""
        if self.last_used.pop(session_id, None) is None:
            return False
        self.remember(session_id, detail)
        return True

    def remember(self, session_id: str, detail: str) -> None:
        self.tombstones[session_id] = (time.time(), detail)
        self.tombstones.move_to_end(session_id)
        while len(self.tombstones) > self.max_tombstones:
            self.tombstones.popitem(last=False)

    def idle(self, used_before: float) -> list[str]:
        """The live sessions last used before ``used_before`` with no request being served now."""
        return [session_id for session_id, used in self.last_used.items() if used < used_before and session_id not in self.busy]
