"""SimpleResourcesServer: the base of every environment (tools, seed_session, verify, metrics)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, PrivateAttr
from starlette.routing import BaseRoute

from nemo_gym import mcp_tools
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest, BaseRunServerInstanceConfig
from nemo_gym.judge import judge_failsafe
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.reward_profile import AggregateMetricsMixin, compute_aggregate_metrics
from nemo_gym.server import SimpleServer
from nemo_gym.sessions.token import TOKEN_HEADER

if TYPE_CHECKING:
    from nemo_gym.mcp_tools.endpoint import McpToolEndpoint

__all__ = [
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "BaseMultiRewardVerifyResponse",
    "BaseResourcesServerConfig",
    "BaseRunRequest",
    "BaseSeedSessionRequest",
    "BaseSeedSessionResponse",
    "BaseVerifyRequest",
    "BaseVerifyResponse",
    "NEMO_GYM_MCP_METADATA_KEY",
    "NEMO_GYM_MCP_SESSION_TOKEN_HEADER",
    "ReverifyMode",
    "SimpleResourcesServer",
]

# Upstream's names: the key of a /seed_session reply's MCP metadata and the header of its session token.
NEMO_GYM_MCP_METADATA_KEY = mcp_tools.MCP_METADATA_KEY
NEMO_GYM_MCP_SESSION_TOKEN_HEADER = TOKEN_HEADER


class ReverifyMode(str, Enum):
    """Whether ``/verify`` can be run again on a stored rollout without its session."""

    STATELESS = "stateless"
    UNSUPPORTED = "unsupported"
    UNKNOWN = "unknown"


class BaseResourcesServerConfig(BaseRunServerInstanceConfig):
    # Serve the server's own POST /<tool> routes as MCP tools at /mcp; /seed_session then mints the token.
    expose_tools_over_mcp: bool = False
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.UNKNOWN


class BaseRunRequest(BaseModel):
    """One task row: the request for the agent plus whatever the environment needs to seed and verify."""

    # Its validator, and its subclasses', is built on first use: with the Responses types in it, building
    # it at import was about 0.4 s of a worker's start-up CPU, for a /verify that may come much later.
    model_config = ConfigDict(extra="allow", defer_build=True)

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming


class BaseSeedSessionRequest(BaseModel):
    """The task row a rollout starts from; environments read the fields they need."""

    model_config = ConfigDict(extra="allow")


class BaseSeedSessionResponse(BaseModel):
    model_config = ConfigDict(extra="allow")


class BaseVerifyRequest(BaseRunRequest):
    """The task row, plus the request that was sent to the agent and the agent's final response."""

    response: NeMoGymResponse


class BaseVerifyResponse(BaseVerifyRequest):
    reward: float


class BaseMultiRewardVerifyResponse(BaseVerifyResponse):
    """``reward`` is the single number; ``reward_components`` the objectives it was made from."""

    reward_components: dict[str, float]


class SimpleResourcesServer(AggregateMetricsMixin, SimpleServer):
    """Subclass it, keep state per ``request.session["session_id"]``, add ``POST /<tool>`` routes."""

    config: BaseResourcesServerConfig
    route_sessions: ClassVar[bool] = True
    session_end_paths: ClassVar[frozenset[str]] = frozenset({"/verify"})
    session_start_paths: ClassVar[frozenset[str]] = frozenset({"/seed_session"})

    # The /mcp endpoint, when the config exposes the tools over MCP.
    _mcp_endpoint: McpToolEndpoint | None = PrivateAttr(None)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/seed_session")(self.seed_session)
        # A JudgeError in verify is a row with reward 0.0 marked judge_failed, not a 500.
        app.post("/verify")(judge_failsafe(self.verify))
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        app.get("/reverify_mode")(self.get_reverify_mode)
        # --- MCP exposure: the /mcp endpoint and the token in /seed_session replies. A name of
        # nemo_gym.mcp_tools loads its module on first use, so a server that exposes no tools loads no mcp SDK.
        if self.config.expose_tools_over_mcp:
            self._mcp_endpoint = mcp_tools.expose_tools(self, app)
        return app

    def mcp_tool_routes(self, app: FastAPI) -> list[BaseRoute]:
        """The routes served as MCP tools when ``expose_tools_over_mcp`` is on.

        By default every route the server registered except ``GET /`` and the framework's
        ``seed_session``, ``verify`` and ``aggregate_metrics``. Override it to leave routes out or to
        pick a few. Each route returned must be a ``POST /<name>`` whose input is one pydantic body (the
        tool's input schema; its docstring is the description), or the server fails at start-up.
        """
        return mcp_tools.default_tool_routes(app)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        if self._mcp_endpoint is None:
            async with super().lifespan(app):
                yield
            return
        # All routes are registered by now; one that cannot be a tool stops the start-up, named.
        self._mcp_endpoint.serve(app, self.mcp_tool_routes(app))
        # The endpoint runs before the base lifespan opens the private socket, and stops after it closes.
        async with self._mcp_endpoint.run(), super().lifespan(app):
            yield
        # --- end of MCP exposure

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        """Upstream's signature: the row alone. An override may take ``request`` first to reach its session."""
        return BaseSeedSessionResponse()

    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        raise NotImplementedError

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return compute_aggregate_metrics(body.verify_responses, self.compute_metrics, self.get_key_metrics)

    async def get_reverify_mode(self) -> ReverifyMode:
        return self.config.REVERIFY_MODE
