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

from nemo_gym.config_types import BaseRunServerInstanceConfig
from nemo_gym.openai_utils import NeMoGymChatCompletion, NeMoGymChatCompletionCreateParamsNonStreaming
from nemo_gym.server import SimpleServer


class ScriptedBackendConfig(BaseRunServerInstanceConfig):
    think_time_ms: int = 0


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


def token_count(value: Any) -> int:
    """The backend's stand-in for a tokenizer: the words of ``value`` written as JSON."""
    return len(json.dumps(value).split())


class ScriptedBackend(SimpleServer):
    config: ScriptedBackendConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/v1/chat/completions")(self.chat_completions)
        return app

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> NeMoGymChatCompletion:
        if not body.messages:
            raise HTTPException(400, "messages must not be empty")
        if self.config.think_time_ms:
            await asyncio.sleep(self.config.think_time_ms / 1000)
        message = next_turn(body.messages)
        prompt_tokens, completion_tokens = token_count(body.messages), token_count(message)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
        completion = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time())}
        return NeMoGymChatCompletion.model_validate({**completion, "model": body.model or self.config.name, "choices": [choice], "usage": usage})


# The fixed version of each swe_rebench task's buggy file, keyed by the file the task names.
SWE_REBENCH_FIXES: dict[str, str] = {
    "bounds.py": '''"""Keep numbers inside a range."""


def clamp(value, low, high):
    """Return ``value`` limited to the closed range [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value
''',
    "slugs.py": '''"""Turn titles into URL slugs."""

import re


def slugify(title):
    """'Hello, World!' -> 'hello-world': the words of letters and digits, in lower case, joined by '-'."""
    words = re.findall(r"[A-Za-z0-9]+", title)
    return "-".join(words).lower()
''',
    "averages.py": '''"""Averages of lists of numbers."""


def mean(values):
    """The arithmetic mean of a non-empty list of numbers."""
    return sum(values) / len(values)
''',
    "spans.py": '''"""Closed intervals given as (start, end) pairs."""


def overlaps(first, second):
    """Whether two closed intervals share at least one point (touching ends count)."""
    return first[0] <= second[1] and second[0] <= first[1]
''',
    "fizzbuzz.py": '''"""The counting game."""


def fizzbuzz(number):
    """'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for multiples of both, else the number."""
    if number % 15 == 0:
        return "FizzBuzz"
    if number % 3 == 0:
        return "Fizz"
    if number % 5 == 0:
        return "Buzz"
    return str(number)
''',
}


def swe_rebench_playbook(task: str) -> list[ToolStep] | None:
    """'Fix the bug ... in your sandbox ... `bounds.py` ...' -> read the file, write the fixed one, run the tests."""
    named = re.search(r"`(\w+\.py)`", task)
    if "in your sandbox" not in task or named is None or named.group(1) not in SWE_REBENCH_FIXES:
        return None
    path = named.group(1)
    return [("read_file", {"path": path}), ("write_file", {"path": path, "content": SWE_REBENCH_FIXES[path]}), ("run_tests", {})]


PLAYBOOKS.append(swe_rebench_playbook)


if __name__ == "__main__":
    ScriptedBackend.run_webserver()
