"""simple_agent: call the model, run its function calls on the resources server, repeat."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request, Response as HTTPResponse

from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    BaseRunRequest,
    SimpleResponsesAPIAgent,
    checked_json,
    cookies_of,
    set_cookies,
)
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
from nemo_gym.sessions.cookie import NEW_SESSION_SCOPE_KEY
from nemo_gym.openai_utils import (
    NeMoGymFunctionCallOutput,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseOutputMessage,
    accumulate_response_usage,
    new_id,
    new_response,
)


class SimpleAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    max_steps: int = 20


def function_call_output(call: NeMoGymResponseFunctionToolCall, output: str) -> NeMoGymFunctionCallOutput:
    return NeMoGymFunctionCallOutput(call_id=call.call_id, output=output, id=new_id("fco"), status="completed")


class SimpleAgent(SimpleResponsesAPIAgent):
    config: SimpleAgentConfig

    async def responses(
        self, request: Request, response: HTTPResponse, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        cookies = dict(request.cookies)
        conversation = body.input_items()
        produced: list[Any] = []
        model_response, usage = new_response(body), None
        for _ in range(self.config.max_steps):
            step = body.model_copy(update={"input": conversation})
            reply = await self.server_client.post(
                self.config.model_server.name, "/v1/responses", json=step.model_dump(mode="json", by_alias=True, exclude_none=True)
            )
            model_response = NeMoGymResponse.model_validate(await checked_json(reply, f"{self.config.model_server.name}/v1/responses"))
            usage = accumulate_response_usage(usage, model_response.usage)
            calls = [item for item in model_response.output if isinstance(item, NeMoGymResponseFunctionToolCall)]
            for item in model_response.output:
                conversation.append(item)
                produced.append(item)
            for call in calls:
                output = await self.call_tool(call, cookies)
                conversation.append(output)
                produced.append(output)
            if not calls or any(isinstance(item, NeMoGymResponseOutputMessage) for item in model_response.output):
                break
        set_cookies(response, cookies)
        return model_response.model_copy(update={"output": produced, "usage": usage})

    async def call_tool(self, call: NeMoGymResponseFunctionToolCall, cookies: dict[str, str]) -> NeMoGymFunctionCallOutput:
        """Run one function call as ``POST /<name>``; whatever goes wrong becomes text the model reads."""
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as error:
            return function_call_output(call, f"Error: arguments are not valid JSON: {error}")
        if not isinstance(arguments, dict):
            return function_call_output(call, "Error: arguments must be a JSON object")
        reply = await self.server_client.post(self.config.resources_server.name, f"/{call.name}", json=arguments, cookies=cookies)
        cookies.update(cookies_of(reply))
        return function_call_output(call, await reply.text(errors="replace"))

    async def run(self, request: Request, response: HTTPResponse, body: BaseRunRequest) -> dict[str, Any]:
        cookies = dict(request.cookies)
        if NEW_SESSION_SCOPE_KEY in request.scope:
            # A new agent session: the caller's agent cookie, if any, names one that ended (docs/lifecycle.md).
            cookies.pop(self.session_cookie, None)
        resources = self.config.resources_server.name
        row = body.model_dump(mode="json", by_alias=True, exclude_none=True)

        seed = await self.server_client.post(resources, "/seed_session", json=row, cookies=cookies)
        await checked_json(seed, f"{resources}/seed_session")
        cookies.update(cookies_of(seed))
        reply = await self.server_client.post(self.name, "/v1/responses", json=row["responses_create_params"], cookies=cookies)
        agent_response = await checked_json(reply, f"{self.name}/v1/responses")
        # The caller gets this /run's own agent session cookie, not the one the inner call minted.
        cookies.update({name: value for name, value in cookies_of(reply).items() if name != self.session_cookie})
        verify = await self.server_client.post(resources, "/verify", json={**row, "response": agent_response}, cookies=cookies)
        verdict = await checked_json(verify, f"{resources}/verify")
        cookies.update(cookies_of(verify))
        set_cookies(response, cookies)
        return verdict


if __name__ == "__main__":
    SimpleAgent.run_webserver()
