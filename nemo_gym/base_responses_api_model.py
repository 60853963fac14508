"""SimpleResponsesAPIModel: the base of model servers (``/v1/responses``, ``/v1/chat/completions``)."""

from __future__ import annotations

from typing import Any

from fastapi import Body, FastAPI, HTTPException, Request
from starlette.responses import Response as HTTPResponse

from nemo_gym.config_types import BaseRunServerInstanceConfig
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParams, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.response_stream import answer
from nemo_gym.rollout_correlation import RolloutContextMiddleware
from nemo_gym.server import SimpleServer

__all__ = ["BaseResponsesAPIModelConfig", "Body", "SimpleResponsesAPIModel"]


class BaseResponsesAPIModelConfig(BaseRunServerInstanceConfig):
    pass


class SimpleResponsesAPIModel(SimpleServer):
    """Model servers keep no session state. Subclasses implement ``responses``."""

    config: BaseResponsesAPIModelConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        # Agents that capture model calls call ``/ng-rollout/<id>[/training-token-capture]/v1/...``.
        app.add_middleware(RolloutContextMiddleware, strip_token_capture=True)
        app.post("/v1/responses", response_model=None)(self.answer_responses)
        app.post("/v1/chat/completions")(self.chat_completions)
        return app

    async def answer_responses(self, request: Request, body: NeMoGymResponseCreateParams) -> HTTPResponse:
        """The response ``responses`` makes, as JSON, or as Responses API events when the request asks to stream."""
        return await answer(self.responses, {"request": request, "body": body.non_streaming()}, body.stream)

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        raise NotImplementedError

    async def chat_completions(self, request: Request, body: dict[str, Any]) -> dict[str, Any]:
        raise HTTPException(501, f"{self.name} serves the Responses API only (POST /v1/responses)")
