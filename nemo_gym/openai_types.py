"""The part of the OpenAI Responses API these servers speak, as pydantic models.

Only what the Gym's servers use, with the API's own field names and shapes, so that a real
Responses API client or server can stand on either side.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ResponseInputText(BaseModel):
    type: Literal["input_text"] = "input_text"
    text: str


class ResponseOutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)


class EasyInputMessage(BaseModel):
    """A message given as input: ``{"role": "user", "content": "..."}``."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ResponseInputText | ResponseOutputText]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseOutputMessage(BaseModel):
    """An assistant message produced by the model."""

    id: str = Field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[ResponseOutputText]

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content)


class ResponseFunctionToolCall(BaseModel):
    """The model asks for a function to be called; ``arguments`` is a JSON string."""

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutput(BaseModel):
    """The result of a function call, given back to the model."""

    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str


InputItem = ResponseFunctionToolCall | FunctionCallOutput | ResponseOutputMessage | EasyInputMessage
# An agent's response also carries the outputs of the calls it ran, in order.
OutputItem = ResponseFunctionToolCall | FunctionCallOutput | ResponseOutputMessage


class FunctionTool(BaseModel):
    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseCreateParams(BaseModel):
    """The body of ``POST /v1/responses``. Unknown keys are refused, so a typo is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[InputItem]
    model: str | None = None
    instructions: str | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] | None = None

    def input_items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [EasyInputMessage(role="user", content=self.input)]
        return list(self.input)


class Response(BaseModel):
    """A Responses API response object."""

    id: str = Field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    model: str = ""
    status: Literal["completed", "incomplete", "failed"] = "completed"
    output: list[OutputItem] = Field(default_factory=list)
    usage: dict[str, Any] | None = None

    @property
    def output_text(self) -> str:
        return "".join(item.text for item in self.output if isinstance(item, ResponseOutputMessage))
