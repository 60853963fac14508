"""The file that carries every durable session of an instance from one server to a fresh one.

One JSON document: a format tag, the instance, how many sessions, a SHA-256 of them, and the sessions.
A file that is cut short, altered, or of another instance is refused whole, with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from nemo_gym.durable.store import SessionStore, StoredSession
from nemo_gym.routing.worker import is_worker_id

FORMAT = "nemo_gym.sessions/1"


class TransferError(ValueError):
    """The file cannot be restored; nothing was."""


class SessionRow(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    session_id: str
    owner: str | None
    revision: int
    state: str
    expires_at: float

    @field_validator("owner")
    @classmethod
    def owner_is_a_worker_id(cls, owner: str | None) -> str | None:
        if owner is not None and not is_worker_id(owner):
            raise ValueError("not a worker ID")
        return owner

    @field_validator("state")
    @classmethod
    def state_is_json(cls, state: str) -> str:
        json.loads(state)
        return state


def digest(sessions: list[dict]) -> str:
    return hashlib.sha256(json.dumps(sessions, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def export_sessions(store: SessionStore, instance_name: str, path: Path) -> int:
    """Write every live session of the store to ``path`` (whole or not at all); returns how many."""
    sessions = [asdict(session) for session in store.all()]
    document = {"format": FORMAT, "instance": instance_name, "count": len(sessions), "sha256": digest(sessions), "sessions": sessions}
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document))
    os.replace(partial, path)
    return len(sessions)


def read_sessions(path: Path, instance_name: str) -> list[StoredSession]:
    """The sessions a file holds for ``instance_name``; raises ``TransferError`` saying what is wrong."""
    try:
        document = json.loads(path.read_text())
    except OSError as error:
        raise TransferError(f"cannot read {path}: {error.strerror}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise TransferError(f"{path} is not a whole sessions file (cut short or corrupt): {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TransferError(f"{path} is not a sessions file: its format is not {FORMAT!r}")
    if document.get("instance") != instance_name:
        raise TransferError(f"{path} holds the sessions of instance {document.get('instance')!r}, not {instance_name!r}: their cookies would not be read here")
    sessions = document.get("sessions")
    if not isinstance(sessions, list) or document.get("count") != len(sessions):
        raise TransferError(f"{path} is partial: it says it holds {document.get('count')} sessions and holds {len(sessions) if isinstance(sessions, list) else 'no list of'} sessions")
    if document.get("sha256") != digest(sessions):
        raise TransferError(f"{path} is corrupt: its sessions do not match their SHA-256")
    rows = []
    for number, session in enumerate(sessions):
        try:
            rows.append(StoredSession(**SessionRow.model_validate(session).model_dump()))
        except ValidationError as error:
            raise TransferError(f"{path}: session {number} is malformed: {error}") from None
    return rows


def restore_sessions(store: SessionStore, instance_name: str, path: Path) -> int:
    """Load every session of the file into the store, or none; returns how many."""
    sessions = read_sessions(path, instance_name)
    try:
        store.insert_all(sessions)
    except ValueError as error:
        raise TransferError(f"nothing restored: {error}") from None
    return len(sessions)
