"""A failed LLM judge is its own outcome, not a wrong answer: ``JudgeError`` and the ``/verify`` wrapper that records it."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel

JUDGE_FAILED = "judge_failed"


class JudgeError(Exception):
    """A judge call failed or gave nothing usable."""


async def run_judge(call: Awaitable[Any]) -> Any:
    """Await a judge call; whatever it raises comes out as a ``JudgeError`` naming the original error."""
    try:
        return await call
    except JudgeError:
        raise
    except Exception as error:
        raise JudgeError(f"{type(error).__name__}: {error}") from error


def judge_failsafe(verify: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap a ``verify`` handler: a ``JudgeError`` answers 200 with the request's fields, ``reward`` 0.0,
    ``_ng_failure_class: "judge_failed"`` and ``_ng_failure_judge_error``.

    The wrapper has ``verify``'s signature, so FastAPI passes it the same arguments.
    """

    @functools.wraps(verify)
    async def failsafe(*args: Any, **kwargs: Any) -> Any:
        try:
            return await verify(*args, **kwargs)
        except JudgeError as error:
            body = next(value for value in (*kwargs.values(), *args) if isinstance(value, BaseModel))
            row = {**body.model_dump(), "reward": 0.0, "_ng_failure_class": JUDGE_FAILED, "_ng_failure_judge_error": str(error)}
            return JSONResponse(jsonable_encoder(row))

    return failsafe
