"""SimpleResponsesAPIModel: the base of model servers, which answer ``POST /v1/responses``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response as HTTPResponse

from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParams, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.response_stream import response_reply
from nemo_gym.server import SimpleServer


class SimpleResponsesAPIModel(SimpleServer):
    """Model servers keep no session state. Subclasses implement ``responses``."""

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/v1/responses", response_model=None)(self.answer_responses)
        return app

    async def answer_responses(self, request: Request, body: NeMoGymResponseCreateParams) -> HTTPResponse:
        """The response ``responses`` makes, as JSON, or as Responses API events when the request asks to stream."""
        return response_reply(await self.responses(request, body.non_streaming()), body.stream)

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        raise NotImplementedError
