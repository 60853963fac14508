"""memory_agent: remembers each session's conversation, so the next ``/v1/responses`` call continues it.

A caller sends only what is new in each turn (a user message, or the outputs of the function calls the
model asked for last turn); the agent puts it after everything the session said and heard before,
asks the model, and remembers the model's output too. The memory is a dict keyed by
``request.session["session_id"]`` in this worker's memory, the state that session routing keeps
reachable at any number of workers, and kept durable, so a conversation outlives its worker.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from fastapi import HTTPException, Request, Response as HTTPResponse
from pydantic import BaseModel, Field

from nemo_gym import SESSION_ID_KEY
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, BaseRunRequest, SimpleResponsesAPIAgent, checked_json
from nemo_gym.config_types import ModelServerRef
from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming


class MemoryAgentConfig(BaseResponsesAPIAgentConfig):
    model_server: ModelServerRef
    # Conversations kept per worker; past this, the one used least recently is forgotten. (Not ``max_sessions``:
    # that is every server's cap on live sessions, docs/lifecycle.md, which refuses new ones instead.)
    max_conversations: int = Field(10_000, gt=0)


class Conversations(OrderedDict[str, list[Any]]):
    """Each session's conversation, least recently used first, kept durable (``nemo_gym.durable``) as JSON.

    A conversation this worker forgets to make room leaves its stored copy to expire with the cookie.
    """

    def export(self, session_id: str) -> str | None:
        conversation = self.get(session_id)
        if conversation is None:
            return None
        return json.dumps([item.model_dump(mode="json", by_alias=True, exclude_none=True) if isinstance(item, BaseModel) else item for item in conversation])

    def restore(self, session_id: str, data: str) -> None:
        self[session_id] = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": json.loads(data)}).input_items()

    def end(self, session_id: str) -> None:
        self.pop(session_id, None)

    def forget(self, session_id: str) -> None:
        self.pop(session_id, None)


class MemoryAgent(SimpleResponsesAPIAgent):
    config: MemoryAgentConfig
    conversations: Conversations = Field(default_factory=Conversations)

    def session_states(self) -> Conversations:
        return self.conversations

    async def on_session_end(self, session_id: str, reason: EndReason) -> None:
        """An ended session's conversation goes (with durable sessions the framework drops it too; at one worker only this does)."""
        self.conversations.pop(session_id, None)

    async def responses(
        self, request: Request, response: HTTPResponse, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        session_id = request.session[SESSION_ID_KEY]
        conversation = [*self.conversations.get(session_id, []), *body.input_items()]
        step = body.model_copy(update={"input": conversation})
        model = self.config.model_server.name
        reply = await self.server_client.post(model, "/v1/responses", json=step.model_dump(mode="json", by_alias=True, exclude_none=True))
        model_response = NeMoGymResponse.model_validate(await checked_json(reply, f"{model}/v1/responses"))
        self.remember(session_id, conversation + model_response.output)
        return model_response

    def remember(self, session_id: str, conversation: list[Any]) -> None:
        self.conversations[session_id] = conversation
        self.conversations.move_to_end(session_id)
        while len(self.conversations) > self.config.max_conversations:
            self.conversations.popitem(last=False)

    async def run(self, request: Request, response: HTTPResponse, body: BaseRunRequest) -> dict[str, Any]:
        raise HTTPException(501, f"{self.name} has no environment to run episodes in; hold a conversation through /v1/responses")


if __name__ == "__main__":
    MemoryAgent.run_webserver()
