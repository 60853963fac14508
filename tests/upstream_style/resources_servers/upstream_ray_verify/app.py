"""A resources server in upstream NeMo Gym's style whose /verify checks the answer in a Ray task, as
upstream's code_gen and evalplus do: the checker is an ``@ray.remote`` function of a package next to
the app (imported bare), ``SPREAD`` over the cluster's nodes, awaited with ``ray.get`` in an executor.
A session seeds a product to compute; /verify scores the response's text against it and says which
Ray node checked it."""

from asyncio import get_running_loop
from typing import Dict

import ray
from fastapi import Request
from pydantic import Field
from ray_checks.remote import check_answer_remote

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY


class UpstreamRayVerifyConfig(BaseResourcesServerConfig):
    pass


class ProductSeedSessionRequest(BaseSeedSessionRequest):
    a: int
    b: int


class ProductVerifyResponse(BaseVerifyResponse):
    expected: int
    checked_on_node: str


class UpstreamRayVerifyServer(SimpleResourcesServer):
    config: UpstreamRayVerifyConfig
    session_id_to_product: Dict[str, int] = Field(default_factory=dict)

    async def seed_session(self, request: Request, body: ProductSeedSessionRequest) -> BaseSeedSessionResponse:
        self.session_id_to_product[request.session[SESSION_ID_KEY]] = body.a * body.b
        return BaseSeedSessionResponse()

    async def verify(self, request: Request, body: BaseVerifyRequest) -> ProductVerifyResponse:
        expected = self.session_id_to_product[request.session[SESSION_ID_KEY]]
        future = check_answer_remote.remote(body.response.output_text, expected)
        result = await get_running_loop().run_in_executor(None, ray.get, future)
        return ProductVerifyResponse(
            **body.model_dump(), reward=1.0 if result["correct"] else 0.0, expected=expected, checked_on_node=result["node_id"]
        )


if __name__ == "__main__":
    UpstreamRayVerifyServer.run_webserver()
