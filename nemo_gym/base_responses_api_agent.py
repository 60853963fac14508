"""SimpleResponsesAPIAgent: the base of agents (``/v1/responses``, ``/run``, ``/aggregate_metrics``)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar

import aiohttp
from fastapi import Body, FastAPI, HTTPException, Request, Response as HTTPResponse

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.config_types import (
    ROLLOUT_PATH_PREFIX,
    TOKEN_CAPTURE_PATH_SEGMENT,
    AggregateMetrics,
    AggregateMetricsRequest,
    BaseRunServerInstanceConfig,
)
from nemo_gym.global_config import OBSERVABILITY_ENABLED_KEY_NAME, TOKEN_ID_CAPTURE_BLOCK
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParams, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.reward_profile import AggregateMetricsMixin, compute_aggregate_metrics
from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body, rollout_context
from nemo_gym.response_stream import answer
from nemo_gym.server import SimpleServer
from nemo_gym.server_utils import apply_rollout_prefix, get_first_server_config_dict, get_response_json, rollout_path_prefix
from nemo_gym.sessions.cookie import NEW_SESSION_SCOPE_KEY, session_cookie_name

__all__ = ["BaseResponsesAPIAgentConfig", "BaseRunRequest", "Body", "SimpleResponsesAPIAgent"]

class BaseResponsesAPIAgentConfig(BaseRunServerInstanceConfig):
    skip_verification: bool = False
    skip_verification_reward: float = 0.0
    token_id_capture: bool = False


class SimpleResponsesAPIAgent(AggregateMetricsMixin, SimpleServer):
    config: BaseResponsesAPIAgentConfig
    route_sessions: ClassVar[bool] = True
    session_start_paths: ClassVar[frozenset[str]] = frozenset({"/run"})

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        answer = self.responses_route()
        app.post("/v1/responses", response_model=None)(answer)
        app.post(f"/{ROLLOUT_PATH_PREFIX}/{{rollout_id}}/v1/responses", response_model=None)(answer)
        app.post(f"/{ROLLOUT_PATH_PREFIX}/{{rollout_id}}/{TOKEN_CAPTURE_PATH_SEGMENT}/v1/responses", response_model=None)(answer)
        app.post("/run")(self._run_in_rollout_context())
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        return app

    def _run_in_rollout_context(self) -> Callable[..., Awaitable[Any]]:
        """``run``, inside ``rollout_context`` of the row's rollout id (``current_rollout_id()`` for its calls)."""
        run = self.run

        @functools.wraps(run)
        async def run_in_context(*args: Any, **kwargs: Any) -> Any:
            body = kwargs.get("body", next((arg for arg in args if isinstance(arg, BaseRunRequest)), None))
            with rollout_context(self.rollout_id_from_run(body)):
                return await run(*args, **kwargs)

        return run_in_context

    def responses_route(self) -> Any:
        """What serves ``/v1/responses``: ``answer_responses`` (JSON or events) for a ``responses(request,
        response, body)`` of the base's shape; else, as upstream registers it, the agent's own ``responses``,
        whose parameters FastAPI reads (upstream's aviary_agent takes its own run request there)."""
        try:
            parameters = inspect.signature(self.responses, eval_str=True).parameters
        except NameError:
            return self.answer_responses
        body = parameters.get("body")
        base_shaped = set(parameters) <= {"request", "response", "body"} and body is not None
        if base_shaped and isinstance(body.annotation, type) and issubclass(body.annotation, NeMoGymResponseCreateParamsNonStreaming):
            return self.answer_responses
        return self.responses

    async def answer_responses(self, request: Request, response: HTTPResponse, body: NeMoGymResponseCreateParams) -> HTTPResponse:
        """The response ``responses`` makes, as JSON or as events, with the cookies ``responses`` set."""
        reply = await answer(self.responses, {"request": request, "response": response, "body": body.non_streaming()}, body.stream)
        reply.raw_headers.extend(header for header in response.raw_headers if header[0] == b"set-cookie")
        return reply

    async def responses(
        self, request: Request, response: HTTPResponse, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        raise NotImplementedError

    async def run(self, request: Request, response: HTTPResponse, body: BaseRunRequest) -> dict[str, Any]:
        raise NotImplementedError

    async def close_session(self, request: Request) -> dict[str, Any]:
        """Close the agent's session and, with it, the session of each resources server whose cookie the request
        carries (the rollout's environment: its sandbox goes now, not after idling). Idempotent, as each close is.
        ``resources_servers`` gives each one's status ("closed", "already closed", or the status code of a failure)."""
        closed: dict[str, Any] = {}
        for name in self.resources_servers_in(request.cookies):
            cookie = session_cookie_name(name)
            reply = await self.server_client.post(name, "/close_session", cookies={cookie: request.cookies[cookie]})
            closed[name] = (await get_response_json(reply)).get("status") if reply.ok else reply.status
        if NEW_SESSION_SCOPE_KEY in request.scope and closed:
            return {"status": "no agent session", "resources_servers": closed}
        return {**await super().close_session(request), "resources_servers": closed}

    def resources_servers_in(self, cookies: Mapping[str, str]) -> list[str]:
        """The resources servers of the running config whose session cookie is among ``cookies``."""
        return [
            name
            for name, instance in self.instances.items()
            if instance.server_type == "resources_servers" and session_cookie_name(name) in cookies
        ]

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        if self.config.skip_verification:
            return AggregateMetrics()
        return compute_aggregate_metrics(body.verify_responses, self.compute_metrics, self.get_key_metrics)

    def _model_call_capture_enabled(self) -> bool:
        """Whether the run captures model calls for evaluation (global ``observability_enabled``)."""
        return bool(self._global_setting(OBSERVABILITY_ENABLED_KEY_NAME))

    def _token_id_capture_enabled(self) -> bool:
        """Whether this agent takes part in training token capture: the run's ``token_id_capture.enabled``,
        and either its ``all_agents`` or this agent's own ``token_id_capture``."""
        block = self._global_setting(TOKEN_ID_CAPTURE_BLOCK)
        if not isinstance(block, Mapping) or not block.get("enabled"):
            return False
        return bool(block.get("all_agents") or self.config.token_id_capture)

    def _global_setting(self, key: str) -> Any:
        global_config = getattr(self.server_client, "global_config_dict", None)
        return global_config.get(key) if isinstance(global_config, Mapping) else None

    def rollout_id_from_run(self, body: Any) -> str | None:
        """The rollout id a ``/run`` row's calls go under: None unless a capture is on (see above)."""
        if not (self._model_call_capture_enabled() or self._token_id_capture_enabled()):
            return None
        return maybe_rollout_id_from_run_body(body)

    def url_path_for_run(self, path: str, body: Any) -> str:
        """``path`` under the row's rollout prefix (``/ng-rollout/<id>[/training-token-capture]``), if it has one."""
        rollout_id = self.rollout_id_from_run(body)
        return rollout_path_prefix(rollout_id, token_capture=self._token_id_capture_enabled()) + path

    def base_url_for_run(self, base_url: str, body: BaseRunRequest) -> str:
        """A model server's root URL with this run's rollout prefix (and token capture segment) after it;
        the API version (``/v1``) goes after this, as upstream's."""
        return apply_rollout_prefix(base_url, self.rollout_id_from_run(body), token_capture=self._token_id_capture_enabled())

    def resolve_model_base_url(self, model_server_name: str, rollout_id: str | None = None) -> str:
        """The OpenAI-compatible base URL (``.../v1``) of a model server, under ``rollout_id``'s prefix if given."""
        settings = get_first_server_config_dict(self.server_client.global_config_dict, model_server_name)
        base_url = self.server_client._build_server_base_url(settings)
        return f"{apply_rollout_prefix(base_url, rollout_id, token_capture=self._token_id_capture_enabled())}/v1"

    @staticmethod
    def url_path_for_request(path: str, request: Request | None) -> str:
        """``path`` under the rollout prefix (and capture segment) the request came in on, if any."""
        path_params = getattr(request, "path_params", None)
        rollout_id = path_params.get("rollout_id") if isinstance(path_params, Mapping) else None
        token_capture = f"/{TOKEN_CAPTURE_PATH_SEGMENT}/" in getattr(getattr(request, "url", None), "path", "")
        return rollout_path_prefix(rollout_id, token_capture=token_capture) + path


async def checked_json(reply: aiohttp.ClientResponse, what: str) -> Any:
    """The JSON body of another server's reply. A failed hop is passed on to the caller: a client error
    keeps its status (a lost session stays a 410), any other failure is a 502."""
    if reply.ok:
        return await get_response_json(reply)
    status = reply.status if 400 <= reply.status < 500 else 502
    raise HTTPException(status, f"{what} answered {reply.status}: {await reply.text(errors='replace')}")


def cookies_of(reply: aiohttp.ClientResponse) -> dict[str, str]:
    """The cookies a reply set, by name."""
    return {name: morsel.value for name, morsel in reply.cookies.items()}


def set_cookies(response: HTTPResponse, cookies: Mapping[str, str]) -> None:
    """Hand the cookies of every server a session touched back to the caller."""
    for name, value in cookies.items():
        response.set_cookie(name, value, httponly=True, samesite="lax")
