"""SimpleResponsesAPIAgent: the base of agents (``/v1/responses``, ``/run``, ``/aggregate_metrics``)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response as HTTPResponse
from pydantic import BaseModel, ConfigDict

from nemo_gym.base_resources_server import AggregateMetrics, AggregateMetricsRequest, aggregate_rewards
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParams, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.response_stream import response_reply
from nemo_gym.server import SimpleServer


class BaseRunRequest(BaseModel):
    """One task row: the request for the agent plus whatever the environment needs to seed and verify."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming


class SimpleResponsesAPIAgent(SimpleServer):
    route_sessions = True

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/v1/responses", response_model=None)(self.answer_responses)
        app.post("/run")(self.run)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        return app

    async def answer_responses(self, request: Request, response: HTTPResponse, body: NeMoGymResponseCreateParams) -> HTTPResponse:
        """The response ``responses`` makes, as JSON or as events, with the cookies ``responses`` set."""
        reply = response_reply(await self.responses(request, response, body.non_streaming()), body.stream)
        reply.raw_headers.extend(header for header in response.raw_headers if header[0] == b"set-cookie")
        return reply

    async def responses(
        self, request: Request, response: HTTPResponse, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        raise NotImplementedError

    async def run(self, request: Request, response: HTTPResponse, body: BaseRunRequest) -> dict[str, Any]:
        raise NotImplementedError

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return aggregate_rewards(body.verify_responses)
