"""Request bodies are read as strict JSON: ``NaN`` and ``Infinity``, which Python's json accepts, are a 422."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

# A string, or one of the constants JSON does not have; the first constant outside a string is the culprit.
CONSTANT_OR_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|NaN|-?Infinity')


class BodyNotJSON(json.JSONDecodeError):
    """The request body is not strict JSON. FastAPI answers its own body parsing's with a 422."""


class NotJSONConstant(Exception):
    pass


def refuse_constant(name: str) -> None:
    raise NotJSONConstant(name)


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            text = body.decode(json.detect_encoding(body), "surrogatepass")
            try:
                self._json = json.loads(text, parse_constant=refuse_constant)
            except json.JSONDecodeError as error:
                raise BodyNotJSON(error.msg, text, error.pos) from None
            except NotJSONConstant as error:
                position = next(match.start() for match in CONSTANT_OR_STRING.finditer(text) if match[0][0] != '"')
                raise BodyNotJSON(f"{error} is not valid JSON", text, position) from None
        return self._json


class StrictJSONRoute(APIRoute):
    """A route whose body validation and handler see a StrictJSONRequest, so a body that is not JSON is a 422."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            try:
                return await handler(StrictJSONRequest(request.scope, request.receive))
            except BodyNotJSON as error:  # from a handler that reads the body itself
                problem = {"type": "json_invalid", "loc": ("body", error.pos), "msg": "JSON decode error", "input": {}, "ctx": {"error": error.msg}}
                raise RequestValidationError([problem], body=error.doc) from None

        return strict_handler
