"""One worker's durable sessions: its state written through to the store, and dead owners' taken over."""

from __future__ import annotations

import asyncio
import time

from nemo_gym.durable.states import DurableState
from nemo_gym.durable.store import SessionStore, SessionTaken, StoredSession
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
    """

    def __init__(self, store: SessionStore, states: DurableState, owner: str | None) -> None:
        self.store = store
        self.states = states
        self.owner = owner
        self.written: dict[str, str] = {}
        self.pending: dict[str, tuple[str | None, asyncio.Future[set[str]]]] = {}
        self.gathering: dict[str, str | None] = {}
        self.gathered: asyncio.Future[set[str]] | None = None
        self.committer: asyncio.Task | None = None

    def holds(self, session_id: str) -> bool:
        """Whether the store has this worker as the session's owner."""
        return session_id in self.written

    async def save(self, session_ids: list[str]) -> None:
        """Write the states that changed (a state the server dropped deletes the row); returns once they,
        and any earlier write of the same state, are committed. Raises ``SessionTaken`` for a session
        another worker owns in the store, ``StoreUnavailable`` if the write could not commit (the
        sessions are then as the store holds them)."""
        waits = set()
        for session_id in session_ids:
            state = self.states.export(session_id)
            pending = self.pending.get(session_id)
            if pending is not None and pending[0] == state:
                waits.add(pending[1])
            elif pending is not None or state != self.written.get(session_id):
                waits.add(self.gather(session_id, state))
        for group in waits:
            taken = await asyncio.shield(group)
            if taken & set(session_ids):
                raise SessionTaken(f"a session of {sorted(session_ids)} belongs to another worker in the store {self.store.location}")

    def gather(self, session_id: str, state: str | None) -> asyncio.Future[set[str]]:
        if self.gathered is None:
            self.gathered = asyncio.get_running_loop().create_future()
        if self.committer is None:
            self.committer = asyncio.create_task(self.commit_groups())
        self.gathering[session_id] = state
        self.pending[session_id] = (state, self.gathered)
        return self.gathered

    async def commit_groups(self) -> None:
        """Commit the gathered group, then the one gathered meanwhile, until none is left."""
        try:
            while self.gathering:
                group, outcome = self.gathering, self.gathered
                self.gathering, self.gathered = {}, None
                started = time.perf_counter()
                try:
                    taken = await self.store.commit(self.owner, group)
                except Exception as error:
                    self.roll_back(group, outcome)
                    outcome.set_exception(error)
                    continue
                finally:
                    METERS.store_commit_seconds.observe(time.perf_counter() - started)
                outcome.set_result(taken)
                for session_id, state in group.items():
                    if self.pending.get(session_id, (None, None))[1] is outcome:
                        del self.pending[session_id]
                    if state is None or session_id in taken:
                        self.written.pop(session_id, None)
                    else:
                        self.written[session_id] = state
        finally:
            self.committer = None

    def roll_back(self, group: dict[str, str | None], outcome: asyncio.Future[set[str]]) -> None:
        """A group failed to commit: its sessions go back to what the store holds, unless a later state waits."""
        for session_id in group:
            if self.pending.get(session_id, (None, None))[1] is not outcome:
                continue
            del self.pending[session_id]
            stored = self.written.get(session_id)
            if stored is None:
                self.states.end(session_id)
            else:
                self.states.restore(session_id, stored)

    def end(self, session_id: str) -> None:
        """The session is over: its state goes from memory, and from the store with the request's ``save``."""
        self.states.end(session_id)

    async def take_up(self, session_id: str) -> None:
        """A session this worker does not hold: if the store has it owned by no worker (restored by
        ``gym sessions restore``), claim it and hold it. Called only on that miss, so a held session's
        requests read nothing. Raises ``ValueError`` if its stored state does not load here (again on
        each request: a claimed row this worker could not load is tried again, never a 404)."""
        while not self.holds(session_id) and (stored := await self.store.read(session_id)) is not None and stored.owner in (None, self.owner):
            await self.adopt(stored)

    async def adopt(self, session: StoredSession) -> bool:
        """Take over a dead owner's session as read from the store; False if another worker took it first.
        A session taken over is this worker's live session now (``nemo_gym.metrics``)."""
        if not await self.store.claim(session, self.owner):
            return False
        self.states.restore(session.session_id, session.state)
        self.written[session.session_id] = session.state
        METERS.sessions_adopted.inc()
        METERS.live_sessions.inc()
        return True
