"""The SQLite session store (``store.SessionStore``): one file per instance, in WAL mode, shared by the
instance's workers on one host.

Writers take turns on an ``flock`` beside the file: the kernel wakes the next one as soon as the lock
is free, where SQLite's own busy handler would sleep (and block the worker's event loop) for milliseconds.
A worker waits for its turn in a thread, so its event loop serves on meanwhile (``commit``).

``synchronous = NORMAL``: in WAL mode a commit is in the log, in the kernel's page cache, when it
returns, so it survives the process being killed (the promise: nothing acknowledged is lost when a
worker dies). ``OFF`` would keep that too, and save an fsync at each checkpoint, but a power cut could
then corrupt the whole file; with ``NORMAL`` it loses at most the last commits. The fsync is paid once
per checkpoint (about every 1000 pages of log), not per write, and writes are group-committed
(``keeper``), so it is a small share of the cost (an fsync took 0.2 ms on this project's VM).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from nemo_gym.durable.store import STORE_TIMEOUT_SECONDS, SessionConflict, SessionTaken, StoredSession, StoreError, StoreUnavailable
from nemo_gym.sessions.cookie import SESSION_MAX_AGE_SECONDS
from nemo_gym.sessions.secret import state_dir

logger = logging.getLogger(__name__)

PURGE_INTERVAL_SECONDS = 3600
BUSY_TIMEOUT_MS = 10_000
# A store that cannot commit (its disk full, say) is reported at most once per this many seconds.
FAILURE_LOG_INTERVAL_SECONDS = 10
# A table with rowids (the session id's key in an index beside it): a row is its state and the requests it
# remembers (``durable.applied``), often more than a kilobyte (a verify's reply), and a table without rowids
# keeps at most about 1000 bytes of a row in its 4 KiB page, the rest in an overflow page of its own. Measured
# with scripts/bench_store_rows.py (4 writers, a counter episode's rows): 19 µs of CPU per row write against
# 35 µs without rowids. A file made before keeps its table as it was made; both are read and written alike.
SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    owner TEXT,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_expiry ON sessions (expires_at);
"""


COLUMNS = ("session_id", "owner", "revision", "state", "expires_at")


def store_path(instance_name: str) -> Path:
    return state_dir() / "sessions" / f"{instance_name}.sqlite3"


def private_file(path: Path) -> int:
    """A descriptor of ``path`` opened for writing (made if missing), readable and writable by its owner only."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def unusable(path: Path, error: Exception) -> StoreError:
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return StoreError(
        f"the session store {path} cannot be used: {reason}. It is not a store this server can open and write; "
        "move it aside (to keep it for a look) or remove it, and start again: the server then begins with an empty "
        "store, and the sessions the file held are lost to it"
    )


class SQLiteStore:
    """One worker's (or one command's) connection to an instance's store file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.write_lock = private_file(Path(f"{path}.lock"))
        except OSError as error:
            raise unusable(path, error) from None
        try:
            # One worker at a time sets the file up: switching to WAL needs the database to itself.
            with self.writing():
                self.db = self.connect()
        except (OSError, sqlite3.Error, StoreError) as error:
            os.close(self.write_lock)
            raise unusable(path, error) from None
        self.next_purge = 0.0
        self.failures = 0
        self.failure_logged_at: float | None = None
        self.purge_expired()

    @classmethod
    def open(cls, location: str | None, instance_name: str, *, create: bool = True, timeout_seconds: float = STORE_TIMEOUT_SECONDS) -> SQLiteStore:
        """The file at ``location`` (a path, ``sqlite://`` before it or not), or the instance's own. A local
        file has no deadline of its own (``timeout_seconds`` is a network store's): its writes wait
        ``BUSY_TIMEOUT_MS`` at most for another worker's transaction."""
        path = store_path(instance_name) if location is None else Path(location.removeprefix("sqlite://"))
        if not create and not path.exists():
            raise StoreError(f"instance {instance_name!r} has no session store at {path}")
        return cls(path)

    def connect(self) -> sqlite3.Connection:
        """The file opened as a store (made 0600, and its log with it), its schema checked; raises on a file that is none."""
        os.close(private_file(self.path))
        for companion in (f"{self.path}-wal", f"{self.path}-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(companion, 0o600)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA journal_mode = WAL")
            db.executescript(SCHEMA)
            columns = [row[1] for row in db.execute("PRAGMA table_info(sessions)")]
            if columns != list(COLUMNS):
                raise StoreError(f"its sessions table has the columns {columns}, not {list(COLUMNS)}")
            # A commit survives the process being killed; a power cut loses at most the last ones (see above).
            db.execute("PRAGMA synchronous = NORMAL")
            # A checkpoint leaves the log no longer than this, so the store's size follows its live rows.
            db.execute("PRAGMA journal_size_limit = 262144")
        except BaseException:
            db.close()
            raise
        return db

    async def read(self, session_id: str) -> StoredSession | None:
        row = self.db.execute(
            "SELECT session_id, owner, revision, state, expires_at FROM sessions WHERE session_id = ? AND expires_at > ?",
            (session_id, time.time()),
        ).fetchone()
        return None if row is None else StoredSession(*row)

    def write(self, session_id: str, owner: str | None, state: str) -> None:
        """Insert or update the session's state; raises ``SessionTaken`` if another worker owns it."""
        with self.writing():
            taken = self.write_all(owner, {session_id: state})
        if taken:
            raise SessionTaken(f"session {session_id} belongs to another worker in the store {self.path}")

    async def commit(self, owner: str | None, states: dict[str, str | None]) -> set[str]:
        async with self.turn():
            return self.write_all(owner, states)

    def write_all(self, owner: str | None, states: dict[str, str | None]) -> set[str]:
        """``commit``'s transaction, for a caller that holds the write lock."""
        now = time.time()
        taken = set()
        with self.committing(), self.transaction():
            for session_id, state in states.items():
                if state is None:
                    self.db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
                elif not self.db.execute(
                    "INSERT INTO sessions (session_id, owner, revision, state, expires_at) VALUES (?, ?, 1, ?, ?) "
                    "ON CONFLICT (session_id) DO UPDATE SET revision = revision + 1, state = excluded.state, "
                    "expires_at = excluded.expires_at WHERE owner IS excluded.owner",
                    (session_id, owner, state, now + SESSION_MAX_AGE_SECONDS),
                ).rowcount:
                    taken.add(session_id)
            if now >= self.next_purge:
                self.delete_expired(now)
        return taken

    async def claim(self, session: StoredSession, new_owner: str | None, owner_dead: bool = False) -> bool:
        with self.writing(), self.committing():
            return bool(
                self.db.execute(
                    "UPDATE sessions SET owner = ?, revision = revision + 1 WHERE session_id = ? AND owner IS ? AND revision = ?",
                    (new_owner, session.session_id, session.owner, session.revision),
                ).rowcount
            )

    def delete(self, session_id: str) -> None:
        with self.writing():
            self.write_all(None, {session_id: None})

    def purge_expired(self) -> None:
        with self.writing():
            self.delete_expired(time.time())

    def delete_expired(self, now: float) -> None:
        self.db.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,))
        self.next_purge = now + PURGE_INTERVAL_SECONDS

    async def unused_since(self, used_before: float) -> list[StoredSession]:
        rows = self.db.execute(
            "SELECT session_id, owner, revision, state, expires_at FROM sessions WHERE owner IS NOT NULL AND expires_at > ? AND expires_at < ? ORDER BY session_id",
            (time.time(), used_before + SESSION_MAX_AGE_SECONDS),
        ).fetchall()
        return [StoredSession(*row) for row in rows]

    def export(self) -> list[StoredSession]:
        # One statement, so one transaction: the list is one moment of the store.
        rows = self.db.execute(
            "SELECT session_id, owner, revision, state, expires_at FROM sessions WHERE expires_at > ? ORDER BY session_id",
            (time.time(),),
        ).fetchall()
        return [StoredSession(*row) for row in rows]

    def import_sessions(self, sessions: list[StoredSession]) -> None:
        with self.writing(), self.transaction():
            for session in sessions:
                try:
                    self.db.execute(
                        "INSERT INTO sessions (session_id, owner, revision, state, expires_at) VALUES (?, ?, ?, ?, ?)",
                        (session.session_id, session.owner, session.revision, session.state, session.expires_at),
                    )
                except sqlite3.IntegrityError:
                    raise SessionConflict(f"the store {self.path} already holds session {session.session_id}") from None

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        fcntl.flock(self.write_lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.write_lock, fcntl.LOCK_UN)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """The write lock for a worker's event loop: while another process holds it, the loop serves on
        and a thread waits. Entered by one task at a time, never cancelled (``commit``'s promise)."""
        try:
            fcntl.flock(self.write_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            await asyncio.to_thread(fcntl.flock, self.write_lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.write_lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A failed COMMIT (a full disk) leaves no transaction open: SQLite may have rolled it back itself."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """A write: SQLite's and the file system's errors become ``StoreUnavailable``, reported at most
        once per ``FAILURE_LOG_INTERVAL_SECONDS`` (with how many failed meanwhile), and the first commit
        after them says the store writes again."""
        try:
            yield
        except (sqlite3.Error, OSError) as error:
            self.failures += 1
            now = time.monotonic()
            if self.failure_logged_at is None or now - self.failure_logged_at >= FAILURE_LOG_INTERVAL_SECONDS:
                logger.error("the session store %s cannot commit (%d writes failed since the last report): %r", self.path, self.failures, error)
                self.failure_logged_at, self.failures = now, 0
            raise StoreUnavailable(f"the session store {self.path} cannot commit: {error}") from error
        if self.failure_logged_at is not None:
            logger.warning("the session store %s commits again (%d more writes had failed)", self.path, self.failures)
            self.failure_logged_at, self.failures = None, 0

    def size_bytes(self) -> int:
        """The file and its write-ahead log, as they take space on disk now."""
        return sum(os.path.getsize(p) for p in (self.path, f"{self.path}-wal") if os.path.exists(p))

    def close(self) -> None:
        self.db.close()
        os.close(self.write_lock)
