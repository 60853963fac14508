"""SimpleResourcesServer: the base of every environment (tools, seed_session, verify, metrics)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from nemo_gym.openai_types import Response, ResponseCreateParams
from nemo_gym.server import SimpleServer


class BaseResourcesServerConfig(SimpleServer.config_class):
    pass


class BaseSeedSessionRequest(BaseModel):
    """The task row a rollout starts from; environments read the fields they need."""

    model_config = ConfigDict(extra="allow")


class BaseSeedSessionResponse(BaseModel):
    model_config = ConfigDict(extra="allow")


class BaseVerifyRequest(BaseModel):
    """The task row, plus the request that was sent to the agent and the agent's final response."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: ResponseCreateParams
    response: Response


class BaseVerifyResponse(BaseVerifyRequest):
    reward: float


class AggregateMetricsRequest(BaseModel):
    verify_responses: list[dict[str, Any]]


class AggregateMetrics(BaseModel):
    num_episodes: int
    mean_reward: float
    reward_counts: dict[str, int]


def aggregate_rewards(verify_responses: list[dict[str, Any]]) -> AggregateMetrics:
    rewards = [float(reply.get("reward", 0.0)) for reply in verify_responses]
    counts = Counter(str(reward) for reward in rewards)
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    return AggregateMetrics(num_episodes=len(rewards), mean_reward=mean, reward_counts=dict(sorted(counts.items())))


class SimpleResourcesServer(SimpleServer):
    """Subclass it, keep state per ``request.session["session_id"]``, add ``POST /<tool>`` routes."""

    config_class = BaseResourcesServerConfig
    route_sessions = True

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/seed_session")(self.seed_session)
        app.post("/verify")(self.verify)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        return app

    async def seed_session(self, request: Request, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        return BaseSeedSessionResponse()

    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        raise NotImplementedError

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return aggregate_rewards(body.verify_responses)
