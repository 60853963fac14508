"""An agent written the way upstream NeMo Gym's simple_agent is written: it replaces the cookies it
holds for each server with the ones that server's last reply set."""

import json
import uuid
from typing import Any, Dict, List

from fastapi import Request, Response
from pydantic import ConfigDict

from nemo_gym.base_resources_server import AggregateMetrics, AggregateMetricsRequest, BaseRunRequest
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, Body, SimpleResponsesAPIAgent
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymFunctionCallOutput, NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import get_response_json, raise_for_status


class UpstreamAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    max_steps: int = 10


class UpstreamAgentRunRequest(BaseRunRequest):
    model_config = ConfigDict(extra="allow")


class UpstreamAgent(SimpleResponsesAPIAgent):
    config: UpstreamAgentConfig

    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming = Body()
    ) -> NeMoGymResponse:
        model_cookies = None
        resources_cookies = request.cookies
        request_json = body.model_dump(mode="json", exclude_unset=True)
        conversation: List[Any] = [item if isinstance(item, dict) else item.model_dump(mode="json") for item in body.input_items()]
        new_outputs: List[Dict[str, Any]] = []
        model_json: Dict[str, Any] = {}
        for _ in range(self.config.max_steps):
            model_response = await self.server_client.post(
                server_name=self.config.model_server.name,
                url_path="/v1/responses",
                json={**request_json, "input": conversation + new_outputs},
                cookies=model_cookies,
            )
            await raise_for_status(model_response)
            model_json = await get_response_json(model_response)
            model_cookies = model_response.cookies
            new_outputs.extend(model_json["output"])
            calls = [item for item in model_json["output"] if item["type"] == "function_call"]
            if not calls:
                break
            for call in calls:
                tool_response = await self.server_client.post(
                    server_name=self.config.resources_server.name,
                    url_path=f"/{call['name']}",
                    json=json.loads(call["arguments"]),
                    cookies=resources_cookies,
                )
                resources_cookies = tool_response.cookies
                output = NeMoGymFunctionCallOutput(
                    call_id=call["call_id"], output=(await tool_response.read()).decode(), id=f"fco_{uuid.uuid4().hex}", status="completed"
                )
                new_outputs.append(output.model_dump(mode="json"))
        for name, morsel in (*resources_cookies.items(), *(model_cookies or {}).items()):
            response.set_cookie(name, getattr(morsel, "value", morsel))
        return NeMoGymResponse.model_validate({**model_json, "output": new_outputs})

    async def run(self, request: Request, body: UpstreamAgentRunRequest) -> Dict[str, Any]:
        resources = self.config.resources_server.name
        seed_response = await self.server_client.post(
            server_name=resources, url_path="/seed_session", json=body.model_dump(), cookies=request.cookies
        )
        await raise_for_status(seed_response)
        cookies = seed_response.cookies
        agent_response = await self.server_client.post(
            server_name=self.config.name, url_path="/v1/responses", json=body.responses_create_params, cookies=cookies
        )
        await raise_for_status(agent_response)
        cookies = agent_response.cookies
        verify_body = body.model_dump() | {"response": await get_response_json(agent_response)}
        verify_response = await self.server_client.post(server_name=resources, url_path="/verify", json=verify_body, cookies=cookies)
        await raise_for_status(verify_response)
        return await get_response_json(verify_response)

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        metrics_response = await self.server_client.post(
            server_name=self.config.resources_server.name, url_path="/aggregate_metrics", json=body
        )
        await raise_for_status(metrics_response)
        return AggregateMetrics.model_validate(await get_response_json(metrics_response))


if __name__ == "__main__":
    UpstreamAgent.run_webserver()
