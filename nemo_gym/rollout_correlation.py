"""Which rollout a request belongs to: upstream's rollout id, from a ``/run`` row or an ``/ng-rollout/<id>/`` path prefix.

``RolloutContextMiddleware`` takes the prefix off the path and makes the id ``current_rollout_id()``
for the rest of the request, so code that calls other servers can put the same prefix on its calls.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Optional

from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.config_types import ROLLOUT_PATH_PREFIX, TOKEN_CAPTURE_PATH_SEGMENT
from nemo_gym.global_config import ATTEMPT_INDEX_KEY_NAME, ROLLOUT_ID_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

_ROLLOUT_ID: ContextVar[Optional[str]] = ContextVar("nemo_gym_rollout_id", default=None)

# An id is one path segment, and a file name in capture stores: no slash, no leading dot.
ROLLOUT_ID_CHARS = r"[A-Za-z0-9][A-Za-z0-9._-]*"
ROLLOUT_ID_PATTERN = re.compile(rf"^{ROLLOUT_ID_CHARS}$")
PREFIXED_PATH = re.compile(rf"^/{re.escape(ROLLOUT_PATH_PREFIX)}/(?P<rollout_id>{ROLLOUT_ID_CHARS})(?P<rest>/.*)$")
CAPTURE_SEGMENT = f"/{TOKEN_CAPTURE_PATH_SEGMENT}"


def maybe_rollout_id_from_run_body(body: BaseModel | Mapping[str, Any] | None) -> Optional[str]:
    """A ``/run`` row's rollout id: its ``_ng_rollout_id``, else ``<task index>-<rollout index>``; a
    re-dispatch (``_ng_attempt_index`` > 0) adds ``-a<attempt>``. None for a row with neither.

    A given ``_ng_rollout_id`` that is not one path segment is a ``ValueError``, not rewritten: a
    rewritten id would be one the caller cannot look up.
    """
    if not isinstance(body, (BaseModel, Mapping)):
        return None

    def field(key: str) -> Any:
        return body.get(key) if isinstance(body, Mapping) else getattr(body, key, None)

    rollout_id = field(ROLLOUT_ID_KEY_NAME)
    if rollout_id is not None:
        if not (isinstance(rollout_id, str) and ROLLOUT_ID_PATTERN.match(rollout_id)):
            raise ValueError(f"{ROLLOUT_ID_KEY_NAME} is letters, digits, '.', '-' and '_', starting with a letter or digit; got {rollout_id!r}")
    else:
        task, rollout = field(TASK_INDEX_KEY_NAME), field(ROLLOUT_INDEX_KEY_NAME)
        if task is None or rollout is None:
            return None
        rollout_id = f"{task}-{rollout}"
    attempt = field(ATTEMPT_INDEX_KEY_NAME)
    return f"{rollout_id}-a{int(attempt)}" if attempt is not None and int(attempt) > 0 else rollout_id


def current_rollout_id() -> Optional[str]:
    return _ROLLOUT_ID.get()


@contextlib.contextmanager
def rollout_context(rollout_id: Optional[str]) -> Iterator[None]:
    """``current_rollout_id()`` is ``rollout_id`` inside the block."""
    token = _ROLLOUT_ID.set(rollout_id)
    try:
        yield
    finally:
        _ROLLOUT_ID.reset(token)


class RolloutContextMiddleware:
    """An HTTP request for ``/ng-rollout/<id>/rest`` reaches the app as ``/rest``, inside ``rollout_context(id)``.

    With ``strip_token_capture`` (model servers), a ``/training-token-capture`` segment after the id is
    taken off too.
    """

    def __init__(self, app: ASGIApp, strip_token_capture: bool = False) -> None:
        self.app = app
        self.strip_token_capture = strip_token_capture

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = PREFIXED_PATH.match(scope["path"]) if scope["type"] == "http" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        rest = match["rest"]
        if self.strip_token_capture and rest.startswith(CAPTURE_SEGMENT + "/"):
            rest = rest[len(CAPTURE_SEGMENT) :]
        with rollout_context(match["rollout_id"]):
            await self.app({**scope, "path": rest, "raw_path": rest.encode()}, receive, send)
