"""SimpleResourcesServer: the base of every environment (tools, seed_session, verify, metrics)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict
from starlette.routing import BaseRoute

from nemo_gym.mcp_tools import McpToolEndpoint, SeedSessionMcpMetadata, default_tool_routes
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server import SimpleServer
from nemo_gym.session_token import mint_token, token_serializer


class BaseResourcesServerConfig(SimpleServer.config_class):
    # Serve the server's own POST /<tool> routes as MCP tools at /mcp; /seed_session then mints the token.
    expose_tools_over_mcp: bool = False


class BaseSeedSessionRequest(BaseModel):
    """The task row a rollout starts from; environments read the fields they need."""

    model_config = ConfigDict(extra="allow")


class BaseSeedSessionResponse(BaseModel):
    model_config = ConfigDict(extra="allow")


class BaseVerifyRequest(BaseModel):
    """The task row, plus the request that was sent to the agent and the agent's final response."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming
    response: NeMoGymResponse


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
    session_end_paths = frozenset({"/verify"})

    # The /mcp endpoint, when the config exposes the tools over MCP.
    mcp_endpoint: McpToolEndpoint | None = None

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/seed_session")(self.seed_session)
        app.post("/verify")(self.verify)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        # --- MCP exposure (nemo_gym.mcp_tools): the /mcp endpoint and the token in /seed_session replies.
        if self.config.expose_tools_over_mcp:
            serializer = token_serializer(self.secret)
            self.mcp_endpoint = McpToolEndpoint(self.name, serializer, self.session_cookie, self.config.host)
            self.mcp_endpoint.mount(app)
            # Added here, before build_app's session middlewares, so it sits inside them and sees the session.
            app.add_middleware(
                SeedSessionMcpMetadata,
                server_name=self.name,
                mint=lambda session_id: mint_token(serializer, session_id, self.worker_id),
            )
        return app

    def mcp_tool_routes(self, app: FastAPI) -> list[BaseRoute]:
        """The routes served as MCP tools when ``expose_tools_over_mcp`` is on.

        By default every route the server registered except ``GET /`` and the framework's
        ``seed_session``, ``verify`` and ``aggregate_metrics``. Override it to leave routes out or to
        pick a few. Each route returned must be a ``POST /<name>`` whose input is one pydantic body (the
        tool's input schema; its docstring is the description), or the server fails at start-up.
        """
        return default_tool_routes(app)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        if self.mcp_endpoint is None:
            async with super().lifespan(app):
                yield
            return
        # All routes are registered by now; one that cannot be a tool stops the start-up, named.
        self.mcp_endpoint.serve(app, self.mcp_tool_routes(app))
        # The endpoint runs before the base lifespan opens the private socket, and stops after it closes.
        async with self.mcp_endpoint.run(), super().lifespan(app):
            yield
        # --- end of MCP exposure

    async def seed_session(self, request: Request, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        return BaseSeedSessionResponse()

    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        raise NotImplementedError

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return aggregate_rewards(body.verify_responses)
