"""One worker's durable sessions: its state written through to the store, and dead owners' taken over."""

from __future__ import annotations

from nemo_gym.durable.states import DurableState
from nemo_gym.durable.store import SessionStore, StoredSession


class DurableSessions:
    """Keeps the store in step with a server's in-memory state, for the sessions this worker owns.

    ``written`` is what the store holds for each of them, so a request that changed nothing writes nothing.
    """

    def __init__(self, store: SessionStore, states: DurableState, owner: str | None) -> None:
        self.store = store
        self.states = states
        self.owner = owner
        self.written: dict[str, str] = {}

    def holds(self, session_id: str) -> bool:
        """Whether the store has this worker as the session's owner."""
        return session_id in self.written

    def save(self, session_id: str) -> None:
        """Write the session's state if it changed; a state the server dropped deletes the row."""
        state = self.states.export(session_id)
        if state == self.written.get(session_id):
            return
        if state is None:
            self.store.delete(session_id)
            del self.written[session_id]
            return
        self.store.write(session_id, self.owner, state)
        self.written[session_id] = state

    def end(self, session_id: str) -> None:
        """The session is over: its state goes from memory and from the store."""
        self.states.end(session_id)
        self.store.delete(session_id)
        self.written.pop(session_id, None)

    def adopt(self, session: StoredSession) -> bool:
        """Take over a dead owner's session as read from the store; False if another worker took it first."""
        if not self.store.claim(session, self.owner):
            return False
        self.states.restore(session.session_id, session.state)
        self.written[session.session_id] = session.state
        return True
