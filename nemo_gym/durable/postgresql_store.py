"""The PostgreSQL session store (``store.SessionStore``, with ``lease.LeaseStore``): one database that the
workers of every replica share, on any host, so a session outlives its host.

Chosen by a location ``postgresql://`` (or ``postgres://``) ``user@host:port/database``, in libpq's URL
form (its query may add any libpq parameter, such as ``sslmode``). The password may be in the URL, or,
better, come from libpq's own sources: the ``PGPASSWORD`` environment variable, or a password file
(``PGPASSFILE``, ``~/.pgpass``, or ``?passfile=...``). It is never printed: ``location`` is the URL
rebuilt without it (``nemo_gym.config.redaction``, as the head endpoint and ``gym env resolve`` show it),
libpq's errors are shown with it taken out, and a location libpq cannot read (a bad ``%`` escape, or a
raw ``@`` or ``/`` in the password, which libpq reads in part as a host) is refused without libpq's
words, which quote it.

The driver is psycopg 3: the store has both sync methods (``open``, ``export``, ``import_sessions``, for
commands) and async ones on a request's path (``read``, ``commit``, ``claim``, and the lease's), and
psycopg has a sync and an asyncio connection in one library, with libpq's handling of credentials and
connection parameters; asyncpg is asyncio only, so commands would need a second driver or an event loop.

Tables (shared by the instances of one database): ``nemo_gym_sessions`` holds one row per live session,
keyed by instance and session id, with its owner, revision, state and expiry as SQLite's does;
``nemo_gym_owner_leases`` one row per worker that holds a lease (``lease``): its incarnation, where its
kernel's liveness proves it dead (``domain``), the keys its cookies carry, and when it expires, by the
database's clock (every comparison of lease times is made by the database, so hosts' clocks never meet).

A worker's requests go through one asyncio connection (made on first use, made again after it breaks),
one operation at a time, and its lease through another, so a renewal never waits behind requests. ``commit`` is one statement, so one transaction: each session's row is written
only if this worker owns it (or it is new) and, once the worker holds a lease, only while that lease, of
the incarnation it renewed last, is unexpired; rows left as they were are returned as taken. ``claim``
takes a row over by compare-and-set on owner and revision, and, unless the caller knows the owner dead,
only once the owner's lease has expired: it locks the lease row (``FOR SHARE``) before it reads the
expiry, and a renewal locks it (``FOR UPDATE``) before it checks the expiry, so of a claim and a
renewal at once, the later one sees what the earlier one did (``lease`` says why that fences). Errors
of the server or the connection (PostgreSQL down, a full disk) raise ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time

import psycopg
from psycopg.conninfo import conninfo_to_dict

from nemo_gym.config.redaction import misread, scrubbed, shown_url
from nemo_gym.durable.lease import LeaseHolder
from nemo_gym.durable.store import STORE_TIMEOUT_SECONDS, SessionConflict, StoredSession, StoreError, StoreTimedOut, StoreUnavailable
from nemo_gym.sessions.cookie import SESSION_MAX_AGE_SECONDS

logger = logging.getLogger(__name__)

SESSIONS_TABLE = "nemo_gym_sessions"
LEASES_TABLE = "nemo_gym_owner_leases"
COLUMNS = ("instance", "session_id", "owner", "revision", "state", "expires_at")
LEASE_COLUMNS = ("worker", "incarnation", "domain", "keys", "expires_at")
# libpq's parameters the store sets unless the location does: a server that does not answer a connect
# in this time, or leaves sent data unacknowledged this long (a partition), fails the operation.
CONNECTION_DEFAULTS = {"connect_timeout": "5", "tcp_user_timeout": "10000", "application_name": "nemo_gym"}
PURGE_INTERVAL_SECONDS = 3600
# A lease expired this long ago is no worker's any more (its sessions were adopted or are adoptable).
STALE_LEASE_SECONDS = 24 * 3600
FAILURE_LOG_INTERVAL_SECONDS = 10
# One worker at a time sets the schema up (CREATE TABLE IF NOT EXISTS races with itself).
SCHEMA_LOCK = 7_366_105_010_021
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {SESSIONS_TABLE} (
    instance text NOT NULL,
    session_id text NOT NULL,
    owner text,
    revision bigint NOT NULL,
    state text NOT NULL,
    expires_at double precision NOT NULL,
    PRIMARY KEY (instance, session_id)
);
CREATE INDEX IF NOT EXISTS {SESSIONS_TABLE}_by_expiry ON {SESSIONS_TABLE} (expires_at);
CREATE TABLE IF NOT EXISTS {LEASES_TABLE} (
    worker text PRIMARY KEY,
    incarnation bigint NOT NULL,
    domain text NOT NULL,
    keys text NOT NULL,
    expires_at timestamptz NOT NULL
);
"""
# The lease condition of ``commit``: the worker's lease, of the incarnation it renewed last, unexpired now.
FENCE = f"(%(fence)s::bigint IS NULL OR EXISTS (SELECT 1 FROM {LEASES_TABLE} WHERE worker = %(owner)s AND incarnation = %(fence)s AND expires_at > clock_timestamp()))"
# The ids and states go in binary (``%b``): in text, psycopg quotes every element of an array with a regular
# expression that calls back into Python for each double quote, and a row holding applied requests has dozens.
COMMIT = f"""
WITH input AS (SELECT * FROM unnest(%(ids)b::text[], %(states)b::text[]) AS i(session_id, state)),
present AS (
    SELECT s.session_id FROM {SESSIONS_TABLE} s JOIN input i USING (session_id) WHERE s.instance = %(instance)s AND i.state IS NULL
),
deleted AS (
    DELETE FROM {SESSIONS_TABLE} s USING input i
    WHERE s.instance = %(instance)s AND s.session_id = i.session_id AND i.state IS NULL AND s.owner IS NOT DISTINCT FROM %(owner)s AND {FENCE}
    RETURNING s.session_id
),
written AS (
    INSERT INTO {SESSIONS_TABLE} (instance, session_id, owner, revision, state, expires_at)
    SELECT %(instance)s, i.session_id, %(owner)s, 1, i.state, %(expires_at)s FROM input i WHERE i.state IS NOT NULL AND {FENCE}
    ON CONFLICT (instance, session_id) DO UPDATE SET revision = {SESSIONS_TABLE}.revision + 1, state = excluded.state,
        expires_at = excluded.expires_at WHERE {SESSIONS_TABLE}.owner IS NOT DISTINCT FROM excluded.owner
    RETURNING session_id
)
SELECT 'written', session_id FROM written UNION ALL SELECT 'deleted', session_id FROM deleted UNION ALL SELECT 'present', session_id FROM present
"""


class PostgreSQLStore:
    """One worker's (or one command's) connection to the shared store, for one instance."""

    def __init__(self, location: str, instance_name: str, *, create: bool = True, timeout_seconds: float = STORE_TIMEOUT_SECONDS) -> None:
        self.location = shown_url(location)
        self.timeout_seconds = timeout_seconds
        self.instance = instance_name
        self.written = location
        if misread(location):
            raise StoreError(
                f"the session store {self.location} of {instance_name!r} cannot be used: its user or password holds an '@' or '/' "
                "libpq would read as part of the host or database; write them percent-encoded (%40, %2F)"
            )
        try:
            params = conninfo_to_dict(location)
        except (psycopg.ProgrammingError, UnicodeDecodeError):
            # libpq's words quote the part it could not read, which may be the password (or it decodes to no text).
            raise StoreError(
                f"the session store {self.location} of {instance_name!r} cannot be used: libpq cannot read its location "
                "(a '%' must begin an escape of two hex digits: write a '%' in a password as %25)"
            ) from None
        self.params = {**CONNECTION_DEFAULTS, **params}
        try:
            self.db = psycopg.connect(**self.params, autocommit=True)
        except psycopg.Error as error:
            raise self.unusable(error) from None
        try:
            if create:
                with self.db.transaction():
                    self.db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                    self.db.execute(SCHEMA)
            self.check_schema()
            self.purge_expired()
        except (psycopg.Error, StoreError) as error:
            self.db.close()
            raise error if isinstance(error, StoreError) else self.unusable(error) from None
        # Each channel's asyncio connection and its lock: the lease's own, so a renewal never waits behind requests.
        self.channels: dict[str, tuple[asyncio.Lock, list[psycopg.AsyncConnection | None]]] = {}
        # The incarnation of this worker's lease that its commits are fenced by (``lease``); None: no lease.
        self.fence: int | None = None
        self.next_purge = time.time() + PURGE_INTERVAL_SECONDS
        self.failures = 0
        self.failure_logged_at: float | None = None

    @classmethod
    def open(cls, location: str | None, instance_name: str, *, create: bool = True, timeout_seconds: float = STORE_TIMEOUT_SECONDS) -> PostgreSQLStore:
        return cls(location, instance_name, create=create, timeout_seconds=timeout_seconds)

    def unusable(self, error: Exception) -> StoreError:
        return StoreError(f"the session store {self.location} of {self.instance!r} cannot be used: {self.reason(error)}")

    def reason(self, error: Exception) -> str:
        """libpq's words for ``error``, with the location's credentials taken out."""
        return scrubbed(str(error).strip(), self.written)

    def check_schema(self) -> None:
        for table, expected in ((SESSIONS_TABLE, COLUMNS), (LEASES_TABLE, LEASE_COLUMNS)):
            columns = [row[0] for row in self.db.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
                (table,),
            )]
            if not columns:
                raise StoreError(f"instance {self.instance!r} has no session store at {self.location} (no table {table})")
            if columns != list(expected):
                raise StoreError(f"the session store {self.location} cannot be used: its table {table} has the columns {columns}, not {list(expected)}")

    def purge_expired(self) -> None:
        self.db.execute(f"DELETE FROM {SESSIONS_TABLE} WHERE expires_at <= %s", (time.time(),))
        self.db.execute(f"DELETE FROM {LEASES_TABLE} WHERE expires_at < clock_timestamp() - make_interval(secs => %s)", (STALE_LEASE_SECONDS,))

    async def run(self, operation, channel: str = "requests"):
        """``operation(connection)`` on this worker's asyncio connection of ``channel`` (the request path's,
        or the lease's), one at a time, within ``timeout_seconds`` of the call, its wait for its turn
        included. The connection is made on first use, and dropped when an operation fails or times out
        (made again by the next). psycopg's errors become ``StoreUnavailable``, a deadline passed
        ``StoreTimedOut``; both are reported at most once per ``FAILURE_LOG_INTERVAL_SECONDS``.

        An operation past its deadline is left to end on its own (psycopg cancels it in the server, which
        a hung server may never answer) and its connection closed then: the caller is not kept waiting,
        and the next operation does not wait behind it."""
        lock, held = self.channels.setdefault(channel, (asyncio.Lock(), [None]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_seconds
        try:
            async with asyncio.timeout_at(deadline):
                await lock.acquire()
        except TimeoutError:
            raise self.timed_out(sent=False) from None
        try:
            attempt = asyncio.ensure_future(self.attempt(operation, held))
            try:
                done, _ = await asyncio.wait({attempt}, timeout=max(0.0, deadline - loop.time()))
            except BaseException:
                self.abandon(attempt, held)
                raise
            if not done:
                self.abandon(attempt, held)
                raise self.timed_out(sent=True)
            result = attempt.result()
        finally:
            lock.release()
        if self.failure_logged_at is not None:
            logger.warning("the session store %s commits again (%d more operations had failed)", self.location, self.failures)
            self.failure_logged_at, self.failures = None, 0
        return result

    async def attempt(self, operation, held: list[psycopg.AsyncConnection | None]):
        try:
            if held[0] is None or held[0].closed:
                held[0] = await psycopg.AsyncConnection.connect(**self.params, autocommit=True)
            try:
                return await operation(held[0])
            except psycopg.errors.AdminShutdown:
                # A connection the server ended (a restart) while it was idle: nothing of this ran. Once more, anew.
                with contextlib.suppress(psycopg.Error):
                    await held[0].close()
                held[0] = await psycopg.AsyncConnection.connect(**self.params, autocommit=True)
                return await operation(held[0])
        except psycopg.Error as error:
            connection, held[0] = held[0], None
            if connection is not None:
                with contextlib.suppress(psycopg.Error):
                    await connection.close()
            self.failed(error)
            raise StoreUnavailable(f"the session store {self.location} cannot commit: {self.reason(error)}") from error

    def abandon(self, attempt: asyncio.Future, held: list[psycopg.AsyncConnection | None]) -> None:
        """Let an operation past its deadline (or whose caller went away) end on its own, and close its connection then."""
        connection, held[0] = held[0], None

        def ended(task: asyncio.Future) -> None:
            if not task.cancelled():
                task.exception()  # retrieved: it was reported, or the deadline was
            if connection is not None and not connection.closed:
                connection.pgconn.finish()

        attempt.cancel()
        attempt.add_done_callback(ended)

    def timed_out(self, sent: bool) -> StoreTimedOut:
        error = StoreTimedOut(f"the session store {self.location} did not answer within {self.timeout_seconds:g} s", sent)
        self.failed(error)
        return error

    def failed(self, error: Exception) -> None:
        self.failures += 1
        now = time.monotonic()
        if self.failure_logged_at is None or now - self.failure_logged_at >= FAILURE_LOG_INTERVAL_SECONDS:
            logger.error("the session store %s cannot commit (%d operations failed since the last report): %s", self.location, self.failures, self.reason(error))
            self.failure_logged_at, self.failures = now, 0

    async def read(self, session_id: str) -> StoredSession | None:
        async def select(connection: psycopg.AsyncConnection):
            cursor = await connection.execute(
                f"SELECT session_id, owner, revision, state, expires_at FROM {SESSIONS_TABLE} WHERE instance = %s AND session_id = %s AND expires_at > %s",
                (self.instance, session_id, time.time()),
            )
            return await cursor.fetchone()

        row = await self.run(select)
        return None if row is None else StoredSession(*row)

    async def commit(self, owner: str | None, states: dict[str, str | None]) -> set[str]:
        now = time.time()
        params = {
            "ids": list(states),
            "states": list(states.values()),
            "owner": owner,
            "fence": self.fence if owner is not None else None,
            "instance": self.instance,
            "expires_at": now + SESSION_MAX_AGE_SECONDS,
        }

        async def write(connection: psycopg.AsyncConnection):
            cursor = await connection.execute(COMMIT, params)
            rows = await cursor.fetchall()
            if now >= self.next_purge:
                await connection.execute(f"DELETE FROM {SESSIONS_TABLE} WHERE expires_at <= %s", (now,))
                self.next_purge = now + PURGE_INTERVAL_SECONDS
            return rows

        rows = await self.run(write)
        done = {(kind, session_id) for kind, session_id in rows}
        kept = {session_id for session_id, state in states.items() if state is not None and ("written", session_id) not in done}
        undeleted = {session_id for kind, session_id in done if kind == "present" and ("deleted", session_id) not in done}
        return kept | undeleted

    async def claim(self, session: StoredSession, new_owner: str | None, owner_dead: bool = False) -> bool:
        fenced = session.owner is not None and session.owner != new_owner and not owner_dead

        async def take(connection: psycopg.AsyncConnection) -> bool:
            async with connection.transaction():
                if fenced:
                    # Locked first, then read: a renewal under way commits before the expiry is looked at.
                    await connection.execute(f"SELECT 1 FROM {LEASES_TABLE} WHERE worker = %s FOR SHARE", (session.owner,))
                    cursor = await connection.execute(f"SELECT expires_at > clock_timestamp() FROM {LEASES_TABLE} WHERE worker = %s", (session.owner,))
                    lease = await cursor.fetchone()
                    if lease is not None and lease[0]:
                        return False
                cursor = await connection.execute(
                    f"UPDATE {SESSIONS_TABLE} SET owner = %s, revision = revision + 1 "
                    "WHERE instance = %s AND session_id = %s AND owner IS NOT DISTINCT FROM %s AND revision = %s",
                    (new_owner, self.instance, session.session_id, session.owner, session.revision),
                )
                return cursor.rowcount == 1

        return await self.run(take)

    async def renew_lease(self, worker: str, incarnation: int | None, domain: str, keys: dict, seconds: float) -> int:
        """Extend ``worker``'s lease of ``incarnation`` by ``seconds`` from now, if it has not expired; else
        (expired, taken away, or never held) take a new one: the incarnation held now either way. Commits
        are fenced by it from now on."""

        async def renew(connection: psycopg.AsyncConnection) -> int:
            async with connection.transaction():
                if incarnation is not None:
                    # Locked first, then checked: a claim under way (``claim``) commits before the expiry is looked at.
                    await connection.execute(f"SELECT 1 FROM {LEASES_TABLE} WHERE worker = %s FOR UPDATE", (worker,))
                    cursor = await connection.execute(
                        f"UPDATE {LEASES_TABLE} SET expires_at = clock_timestamp() + make_interval(secs => %s) "
                        "WHERE worker = %s AND incarnation = %s AND expires_at > clock_timestamp()",
                        (seconds, worker, incarnation),
                    )
                    if cursor.rowcount == 1:
                        return incarnation
                fresh = secrets.randbits(62)
                await connection.execute(
                    f"INSERT INTO {LEASES_TABLE} (worker, incarnation, domain, keys, expires_at) "
                    "VALUES (%s, %s, %s, %s, clock_timestamp() + make_interval(secs => %s)) ON CONFLICT (worker) DO UPDATE "
                    "SET incarnation = excluded.incarnation, domain = excluded.domain, keys = excluded.keys, expires_at = excluded.expires_at",
                    (worker, fresh, domain, json.dumps(keys), seconds),
                )
                return fresh

        self.fence = await self.run(renew, "lease")
        return self.fence

    async def lease_of(self, worker: str) -> LeaseHolder | None:
        async def select(connection: psycopg.AsyncConnection):
            cursor = await connection.execute(f"SELECT domain, keys, expires_at > clock_timestamp() FROM {LEASES_TABLE} WHERE worker = %s", (worker,))
            return await cursor.fetchone()

        row = await self.run(select)
        return None if row is None else LeaseHolder(worker, row[0], json.loads(row[1]), row[2])

    async def owned(self, worker: str) -> set[str]:
        async def select(connection: psycopg.AsyncConnection):
            cursor = await connection.execute(f"SELECT session_id FROM {SESSIONS_TABLE} WHERE instance = %s AND owner = %s", (self.instance, worker))
            return {row[0] for row in await cursor.fetchall()}

        return await self.run(select, "lease")

    async def release_lease(self, worker: str, incarnation: int) -> None:
        async def delete(connection: psycopg.AsyncConnection) -> None:
            await connection.execute(f"DELETE FROM {LEASES_TABLE} WHERE worker = %s AND incarnation = %s", (worker, incarnation))

        await self.run(delete, "lease")
        self.fence = None

    async def unused_since(self, used_before: float) -> list[StoredSession]:
        async def select(connection: psycopg.AsyncConnection):
            cursor = await connection.execute(
                f"SELECT session_id, owner, revision, state, expires_at FROM {SESSIONS_TABLE} WHERE instance = %s AND owner IS NOT NULL"
                " AND expires_at > %s AND expires_at < %s ORDER BY session_id",
                (self.instance, time.time(), used_before + SESSION_MAX_AGE_SECONDS),
            )
            return await cursor.fetchall()

        return [StoredSession(*row) for row in await self.run(select)]

    def export(self) -> list[StoredSession]:
        rows = self.db.execute(
            f"SELECT session_id, owner, revision, state, expires_at FROM {SESSIONS_TABLE} WHERE instance = %s AND expires_at > %s ORDER BY session_id",
            (self.instance, time.time()),
        ).fetchall()
        return [StoredSession(*row) for row in rows]

    def import_sessions(self, sessions: list[StoredSession]) -> None:
        with self.db.transaction():
            for session in sessions:
                try:
                    self.db.execute(
                        f"INSERT INTO {SESSIONS_TABLE} (instance, session_id, owner, revision, state, expires_at) VALUES (%s, %s, %s, %s, %s, %s)",
                        (self.instance, session.session_id, session.owner, session.revision, session.state, session.expires_at),
                    )
                except psycopg.errors.UniqueViolation:
                    raise SessionConflict(f"the store {self.location} already holds session {session.session_id}") from None

    def close(self) -> None:
        self.db.close()
        for _, (connection,) in self.channels.values():
            if connection is not None and not connection.closed:
                # Its event loop may be gone (a worker shutting down): the socket goes with the object.
                connection.pgconn.finish()
