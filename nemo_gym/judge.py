"""A failed LLM judge is its own outcome, not a wrong answer: ``JudgeError``, the judge call, and the ``/verify`` wrapper that records it."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from nemo_gym.server_utils import ServerClient, get_response_json, raise_for_status

JUDGE_FAILED = "judge_failed"

ReplyT = TypeVar("ReplyT", bound=BaseModel)


class JudgeError(Exception):
    """A judge call failed or gave nothing usable."""


async def reraise_judge_errors(call: Awaitable[Any]) -> Any:
    """Await a judge call; whatever it raises comes out as a ``JudgeError`` naming the original error.

    Wrap the call only: an error in the scoring around it is a bug, not a failed judge.
    """
    try:
        return await call
    except JudgeError:
        raise
    except Exception as error:
        raise JudgeError(f"{type(error).__name__}: {error}") from error


async def call_judge(server_client: ServerClient, *, server_name: str, url_path: str, json: Any, response_model: type[ReplyT]) -> ReplyT:
    """POST ``json`` to the judge model instance ``server_name`` and read its reply as ``response_model``.

    An error status, a refused connection or a reply that is not a ``response_model`` raises ``JudgeError``;
    the status is checked first, so an error reply is reported as such, not as a validation error.
    """

    async def ask() -> ReplyT:
        reply = await server_client.post(server_name=server_name, url_path=url_path, json=json)
        await raise_for_status(reply)
        return response_model.model_validate(await get_response_json(reply))

    return await reraise_judge_errors(ask())


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
