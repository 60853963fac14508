"""The file that carries every durable session of an instance from one server to a fresh one.

One JSON document: a format tag, the instance, how many sessions, a SHA-256 of them, and the sessions.
A file that is cut short, altered, of another instance, or with any session that is not a row a store
can hold (each field checked, no id twice) is refused whole, with the reason and the row. Sessions
already expired are skipped and counted. Ended sessions' tombstones (``tombstones``) are not exported;
a restore brings an ended session back, its tombstone replaced by the restored row. A restored row belongs to no worker: the first request for
it, on whichever live worker it reaches, takes it up (``keeper``), so a running server uses it at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from nemo_gym.durable.store import SessionStore, StoredSession
from nemo_gym.durable.tombstones import ended_detail
from nemo_gym.sessions.worker import is_worker_id

FORMAT = "nemo_gym.sessions/1"
# SQLite's largest integer: a revision above it cannot be stored.
MAX_REVISION = 2**63 - 1


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

    @field_validator("revision")
    @classmethod
    def revision_fits_the_store(cls, revision: int) -> int:
        if revision < 0:
            raise ValueError("must be at least 0")
        if revision > MAX_REVISION:
            raise ValueError(f"must be at most {MAX_REVISION}")
        return revision

    @field_validator("state")
    @classmethod
    def state_is_json(cls, state: str) -> str:
        try:
            json.loads(state)
        except ValueError:
            raise ValueError("not JSON text") from None
        return state

    @field_validator("expires_at")
    @classmethod
    def expires_at_is_finite(cls, expires_at: float) -> float:
        if not math.isfinite(expires_at):
            raise ValueError("must be a finite number")
        return expires_at


class Restored(NamedTuple):
    restored: int
    expired: int


def digest(sessions: list[dict]) -> str:
    return hashlib.sha256(json.dumps(sessions, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def export_sessions(store: SessionStore, instance_name: str, path: Path) -> int:
    """Write every live session of the store to ``path`` (whole or not at all); returns how many."""
    return write_sessions([asdict(session) for session in store.export() if ended_detail(session.state) is None], instance_name, path)


def write_sessions(sessions: list[dict], instance_name: str, path: Path) -> int:
    """Write the sessions (rows as dicts) to ``path``, whole or not at all; returns how many."""
    document = {"format": FORMAT, "instance": instance_name, "count": len(sessions), "sha256": digest(sessions), "sessions": sessions}
    # A new file of this process's own (0600, never through a link planted beside the target), then renamed.
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(json.dumps(document))
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise
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
    rows: list[StoredSession] = []
    numbers: dict[str, int] = {}
    for number, session in enumerate(sessions):
        name = f"session {number} ({session.get('session_id') if isinstance(session, dict) else None!r})"
        try:
            row = StoredSession(**SessionRow.model_validate(session).model_dump())
        except ValidationError as error:
            raise TransferError(f"{path}: {name} is malformed: {reasons(error)}; nothing restored") from None
        if row.session_id in numbers:
            raise TransferError(f"{path}: {name} has the same id as session {numbers[row.session_id]}; nothing restored")
        numbers[row.session_id] = number
        rows.append(row)
    return rows


def reasons(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the row'}: {e['msg'].removeprefix('Value error, ')}" for e in error.errors())


def restore_sessions(store: SessionStore, instance_name: str, path: Path) -> Restored:
    """Load every session of the file that has not expired into the store, owned by no worker, or none."""
    sessions = read_sessions(path, instance_name)
    now = time.time()
    live = [replace(session, owner=None) for session in sessions if session.expires_at > now]
    restored = {session.session_id for session in live}
    ended: dict[str | None, dict[str, None]] = {}
    for row in store.export():
        if row.session_id in restored and ended_detail(row.state) is not None:
            ended.setdefault(row.owner, {})[row.session_id] = None
    for owner, tombstones in ended.items():  # each deleted as its owner, as any row is
        asyncio.run(store.commit(owner, tombstones))
    try:
        store.import_sessions(live)
    except ValueError as error:
        raise TransferError(f"nothing restored: {error}") from None
    return Restored(len(live), len(sessions) - len(live))
