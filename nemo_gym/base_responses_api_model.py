"""SimpleResponsesAPIModel: the base of model servers (``/v1/responses``, ``/v1/chat/completions``)."""

from __future__ import annotations

from typing import Any

from fastapi import Body, FastAPI, HTTPException, Request

from nemo_gym.config_types import BaseRunServerInstanceConfig
from nemo_gym.openai_types import Response, ResponseCreateParams
from nemo_gym.server import SimpleServer

__all__ = ["BaseResponsesAPIModelConfig", "Body", "SimpleResponsesAPIModel"]


class BaseResponsesAPIModelConfig(BaseRunServerInstanceConfig):
    pass


class SimpleResponsesAPIModel(SimpleServer):
    """Model servers keep no session state."""

    config: BaseResponsesAPIModelConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/v1/responses")(self.responses)
        app.post("/v1/chat/completions")(self.chat_completions)
        return app

    async def responses(self, request: Request, body: ResponseCreateParams) -> Response:
        raise NotImplementedError

    async def chat_completions(self, request: Request, body: dict[str, Any]) -> dict[str, Any]:
        raise HTTPException(501, f"{self.name} serves the Responses API only (POST /v1/responses)")
