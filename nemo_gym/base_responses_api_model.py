"""SimpleResponsesAPIModel: the base of model servers, which answer ``POST /v1/responses``."""

from __future__ import annotations

from fastapi import FastAPI, Request

from nemo_gym.openai_types import Response, ResponseCreateParams
from nemo_gym.server import SimpleServer


class SimpleResponsesAPIModel(SimpleServer):
    """Model servers keep no session state."""

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/v1/responses")(self.responses)
        return app

    async def responses(self, request: Request, body: ResponseCreateParams) -> Response:
        raise NotImplementedError
