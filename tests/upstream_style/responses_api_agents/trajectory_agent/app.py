"""An agent written the way upstream NeMo Gym's current simple_agent is: it replaces its cookies with each
reply's, calls under the rollout's prefix when model-call capture is on, and then hands back what it
observed as upstream's trajectory contracts (``nemo_gym.rollout_observability``) in ``ng_trajectory``."""

import json
from time import perf_counter, time
from typing import Any, List, Optional

from fastapi import Request, Response
from pydantic import ConfigDict

from nemo_gym.base_resources_server import AggregateMetrics, AggregateMetricsRequest, BaseRunRequest, BaseVerifyResponse
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, Body, SimpleResponsesAPIAgent
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import (
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    accumulate_response_usage,
)
from nemo_gym.rollout_observability import AgentInvocation, ModelCallRef, ObservationGap, TrajectoryRecord, TrajectoryToolCall, TrajectoryTurn
from nemo_gym.server_utils import get_response_json, raise_for_status

TRAJECTORY_KEY = "_ng_trajectory"


class TrajectoryAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    max_steps: Optional[int] = None


class TrajectoryAgentRunRequest(BaseRunRequest):
    model_config = ConfigDict(extra="allow")


class TrajectoryAgentVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")


class TrajectoryAgent(SimpleResponsesAPIAgent):
    config: TrajectoryAgentConfig

    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming = Body()
    ) -> NeMoGymResponse:
        rollout_id = request.path_params.get("rollout_id")
        observing = self._model_call_capture_enabled() and rollout_id is not None
        rollout_id = rollout_id or "unscoped"
        if isinstance(body.input, str):
            body = body.model_copy(update={"input": [NeMoGymEasyInputMessage(role="user", content=body.input)]})
        resources_cookies, model_cookies = request.cookies, None
        outputs: List[Any] = []
        turns: List[TrajectoryTurn] = []
        tools: List[TrajectoryToolCall] = []
        usage, step, status = None, 0, "completed"
        while True:
            step += 1
            question = body.input + outputs
            asked_at = time()
            model_reply = await self.server_client.post(
                server_name=self.config.model_server.name,
                url_path=self.url_path_for_request("/v1/responses", request),
                json=body.model_copy(update={"input": question}),
                cookies=model_cookies,
            )
            await raise_for_status(model_reply)
            model_cookies = model_reply.cookies
            model_response = NeMoGymResponse.model_validate(await get_response_json(model_reply))
            outputs.extend(model_response.output)
            usage = accumulate_response_usage(usage, model_response.usage)
            if observing:
                turns.append(
                    TrajectoryTurn(
                        invocation_id="root",
                        task_id="unscoped",
                        rollout_id=rollout_id,
                        turn_no=step,
                        timestamp=asked_at,
                        question=question,
                        answer=model_response.output,
                        step_count=len(tools),
                        model_calls=[ModelCallRef(model_ref=self.config.model_server, response_id=model_response.id)],
                    )
                )
            if model_response.incomplete_details:
                status = "incomplete"
                break
            calls = [item for item in model_response.output if item.type == "function_call"]
            if not calls:
                break
            for call in calls:
                started_at, started = time(), perf_counter()
                tool_reply = await self.server_client.post(
                    server_name=self.config.resources_server.name,
                    url_path=f"/{call.name}",
                    json=json.loads(call.arguments),
                    cookies=resources_cookies,
                )
                resources_cookies = tool_reply.cookies
                output = (await tool_reply.content.read()).decode()
                outputs.append(NeMoGymFunctionCallOutput(type="function_call_output", call_id=call.call_id, output=output))
                tools.append(
                    TrajectoryToolCall(
                        invocation_id="root",
                        tool_call_id=call.call_id,
                        tool_name=call.name,
                        started_at=started_at,
                        completed_at=max(started_at, time()),
                        duration_ms=(perf_counter() - started) * 1000,
                        timing_source="executor",
                        status="completed" if tool_reply.ok else "failed",
                        output=output,
                    )
                )
            if observing:
                turns[-1].step_count = len(tools)
            if self.config.max_steps and step >= self.config.max_steps:
                status = "incomplete"
                break
        for name, value in (*resources_cookies.items(), *model_cookies.items()):
            response.set_cookie(name, getattr(value, "value", value))
        model_response = model_response.model_copy(update={"output": outputs, "usage": usage})
        if not observing:
            return model_response
        invocation = AgentInvocation(invocation_id="root", status=status, conversation=[*body.input, *outputs])
        trajectory = TrajectoryRecord(task_id="unscoped", rollout_id=rollout_id, invocations=[invocation], turns=turns, tool_calls=tools)
        return model_response.model_copy(update={TRAJECTORY_KEY: trajectory.model_dump(mode="json")})

    async def run(self, request: Request, body: TrajectoryAgentRunRequest) -> TrajectoryAgentVerifyResponse:
        resources = self.config.resources_server.name
        seed_reply = await self.server_client.post(server_name=resources, url_path="/seed_session", json=body.model_dump(), cookies=request.cookies)
        await raise_for_status(seed_reply)
        agent_reply = await self.server_client.post(
            server_name=self.config.name,
            url_path=self.url_path_for_run("/v1/responses", body),
            json=body.responses_create_params,
            cookies=seed_reply.cookies,
        )
        await raise_for_status(agent_reply)
        agent_response = await get_response_json(agent_reply)
        trajectory = agent_response.pop(TRAJECTORY_KEY, None)
        verify_reply = await self.server_client.post(
            server_name=resources, url_path="/verify", json=body.model_dump() | {"response": agent_response}, cookies=agent_reply.cookies
        )
        await raise_for_status(verify_reply)
        result = await get_response_json(verify_reply)
        if trajectory is not None:
            record = TrajectoryRecord.model_validate(trajectory)
            record.gaps.append(ObservationGap(code="resolution_unavailable", invocation_id="root"))
            result["ng_trajectory"] = record.model_dump(mode="json")
        return TrajectoryAgentVerifyResponse.model_validate(result)

    async def aggregate_metrics(self, body: AggregateMetricsRequest = Body()) -> AggregateMetrics:
        metrics_reply = await self.server_client.post(server_name=self.config.resources_server.name, url_path="/aggregate_metrics", json=body)
        await raise_for_status(metrics_reply)
        return AggregateMetrics.model_validate(await get_response_json(metrics_reply))


if __name__ == "__main__":
    TrajectoryAgent.run_webserver()
