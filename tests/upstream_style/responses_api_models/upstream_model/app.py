"""A model server written the way upstream NeMo Gym's vllm_model is written (the worker `app` guard
included): the Responses API in front of an OpenAI-compatible chat completions server."""

import time
import uuid
from typing import Any, Dict, List

from fastapi import Request

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, Body, SimpleResponsesAPIModel
from nemo_gym.config_types import ModelServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import SESSION_ID_KEY, get_response_json, is_nemo_gym_fastapi_entrypoint, raise_for_status


class UpstreamModelConfig(BaseResponsesAPIModelConfig):
    backend_server: ModelServerRef
    model: str


def to_messages(items: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    messages: List[Dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content)
            messages.append({"role": item["role"], "content": content})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


class UpstreamModel(SimpleResponsesAPIModel):
    config: UpstreamModelConfig

    def model_post_init(self, context: Any) -> None:
        self._sessions_seen: Dict[str, int] = {}
        return super().model_post_init(context)

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        session_id = request.session[SESSION_ID_KEY]
        self._sessions_seen[session_id] = self._sessions_seen.get(session_id, 0) + 1
        items = [item if isinstance(item, dict) else item.model_dump(mode="json") for item in body.input_items()]
        tools = [tool.model_dump(mode="json", exclude_none=True) for tool in body.tools]
        chat_request = {"model": self.config.model, "messages": to_messages(items)}
        if tools:
            chat_request["tools"] = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}} for tool in tools]
        chat_response = await self.server_client.post(
            server_name=self.config.backend_server.name, url_path="/v1/chat/completions", json=chat_request
        )
        await raise_for_status(chat_response)
        message = (await get_response_json(chat_response))["choices"][0]["message"]
        output: List[Dict[str, Any]] = [
            {
                "type": "function_call",
                "id": f"fc_{call['id']}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
            for call in message.get("tool_calls") or []
        ]
        if message.get("content"):
            text = {"type": "output_text", "text": message["content"], "annotations": []}
            output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant", "status": "completed", "content": [text]})
        reply = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "model": self.config.model,
            "status": "completed",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": tools,
        }
        return NeMoGymResponse.model_validate(reply)


if __name__ == "__main__":
    UpstreamModel.run_webserver()
elif is_nemo_gym_fastapi_entrypoint(__file__):
    app = UpstreamModel.run_webserver()
