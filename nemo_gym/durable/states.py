"""How a server declares the per-session state it keeps durable.

A server returns it from ``session_states()``: either a ``SessionStates`` (a dict of session id to a
value of one pydantic-validated type, a model or plain data), or any object with the four methods of
``DurableState``, for state that is not plain data (a sandbox's path and its task, say).
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from pydantic import TypeAdapter

T = TypeVar("T")


class DurableState(Protocol):
    def export(self, session_id: str) -> str | None:
        """The session's state as JSON text, or None when this worker keeps none for it."""

    def restore(self, session_id: str, data: str) -> None:
        """Hold the session again, from what ``export`` gave (on another worker, or after a restart)."""

    def end(self, session_id: str) -> None:
        """Drop the session's state: the session is over (what the state stands for outside memory goes too)."""

    def forget(self, session_id: str) -> None:
        """Drop the session from this worker's memory only: another worker holds it now, or this worker reads
        it from the store again when it is next asked for. What the state stands for outside memory (a
        sandbox on disk) stays, for whichever worker holds the session."""


class SessionStates(dict[str, T], Generic[T]):
    """Per-session state in memory, as a plain dict the handlers use, each value validated by ``kind``.

    ``SessionStates(int)`` for a count; ``SessionStates(MyModel)`` for a pydantic model, which the
    handlers may change in place: what is written is the value as it is after the request.
    """

    def __init__(self, kind: type[T]) -> None:
        super().__init__()
        self.adapter = TypeAdapter(kind)

    def export(self, session_id: str) -> str | None:
        if session_id not in self:
            return None
        return self.adapter.dump_json(self[session_id]).decode()

    def restore(self, session_id: str, data: str) -> None:
        self[session_id] = self.adapter.validate_json(data)

    def end(self, session_id: str) -> None:
        self.pop(session_id, None)

    def forget(self, session_id: str) -> None:
        self.pop(session_id, None)
