"""A counter kept per session: the smallest environment whose reward depends on session state."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.durable.states import SessionStates
from nemo_gym.server_utils import SESSION_ID_KEY


class CounterSeedSessionRequest(BaseSeedSessionRequest):
    initial_count: int = 0


class IncrementCounterRequest(BaseModel):
    count: int


class IncrementCounterResponse(BaseModel):
    success: bool


class GetCounterValueRequest(BaseModel):
    pass


class GetCounterValueResponse(BaseModel):
    count: int


class CounterVerifyRequest(BaseVerifyRequest):
    expected_count: int


class CounterVerifyResponse(BaseVerifyResponse):
    expected_count: int
    count: int | None


class CounterServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig
    # The counters outlive a worker and a restart: written through to the instance's session store.
    counters: SessionStates[int] = Field(default_factory=lambda: SessionStates(int))

    def session_states(self) -> SessionStates[int]:
        return self.counters

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/increment_counter")(self.increment_counter)
        app.post("/get_counter_value")(self.get_counter_value)
        return app

    async def seed_session(self, request: Request, body: CounterSeedSessionRequest) -> BaseSeedSessionResponse:
        self.counters[request.session[SESSION_ID_KEY]] = body.initial_count
        return BaseSeedSessionResponse()

    async def increment_counter(self, request: Request, body: IncrementCounterRequest) -> IncrementCounterResponse:
        """Add `count` to this session's counter."""
        session_id = self.seeded_session(request)
        self.counters[session_id] += body.count
        return IncrementCounterResponse(success=True)

    async def get_counter_value(self, request: Request, body: GetCounterValueRequest) -> GetCounterValueResponse:
        """Read this session's counter."""
        return GetCounterValueResponse(count=self.counters[self.seeded_session(request)])

    def seeded_session(self, request: Request) -> str:
        """The session's id; a session this server never seeded has no counter to use (404, not a fresh 0)."""
        session_id = request.session[SESSION_ID_KEY]
        if session_id not in self.counters:
            raise HTTPException(404, "This session has no counter: call /seed_session first.")
        return session_id

    async def verify(self, request: Request, body: CounterVerifyRequest) -> CounterVerifyResponse:
        count = self.counters.pop(request.session[SESSION_ID_KEY], None)
        reward = 1.0 if count == body.expected_count else 0.0
        # The caller's own reward or count, if it sent one, is replaced by the server's.
        return CounterVerifyResponse(**{**body.model_dump(), "reward": reward, "count": count})


if __name__ == "__main__":
    CounterServer.run_webserver()
