"""The embedded scripted backend: an OpenAI chat completions server that plays the example tasks.

It reads the task (the first user message), turns it into the tool calls that solve it, and plays
them one per turn; once every call has its result it answers with a final message. It is the
default policy when no model URL is given, and the fake backend of the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from typing import Any, Callable

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict

from nemo_gym.server import ServerApp, SimpleServer


class ScriptedBackendConfig(SimpleServer.config_class):
    think_time_ms: int = 0


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]]


ToolStep = tuple[str, dict[str, Any]]


def counter_playbook(task: str) -> list[ToolStep] | None:
    """'Add 1, then add 2, then tell me the count.' -> increment by 1, by 2, then read the counter."""
    amounts = [int(number) for number in re.findall(r"\badd (-?\d+)", task, re.IGNORECASE)]
    if not amounts:
        return None
    steps: list[ToolStep] = [("increment_counter", {"count": amount}) for amount in amounts]
    return steps + [("get_counter_value", {})]


PLAYBOOKS: list[Callable[[str], list[ToolStep] | None]] = [counter_playbook]


def task_text(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(part.get("text", "") for part in content if isinstance(part, dict))
            return content or ""
    return ""


def next_turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message for this point of the conversation."""
    task = task_text(messages)
    steps = next((steps for playbook in PLAYBOOKS if (steps := playbook(task)) is not None), None)
    if steps is None:
        return {"role": "assistant", "content": f"I have no script for this task: {task[:200]!r}"}
    results = [message.get("content", "") for message in messages if message.get("role") == "tool"]
    if len(results) < len(steps):
        name, arguments = steps[len(results)]
        call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": f"Done. The last tool said: {results[-1]}"}


class ScriptedBackend(SimpleServer):
    config_class = ScriptedBackendConfig
    config: ScriptedBackendConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/v1/chat/completions")(self.chat_completions)
        return app

    async def chat_completions(self, body: ChatCompletionRequest) -> dict[str, Any]:
        if not body.messages:
            raise HTTPException(400, "messages must not be empty")
        if self.config.think_time_ms:
            await asyncio.sleep(self.config.think_time_ms / 1000)
        message = next_turn(body.messages)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }


app = ServerApp(ScriptedBackend)
