"""Names every part of a session's life shares are defined once, in ``nemo_gym.sessions``."""

from __future__ import annotations

import ast
from pathlib import Path

import nemo_gym

NEMO_GYM = Path(nemo_gym.__file__).parent


def where_assigned(name: str) -> list[Path]:
    return [
        path.relative_to(NEMO_GYM)
        for path in sorted(NEMO_GYM.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and target.id == name for target in node.targets)
    ]


def test_the_cookies_age_is_defined_once_in_sessions():
    assert where_assigned("SESSION_MAX_AGE_SECONDS") == [Path("sessions/cookie.py")]


def test_the_owner_key_and_worker_ids_are_defined_once_in_sessions():
    assert where_assigned("OWNER_KEY") == [Path("sessions/worker.py")]
    assert where_assigned("WORKER_ID_PATTERN") == [Path("sessions/worker.py")]


def test_retry_after_seconds_is_defined_once_in_sessions():
    assert where_assigned("RETRY_AFTER_SECONDS") == [Path("sessions/replies.py")]


def test_only_the_replies_module_writes_a_retry_after_header():
    """A reply that asks the caller to come back is built by ``sessions.replies`` only (a client reads the header)."""
    writers = {
        path.relative_to(NEMO_GYM)
        for path in NEMO_GYM.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() == "retry-after"
    }
    assert writers - {Path("client/retries.py")} == {Path("sessions/replies.py")}
