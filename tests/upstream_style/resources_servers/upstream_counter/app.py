"""A per-session counter written the way upstream NeMo Gym's example_session_state_mgmt is written."""

from typing import Any, Dict, List

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.reward_profile import compute_pass_majority_metrics, highest_k_metrics
from nemo_gym.server_utils import SESSION_ID_KEY


class UpstreamCounterConfig(BaseResourcesServerConfig):
    REVERIFY_MODE = ReverifyMode.UNSUPPORTED
    counter_step_limit: int = 100


class SeedCounterRequest(BaseSeedSessionRequest):
    initial_count: int


class IncrementRequest(BaseModel):
    count: int


class IncrementResponse(BaseModel):
    success: bool


class GetValueRequest(BaseModel):
    pass


class GetValueResponse(BaseModel):
    count: int


class CounterVerifyRequest(BaseVerifyRequest):
    expected_count: int


class CounterVerifyResponse(BaseVerifyResponse):
    expected_count: int
    found_count: int


class UpstreamCounterServer(SimpleResourcesServer):
    config: UpstreamCounterConfig
    session_id_to_counter: Dict[str, int] = Field(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/increment_counter")(self.increment_counter)
        app.post("/get_counter_value")(self.get_counter_value)
        return app

    async def seed_session(self, request: Request, body: SeedCounterRequest) -> BaseSeedSessionResponse:
        self.session_id_to_counter[request.session[SESSION_ID_KEY]] = body.initial_count
        return BaseSeedSessionResponse()

    async def increment_counter(self, request: Request, body: IncrementRequest) -> IncrementResponse:
        session_id = request.session[SESSION_ID_KEY]
        self.session_id_to_counter.setdefault(session_id, 0)
        self.session_id_to_counter[session_id] += body.count
        return IncrementResponse(success=True)

    async def get_counter_value(self, request: Request, body: GetValueRequest) -> GetValueResponse:
        return GetValueResponse(count=self.session_id_to_counter.setdefault(request.session[SESSION_ID_KEY], 0))

    async def verify(self, request: Request, body: CounterVerifyRequest) -> CounterVerifyResponse:
        found = self.session_id_to_counter.get(request.session[SESSION_ID_KEY], 0)
        reward = 1.0 if found == body.expected_count else 0.0
        return CounterVerifyResponse(**body.model_dump(), reward=reward, found_count=found)

    def compute_metrics(self, tasks: List[List[Dict[str, Any]]]) -> Dict[str, Any]:
        metrics, *_ = compute_pass_majority_metrics(tasks)
        return metrics

    def get_key_metrics(self, agent_metrics: Dict[str, Any]) -> Dict[str, Any]:
        return {"mean/reward": agent_metrics.get("mean/reward"), **highest_k_metrics(agent_metrics, "pass@{k}")}


if __name__ == "__main__":
    UpstreamCounterServer.run_webserver()
