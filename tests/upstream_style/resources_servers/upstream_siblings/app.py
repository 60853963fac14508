"""A resources server whose app imports a module of its own directory bare, as upstream's servers do
(``import util``, ``from scorer import ...``): upstream starts a server with its directory on sys.path."""

from fastapi import FastAPI
from pydantic import BaseModel

import scorer
from scorer import score

from nemo_gym.base_resources_server import BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer


class UpstreamSiblingsConfig(BaseResourcesServerConfig):
    pass


class ScoreRequest(BaseModel):
    answer: str
    expected: str


class ScoreResponse(BaseModel):
    reward: float
    scorer_file: str


class UpstreamSiblingsServer(SimpleResourcesServer):
    config: UpstreamSiblingsConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/score")(self.score)
        return app

    async def score(self, body: ScoreRequest) -> ScoreResponse:
        return ScoreResponse(reward=score(body.answer, body.expected), scorer_file=scorer.__file__)

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=0.0)


if __name__ == "__main__":
    UpstreamSiblingsServer.run_webserver()
