"""The ``SessionStore`` protocol, kept by every kind of store (each test runs once per kind in ``KINDS``), and
the choice of a store by its location."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import multiprocessing
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nemo_gym.durable import store as store_module
from nemo_gym.durable.sqlite_store import SQLiteStore, store_path
from nemo_gym.durable.store import SessionConflict, SessionStore, StoredSession, StoreError, StoreUnavailable, open_store
from nemo_gym.sessions.cookie import SESSION_MAX_AGE_SECONDS
from tests.full_filesystem import CAN_MOUNT, full, mounted_tmpfs
from tests.postgres import Postgres, postgres_or_skip
from tests.unit_tests.durable.filling import commit_until_refused

INSTANCE = "counter"
ME, OTHER, DEAD = "a" * 16, "b" * 16, "0" * 16
RACERS = 8
ROWS = 20


class SQLiteKind:
    """SQLite: a file in the test's directory; one that cannot commit is on a small tmpfs filled up (root only)."""

    name = "sqlite"

    @contextlib.contextmanager
    def location(self, directory: Path) -> Iterator[str]:
        yield str(directory / f"{INSTANCE}.sqlite3")

    @contextlib.contextmanager
    def location_that_fails(self, directory: Path) -> Iterator[tuple[str, Callable[[], contextlib.AbstractContextManager]]]:
        """A store's location, and a context in which that store cannot commit."""
        if not CAN_MOUNT:
            pytest.skip("mounting a tmpfs needs root")
        with mounted_tmpfs(directory, "2m") as path:
            yield str(path / f"{INSTANCE}.sqlite3"), lambda: full(path)


class PostgreSQLKind:
    """PostgreSQL: a fresh database per location, on one real server for the module (started on first use,
    with a password); one that cannot commit is one whose server is stopped."""

    name = "postgresql"

    def __init__(self) -> None:
        self.server: Postgres | None = None

    def running(self) -> Postgres:
        if self.server is None:
            self.server = postgres_or_skip(password="store-test-password")
            self.server.start()
        return self.server

    @contextlib.contextmanager
    def location(self, directory: Path) -> Iterator[str]:
        server = self.running()
        database = f"store_{uuid.uuid4().hex[:12]}"
        server.psql(f"CREATE DATABASE {database}")
        yield server.dsn(database=database)

    @contextlib.contextmanager
    def location_that_fails(self, directory: Path) -> Iterator[tuple[str, Callable[[], contextlib.AbstractContextManager]]]:
        with self.location(directory) as location:
            yield location, self.stopped

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        self.server.stop()
        try:
            yield
        finally:
            self.server.start()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


# Every kind of store; a new kind is one more here.
KINDS = [SQLiteKind(), PostgreSQLKind()]


@pytest.fixture(scope="module", autouse=True)
def servers() -> Iterator[None]:
    """The module's one PostgreSQL server, stopped after its last test."""
    yield
    for each in KINDS:
        if isinstance(each, PostgreSQLKind):
            each.close()


@pytest.fixture(params=KINDS, ids=lambda kind: kind.name)
def kind(request):
    return request.param


@pytest.fixture
def location(kind, tmp_path: Path) -> Iterator[str]:
    with kind.location(tmp_path) as location:
        yield location


@pytest.fixture
def store(location: str) -> Iterator[SessionStore]:
    opened = open_store(location, INSTANCE)
    yield opened
    opened.close()


def row(session_id: str, owner: str | None = DEAD, revision: int = 3, state: str = "1", expires_at: float = 4e9) -> StoredSession:
    return StoredSession(session_id, owner, revision, state, expires_at)


def test_each_kind_has_every_method_of_the_protocol_with_its_parameters_awaitable_where_declared(kind, store):
    for name, declared in inspect.getmembers(SessionStore, inspect.isfunction):
        if name.startswith("_"):
            continue
        implemented = getattr(type(store), name)
        assert inspect.signature(implemented).parameters.keys() == inspect.signature(declared).parameters.keys(), name
        assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(declared), name
    assert inspect.signature(type(store).open).parameters.keys() == inspect.signature(SessionStore.open).parameters.keys()
    assert isinstance(store.location, str)


@pytest.mark.anyio
async def test_a_committed_state_reads_back_as_its_owners_and_each_commit_raises_its_revision(store):
    assert await store.commit(ME, {"s": "1"}) == set()
    first = await store.read("s")
    assert (first.owner, first.revision, first.state) == (ME, 1, "1") and first.expires_at > time.time()
    await store.commit(ME, {"s": "2"})
    assert ((await store.read("s")).revision, (await store.read("s")).state) == (2, "2")
    assert await store.read("never") is None


@pytest.mark.anyio
async def test_a_commit_leaves_a_session_another_worker_owns_as_it_was_and_names_it_and_writes_the_rest(store):
    await store.commit(OTHER, {"theirs": "9"})
    assert await store.commit(ME, {"theirs": "1", "mine": "2"}) == {"theirs"}
    assert ((await store.read("theirs")).owner, (await store.read("theirs")).state) == (OTHER, "9")
    assert (await store.read("mine")).state == "2"


# Rows as a server's JSON and the requests remembered with it make them: quotes, backslashes, braces, commas,
# NULL spelled out, text beyond ASCII; the PostgreSQL store sends them as binary arrays.
AWKWARD_STATES = ['{"a": "b\\"c"}', "\\", '"', "{}", "{,}", "NULL", "", " x ", "ünï\u2028cødé", '[["id", 200, [], "e30="]]']


@pytest.mark.anyio
async def test_a_group_of_rows_of_any_text_reads_back_as_written_beside_a_delete(store):
    await store.commit(ME, {"gone": "1"})
    states = {f"s{index}": state for index, state in enumerate(AWKWARD_STATES)}
    assert await store.commit(ME, {**states, "gone": None}) == set()
    assert {session_id: (await store.read(session_id)).state for session_id in states} == states
    assert await store.read("gone") is None


@pytest.mark.anyio
async def test_a_commit_of_no_state_deletes_the_row(store):
    await store.commit(ME, {"s": "1", "t": "1"})
    await store.commit(ME, {"s": None})
    assert await store.read("s") is None and await store.read("t") is not None


@pytest.mark.anyio
async def test_rows_outlive_the_connection_that_wrote_them(location):
    first = open_store(location, INSTANCE)
    await first.commit(ME, {"s": "1"})
    first.close()
    again = open_store(location, INSTANCE)
    try:
        assert (await again.read("s")).state == "1"
    finally:
        again.close()


@pytest.mark.anyio
async def test_a_claim_on_a_row_that_changed_since_it_was_read_fails(store):
    await store.commit(DEAD, {"s": "1"})
    seen = await store.read("s")
    await store.commit(DEAD, {"s": "2"})
    assert not await store.claim(seen, OTHER)
    assert await store.claim(await store.read("s"), OTHER)
    claimed = await store.read("s")
    assert (claimed.owner, claimed.revision, claimed.state) == (OTHER, 3, "2")


def claim_rows(location: str, me: str, start: multiprocessing.Barrier, results: multiprocessing.Queue) -> None:
    asyncio.run(claim_rows_together(open_store(location, INSTANCE), me, start, results))


async def claim_rows_together(store: SessionStore, me: str, start: multiprocessing.Barrier, results: multiprocessing.Queue) -> None:
    rows = [await store.read(f"s{number}") for number in range(ROWS)]
    start.wait()
    results.put([me if await store.claim(row, me) else None for row in rows])


@pytest.mark.anyio
async def test_of_workers_racing_to_adopt_a_session_exactly_one_wins(store, location):
    await store.commit(DEAD, {f"s{number}": "0" for number in range(ROWS)})
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(RACERS), context.Queue()
    racers = [context.Process(target=claim_rows, args=(location, f"{n:016x}", start, results)) for n in range(1, RACERS + 1)]
    for racer in racers:
        racer.start()
    claims = [results.get(timeout=60) for _ in racers]
    for racer in racers:
        racer.join(timeout=30)
    for number in range(ROWS):
        winners = [claimed[number] for claimed in claims if claimed[number] is not None]
        assert len(winners) == 1, (number, winners)
        claimed = await store.read(f"s{number}")
        assert (claimed.owner, claimed.revision) == (winners[0], 2)


def test_rows_imported_into_a_fresh_store_are_exported_as_they_were(kind, store, tmp_path: Path):
    rows = [row("b", owner=None, revision=7, state='{"n": 2}', expires_at=4.5e9), row("a", owner=ME, revision=1)]
    store.import_sessions(rows)
    assert store.export() == sorted(rows, key=lambda stored: stored.session_id)
    (tmp_path / "fresh").mkdir()
    with kind.location(tmp_path / "fresh") as fresh_location:
        fresh = open_store(fresh_location, INSTANCE)
        try:
            fresh.import_sessions(store.export())
            assert fresh.export() == store.export()
        finally:
            fresh.close()


def test_an_import_that_meets_a_session_already_held_imports_none(store):
    store.import_sessions([row("s", state="kept")])
    with pytest.raises(SessionConflict):
        store.import_sessions([row("new"), row("s", state="other")])
    assert store.export() == [row("s", state="kept")]


@pytest.mark.anyio
async def test_an_expired_row_is_neither_read_nor_exported(store):
    store.import_sessions([row("old", expires_at=time.time() - 60), row("live")])
    assert await store.read("old") is None
    assert [stored.session_id for stored in store.export()] == ["live"]


@pytest.mark.anyio
async def test_the_rows_last_used_before_a_time_are_the_live_owned_ones_written_before_it(store):
    # A row's last use is its last write: its expiry less the cookie's max age.
    now = time.time()
    used = {"long_ago": now - 3600, "just_now": now - 5, "expired": now - 2 * SESSION_MAX_AGE_SECONDS}
    store.import_sessions([row(name, expires_at=at + SESSION_MAX_AGE_SECONDS) for name, at in used.items()])
    store.import_sessions([row("restored", owner=None, expires_at=now - 3600 + SESSION_MAX_AGE_SECONDS)])
    assert [stored.session_id for stored in await store.unused_since(now - 60)] == ["long_ago"]
    assert sorted(stored.session_id for stored in await store.unused_since(now)) == ["just_now", "long_ago"]


@pytest.mark.anyio
async def test_a_write_or_claim_that_cannot_commit_raises_store_unavailable_writes_nothing_and_the_store_commits_again_after(kind, tmp_path: Path):
    with kind.location_that_fails(tmp_path) as (location, cannot_commit):
        store = open_store(location, INSTANCE)
        try:
            await store.commit(ME, {"kept": "1"})
            await store.commit(DEAD, {"orphan": "7"})
            orphan = await store.read("orphan")
            with cannot_commit():
                await commit_until_refused(store)
                with pytest.raises(StoreUnavailable):
                    await store.commit(ME, {"kept": "2"})
                with pytest.raises(StoreUnavailable):
                    await store.claim(orphan, ME)
            assert (await store.read("kept")).state == "1" and (await store.read("orphan")).owner == DEAD
            await store.commit(ME, {"kept": "3"})
            assert (await store.read("kept")).state == "3"
            assert await store.claim(await store.read("orphan"), ME)
        finally:
            store.close()


def test_a_store_opened_only_if_it_exists_is_refused_where_there_is_none(kind, tmp_path: Path):
    with kind.location(tmp_path) as location:
        with pytest.raises(StoreError, match="has no session store"):
            open_store(location, INSTANCE, create=False)


def test_no_location_is_the_instances_sqlite_file_under_the_state_directory(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("NEMO_GYM_STATE_DIR", str(tmp_path))
    store = open_store(None, INSTANCE)
    try:
        assert isinstance(store, SQLiteStore) and store.path == store_path(INSTANCE) == tmp_path / "sessions" / f"{INSTANCE}.sqlite3"
    finally:
        store.close()


@pytest.mark.parametrize("prefix", ["", "sqlite://"], ids=["a path", "sqlite://"])
def test_a_path_is_an_sqlite_file_there(tmp_path: Path, prefix: str):
    store = open_store(f"{prefix}{tmp_path / 'elsewhere.sqlite3'}", INSTANCE)
    try:
        assert isinstance(store, SQLiteStore) and store.path == tmp_path / "elsewhere.sqlite3" and store.path.exists()
    finally:
        store.close()


def test_a_location_of_a_kind_there_is_none_of_is_refused_naming_the_kinds():
    with pytest.raises(StoreError) as error:
        open_store("mongodb://user:password@host/db", INSTANCE)
    message = str(error.value)
    assert "'mongodb'" in message and ", ".join(sorted(store_module.STORES)) in message
    assert "password" not in message
