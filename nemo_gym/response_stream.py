"""A finished response as the stream of Responses API events that the OpenAI SDK reads with ``stream=True``.

The servers answer a streaming request once the whole response is ready: the events come all at once,
in the API's order (created, in progress, each item opened, its content, each item done, completed).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.responses import Response as HTTPResponse

from nemo_gym.openai_utils import NeMoGymResponse

FINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


def dump(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def opened(item: Any) -> dict[str, Any]:
    """An item as ``response.output_item.added`` shows it: in progress, before its content arrives."""
    if item.type == "message":
        return {**dump(item), "status": "in_progress", "content": []}
    if item.type == "function_call":
        return {**dump(item), "status": "in_progress", "arguments": ""}
    return dump(item)


def content_events(item: Any, output_index: int) -> Iterator[dict[str, Any]]:
    """The events that fill in one item after it is opened."""
    if item.type == "function_call":
        at = {"item_id": item.id or "", "output_index": output_index}
        yield {"type": "response.function_call_arguments.delta", **at, "delta": item.arguments}
        yield {"type": "response.function_call_arguments.done", **at, "arguments": item.arguments}
        return
    if item.type != "message":
        return
    for content_index, part in enumerate(item.content):
        at = {"item_id": item.id, "output_index": output_index, "content_index": content_index}
        if part.type == "output_text":
            yield {"type": "response.content_part.added", **at, "part": {**dump(part), "text": ""}}
            yield {"type": "response.output_text.delta", **at, "delta": part.text, "logprobs": []}
            yield {"type": "response.output_text.done", **at, "text": part.text, "logprobs": []}
        else:
            yield {"type": "response.content_part.added", **at, "part": {**dump(part), "refusal": ""}}
            yield {"type": "response.refusal.delta", **at, "delta": part.refusal}
            yield {"type": "response.refusal.done", **at, "refusal": part.refusal}
        yield {"type": "response.content_part.done", **at, "part": dump(part)}


def response_events(response: NeMoGymResponse) -> list[dict[str, Any]]:
    """Every event of the response's stream, numbered by ``sequence_number``."""
    started = {**dump(response), "status": "in_progress", "output": []}
    started.pop("usage", None)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(response.output):
        events.append({"type": "response.output_item.added", "output_index": index, "item": opened(item)})
        events.extend(content_events(item, index))
        events.append({"type": "response.output_item.done", "output_index": index, "item": dump(item)})
    events.append({"type": FINAL_EVENT.get(response.status or "completed", "response.completed"), "response": dump(response)})
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


def server_sent_events(response: NeMoGymResponse) -> StreamingResponse:
    lines = (f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in response_events(response))
    return StreamingResponse(lines, media_type="text/event-stream")


def response_reply(response: NeMoGymResponse, stream: bool | None) -> HTTPResponse:
    """The HTTP reply to ``POST /v1/responses``: the response as JSON, or as events when the request asked to stream."""
    return server_sent_events(response) if stream else JSONResponse(dump(response))


async def answer(responses: Callable[..., Awaitable[NeMoGymResponse]], given: dict[str, Any], stream: bool | None) -> HTTPResponse:
    """The reply of a server's ``responses`` called with those of ``given`` (``request``, ``response``,
    ``body``) it declares, by name: upstream's servers declare ``responses(self, body)`` as often as
    ``responses(self, request, body)``."""
    parameters = inspect.signature(responses).parameters
    return response_reply(await responses(**{name: value for name, value in given.items() if name in parameters}), stream)
