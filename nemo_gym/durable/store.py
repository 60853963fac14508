"""The session store seam: what a store of durable sessions promises, and the choice of one by its location.

A store holds one row per live session: its id, its owner worker, a revision that every write and every
change of owner raises by one, the state as JSON, and when it expires. A worker writes only rows it owns;
taking a row over is one compare-and-set on owner and revision, so of several workers racing, one wins.
``keeper`` and ``adoption`` use it on a request's path (``read``, ``claim``, ``commit``, awaited, so a store
across a network keeps the event loop serving), and the idle sweep to find dead owners' old rows
(``unused_since``); ``transfer`` and ``gym sessions`` take every row out and put rows in (``export``,
``import_sessions``). A store is chosen by its location (``open_store``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

# The default of the ``store_timeout_seconds`` setting: a store that has not answered an operation in this
# long counts as down for it. Below the owner lease's valid share (9 s of 10), so a renewal that times out
# leaves time for another before the lease runs out.
STORE_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class StoredSession:
    session_id: str
    owner: str | None
    revision: int
    state: str
    expires_at: float


class SessionTaken(RuntimeError):
    """A worker wrote a session another worker owns in the store."""


class StoreError(ValueError):
    """The store cannot be used (not a database, another schema, not a file, not writable, no such kind)."""


class SessionConflict(ValueError):
    """A restore names a session the store already holds."""


class StoreUnavailable(RuntimeError):
    """The store could not commit a write (its file system full, an I/O error, a refused connection):
    nothing of it was written."""

    # Whether the operation may have taken effect all the same (``StoreTimedOut``).
    may_have_applied = False


class StoreTimedOut(StoreUnavailable):
    """The store did not answer within its deadline. An operation that was sent may still be applied when
    the store answers again (``may_have_applied``); one that waited for its turn was never sent."""

    def __init__(self, message: str, sent: bool) -> None:
        super().__init__(message)
        self.may_have_applied = sent


class SessionStore(Protocol):
    """One worker's (or one command's) connection to an instance's store."""

    # Where the store is, for messages (never with a credential in it).
    location: str

    @classmethod
    def open(cls, location: str | None, instance_name: str, *, create: bool = True, timeout_seconds: float = STORE_TIMEOUT_SECONDS) -> SessionStore:
        """Connect to the store at ``location`` (None: the instance's default one), made if missing unless
        ``create`` is false; raises ``StoreError`` for a store that cannot be used, or is missing. A store
        reached over a network gives each awaited operation ``timeout_seconds``, then raises
        ``StoreTimedOut``; a local file's are bounded by its own lock's wait."""

    async def read(self, session_id: str) -> StoredSession | None:
        """The session's live row, or None (never stored, deleted, or expired)."""

    async def commit(self, owner: str | None, states: dict[str, str | None]) -> set[str]:
        """Insert or update each session's state as ``owner``'s, all in one transaction (None deletes the
        row); returns the sessions left as they were because another worker owns them. Called by one task
        at a time, never cancelled (the keeper's committer). Raises ``StoreUnavailable`` if it cannot
        commit, and then nothing of it is written."""

    async def claim(self, session: StoredSession, new_owner: str | None, owner_dead: bool = False) -> bool:
        """Take the session over if its row is still as read (same owner, same revision), raising the
        revision: of several racing, one wins. ``owner_dead``: the caller's kernel proved the owner dead;
        else a store shared across hosts (``lease.LeaseStore``) takes it only once the owner's lease has
        expired (SQLite's owners are all of one host, proved dead before any claim). Raises
        ``StoreUnavailable`` if the change cannot commit."""

    async def unused_since(self, used_before: float) -> list[StoredSession]:
        """The live rows with an owner whose last write (their last use: the expiry less
        ``sessions.cookie.SESSION_MAX_AGE_SECONDS``: a row lives as long as the cookie naming it) came before ``used_before``, epoch seconds: the idle sweep's candidates."""

    def export(self) -> list[StoredSession]:
        """Every live row, by session id, as of one moment of the store."""

    def import_sessions(self, sessions: list[StoredSession]) -> None:
        """Insert the rows as given, all or nothing: one the store already holds raises ``SessionConflict``."""

    def close(self) -> None:
        """Let go of the store (its rows stay)."""


# The kinds of store by the scheme of their location (uvicorn's style: an import string, so a kind's
# driver is imported only where it is used). A location with no scheme is a file path, for SQLite.
STORES = {
    "sqlite": "nemo_gym.durable.sqlite_store:SQLiteStore",
    "postgresql": "nemo_gym.durable.postgresql_store:PostgreSQLStore",
    "postgres": "nemo_gym.durable.postgresql_store:PostgreSQLStore",
}


def open_store(location: str | None, instance_name: str, *, create: bool = True, timeout_seconds: float = STORE_TIMEOUT_SECONDS) -> SessionStore:
    """The store at ``location``: ``scheme://...`` names its kind; a path or None (the instance's own file
    under the state directory) is SQLite. Raises ``StoreError`` for a kind there is none of."""
    scheme, separator, _ = (location or "").partition("://")
    kind = scheme if separator else "sqlite"
    if kind not in STORES:
        raise StoreError(f"the session store of {instance_name!r} cannot be used: no store is of the kind {kind!r} (the kinds: {', '.join(sorted(STORES))}, or a file path for SQLite)")
    module, _, name = STORES[kind].partition(":")
    return getattr(importlib.import_module(module), name).open(location, instance_name, create=create, timeout_seconds=timeout_seconds)
