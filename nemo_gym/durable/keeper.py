"""One worker's durable sessions: its state written through to the store (taking sessions over is ``adoption``'s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from nemo_gym.durable.applied import WINDOW, Applied, state_of, unwrap, wrap
from nemo_gym.durable.lease import LeaseHolder, LeaseStore, LeaseTerms, OwnerLease
from nemo_gym.durable.states import DurableState
from nemo_gym.durable.store import SessionStore, SessionTaken, StoredSession, StoreUnavailable
from nemo_gym.durable.tombstones import ended_detail, tombstone
from nemo_gym.metrics.meters import METERS


class DurableSessions:
    """Keeps the store in step with a server's in-memory state, for the sessions this worker owns.

    ``written`` is what the store holds for each of them, so a request that changed nothing writes nothing.
    Writes are group-committed: the states of every request that finishes while the store is busy (or in
    the same turn of the event loop) go in one transaction, and each request returns once it is committed.
    ``pending`` is each session's state handed to a group not yet committed, with that group's outcome.

    A group that cannot commit (``StoreUnavailable``: the disk is full, say) leaves the store as it was,
    and each of its sessions goes back, in memory, to the state the store holds (or out of memory, if
    the store holds none): memory and store never disagree, and the requests waiting on it raise. A
    session whose later state waits in the next group is left to that group (its requests overlapped).

    With a store shared across hosts, ``lease`` is the worker's owner lease (``durable.lease``). When it
    lapses, ``epoch`` goes up and every session held is dropped from memory; a group gathered in an
    earlier epoch is refused unwritten (its sessions count as taken).

    A row holds, with the state, the requests that changed it last (``applied``): ``applied`` here is each
    held session's window as of its latest gathered row, ``reply`` finds a request in it.

    A row's write time is its session's last use (its ``expires_at`` is that plus the cookie's max age): a
    request that changes nothing writes the same state again once ``refresh_seconds`` have passed since
    the last write (None: never), so a worker that adopts the session, or sweeps a dead worker's, sees
    when it was last used to within that. An ended session's row becomes a tombstone (``tombstones``),
    and ``on_taken`` is told of each session another worker turned out to own at a commit.
    """

    def __init__(
        self, store: SessionStore, states: DurableState, owner: str | None, refresh_seconds: float | None = None, lease: LeaseTerms | None = None
    ) -> None:
        """``lease``: the terms of this worker's owner lease, taken where the store keeps leases (a store shared across hosts)."""
        self.store = store
        self.states = states
        self.owner = owner
        self.lease = None if lease is None or not isinstance(store, LeaseStore) else OwnerLease(store, owner, lease.domain, lease.keys, lease.seconds, self.lapse)
        self.epoch = 0
        self.gathered_epoch = 0
        self.refresh_seconds = refresh_seconds
        self.on_taken: Callable[[str], None] | None = None
        # What the store holds of each held session: its row's text (state and applied requests).
        self.written: dict[str, str] = {}
        # The requests each held session remembers (``durable.applied``), with its latest gathered row.
        self.applied: dict[str, list[Applied]] = {}
        # When each held row was last written (time.monotonic()).
        self.written_at: dict[str, float] = {}
        # The tombstones of sessions ended here and not yet committed.
        self.ending: dict[str, str] = {}
        # The sessions ending with the request being served (``end_with_request``): whether their tombstone is committed.
        self.ending_with_request: dict[str, bool] = {}
        self.pending: dict[str, tuple[str | None, asyncio.Future[set[str]]]] = {}
        self.gathering: dict[str, str | None] = {}
        self.gathered: asyncio.Future[set[str]] | None = None
        self.committer: asyncio.Task | None = None

    def holds(self, session_id: str) -> bool:
        """Whether the store has this worker as the session's owner."""
        return session_id in self.written

    async def save(self, session_ids: list[str], applied: Applied | None = None) -> None:
        """Write the states that changed (a state the server dropped deletes the row); returns once they,
        and any earlier write of the same state, are committed. ``applied``: the request that made the
        change, remembered with the state of each session it changed. Raises ``SessionTaken`` for a
        session another worker owns in the store, ``StoreUnavailable`` if the write could not commit (the
        sessions are then as the store holds them)."""
        waits = set()
        for session_id in session_ids:
            content = self.content(session_id)  # exported once per save
            state = None if content is None else wrap(content, self.applied.get(session_id, []))
            pending = self.pending.get(session_id)
            if applied is not None and content is not None:
                if state != (pending[0] if pending is not None else self.written.get(session_id)):
                    self.applied[session_id] = [*self.applied.get(session_id, ()), applied][-WINDOW:]
                    state = wrap(content, self.applied[session_id])
            if pending is not None and pending[0] == state:
                waits.add(pending[1])
            elif pending is not None or state != self.written.get(session_id) or self.stale(session_id, state):
                waits.add(self.gather(session_id, state))
        for group in waits:
            taken = await asyncio.shield(group)
            if taken & set(session_ids):
                raise SessionTaken(f"a session of {sorted(session_ids)} belongs to another worker in the store {self.store.location}")

    def content(self, session_id: str) -> str | None:
        """What the session's row should hold now but the requests it remembers: its tombstone, or its state."""
        return self.ending.get(session_id) or self.states.export(session_id)

    def row(self, session_id: str) -> str | None:
        """What the session's row should hold now: its tombstone or its state, with the requests it remembers."""
        content = self.content(session_id)
        return None if content is None else wrap(content, self.applied.get(session_id, []))

    def stored_states(self) -> list[str]:
        """The state of every live row of the store, as the servers' ``export`` wrote it (without the requests
        its row remembers): what a server reads to know what the store still names."""
        return [state_of(stored.state) for stored in self.store.export()]

    def reply(self, session_id: str, request_id: str) -> Applied | None:
        """The reply of the request ``request_id`` if it changed this held session already."""
        for applied in self.applied.get(session_id, ()):
            if applied.request_id == request_id:
                return applied
        return None

    def hold(self, session_id: str, row: str | None) -> None:
        """Hold the session, in memory, as ``row`` has it (None: not at all)."""
        if row is None:
            self.states.end(session_id)
            self.applied.pop(session_id, None)
            return
        state, self.applied[session_id] = unwrap(row)
        self.states.restore(session_id, state)

    def stale(self, session_id: str, state: str | None) -> bool:
        """A held row whose last write is older than ``refresh_seconds``: it is written again, as a use."""
        if state is None or self.refresh_seconds is None:
            return False
        return time.monotonic() - self.written_at.get(session_id, 0.0) >= self.refresh_seconds

    def gather(self, session_id: str, state: str | None) -> asyncio.Future[set[str]]:
        if self.gathered is None:
            self.gathered = asyncio.get_running_loop().create_future()
            self.gathered_epoch = self.epoch
        if self.committer is None:
            self.committer = asyncio.create_task(self.commit_groups())
        self.gathering[session_id] = state
        self.pending[session_id] = (state, self.gathered)
        return self.gathered

    async def commit_groups(self) -> None:
        """Commit the gathered group, then the one gathered meanwhile, until none is left."""
        try:
            while self.gathering:
                group, outcome, epoch = self.gathering, self.gathered, self.gathered_epoch
                self.gathering, self.gathered = {}, None
                started = time.perf_counter()
                try:
                    # Gathered before the lease lapsed: what it holds may be stale, so none of it is written.
                    taken = set(group) if epoch != self.epoch else await self.store.commit(self.owner, group)
                except Exception as error:
                    self.roll_back(group, outcome)
                    outcome.set_exception(error)
                    continue
                finally:
                    METERS.store_commit_seconds.observe(time.perf_counter() - started)
                outcome.set_result(taken)
                written_at = time.monotonic()
                for session_id, state in group.items():
                    if self.pending.get(session_id, (None, None))[1] is outcome:
                        del self.pending[session_id]
                    # This worker's tombstone of a session it ended: known as one without reading it again.
                    ended = session_id in self.ending and self.row(session_id) == state
                    if ended and session_id in self.ending_with_request:
                        self.ending_with_request[session_id] = True  # its state is held until ``end``: any save meanwhile writes the tombstone
                    elif ended:
                        del self.ending[session_id]
                        self.applied.pop(session_id, None)
                    # A tombstone is the store's, no longer this worker's to hold.
                    if state is None or session_id in taken or ended or ended_detail(state) is not None:
                        self.written.pop(session_id, None)
                        self.written_at.pop(session_id, None)
                    else:
                        self.written[session_id] = state
                        self.written_at[session_id] = written_at
                    if session_id in taken and self.on_taken is not None:
                        self.on_taken(session_id)
        finally:
            self.committer = None

    def roll_back(self, group: dict[str, str | None], outcome: asyncio.Future[set[str]]) -> None:
        """A group failed to commit: its sessions go back to what the store holds, unless a later state waits."""
        for session_id in group:
            if self.pending.get(session_id, (None, None))[1] is not outcome:
                continue
            del self.pending[session_id]
            if session_id in self.ending and self.row(session_id) == group[session_id]:
                continue  # an end's tombstone: the state is gone already, the tombstone is written with the next save
            self.hold(session_id, self.written.get(session_id))

    def end(self, session_id: str, detail: str | None = None) -> None:
        """The session is over: its state goes from memory, and from the store with the next ``save`` of it, which
        leaves a tombstone with ``detail`` in its row (None: only this worker's copy goes, ``drop``; the row is left)."""
        committed = self.ending_with_request.pop(session_id, False)
        if detail is None:
            self.drop(session_id)
            return
        self.states.end(session_id)
        if committed:
            self.ending.pop(session_id, None)
            self.applied.pop(session_id, None)
        else:
            self.ending[session_id] = tombstone(detail)  # its row remembers the requests it did, and the one that ended it

    def end_with_request(self, session_id: str, detail: str) -> None:
        """The session ends with the request being served (a verify): from now on its row is to hold a tombstone
        with ``detail``, committed with that request's reply. Its state stays in memory until ``end`` (once
        the commit is done, or may be); ``resume`` takes the end back if the request is refused."""
        self.ending[session_id] = tombstone(detail)
        self.ending_with_request[session_id] = False

    def resume(self, session_id: str) -> None:
        """The request that was ending the session is refused unwritten: the session goes on, as the store holds it."""
        if self.ending_with_request.pop(session_id, None) is not None:
            self.ending.pop(session_id, None)
        self.hold(session_id, self.written.get(session_id))

    def drop(self, session_id: str) -> None:
        """Another worker owns the session in the store now (or may: a lapse that could not ask): this worker's copy
        of it goes from memory, and what it stands for outside memory (a sandbox) is left to that worker."""
        self.states.forget(session_id)
        self.applied.pop(session_id, None)
        self.written.pop(session_id, None)
        self.written_at.pop(session_id, None)

    async def lapse(self) -> None:
        """The lease lapsed (``durable.lease``, rule 2): requests and groups under way are refused (a new
        epoch); the sessions whose rows no longer name this worker are dropped (all, if the store cannot say)."""
        self.epoch += 1
        try:
            mine = await self.store.owned(self.owner)
        except StoreUnavailable:
            mine = set()
        for session_id in {*self.written, *self.pending} - mine:
            self.drop(session_id)

    def revert(self, session_ids: list[str]) -> None:
        """A request refused unwritten: its sessions go back, in memory, to what the store holds."""
        for session_id in session_ids:
            self.hold(session_id, self.written.get(session_id))

    async def ensure_lease(self) -> None:
        """Return once this worker may serve the sessions it holds; raises ``StoreUnavailable``."""
        if self.lease is not None:
            await self.lease.ensure()

    async def holder(self, worker: str) -> LeaseHolder | None:
        """``worker``'s lease in the store (a store with leases only)."""
        assert isinstance(self.store, LeaseStore)
        return await self.store.lease_of(worker)

    async def owner_expired(self, worker: str) -> bool:
        """Whether ``worker``'s lease has expired (a store down, or a worker with no lease: not known to have)."""
        try:
            holder = await self.holder(worker)
        except StoreUnavailable:
            return False
        return holder is not None and not holder.live

    def held_as_stored(self, stored: StoredSession) -> None:
        """Hold a session this worker has just claimed in the store (``durable.adoption``), as its row has it."""
        self.hold(stored.session_id, stored.state)
        self.written[stored.session_id] = stored.state
        self.written_at[stored.session_id] = time.monotonic()
