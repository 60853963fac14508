"""legacy_agent: accept ``/run`` (and ``/v1/responses``) from older callers and relay it to a configured downstream agent.

The caller's cookies go down with the request and the downstream's ``Set-Cookie`` come back up, so
the session chain (relay -> agent -> resources server) holds through the extra hop.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from fastapi import HTTPException, Request, Response as HTTPResponse

from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    BaseRunRequest,
    SimpleResponsesAPIAgent,
    checked_json,
    cookies_of,
    set_cookies,
)
from nemo_gym.config_types import AgentServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming


class LegacyAgentConfig(BaseResponsesAPIAgentConfig):
    downstream_agent: AgentServerRef


class LegacyAgent(SimpleResponsesAPIAgent):
    config: LegacyAgentConfig
    # The relay keeps no state of its own: any worker can relay any request.
    route_sessions = False

    async def run(self, request: Request, response: HTTPResponse, body: BaseRunRequest) -> dict[str, Any]:
        return await self.relay("/run", await request.json(), request, response)

    async def responses(
        self, request: Request, response: HTTPResponse, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        # The request as validated, so a caller's stream: true (answered here) does not go down.
        relayed = await self.relay("/v1/responses", body.model_dump(mode="json", by_alias=True, exclude_unset=True), request, response)
        return NeMoGymResponse.model_validate(relayed)

    async def relay(self, path: str, payload: Any, request: Request, response: HTTPResponse) -> Any:
        """Send ``payload`` with the caller's cookies downstream; hand back its body and its cookies."""
        downstream = self.config.downstream_agent.name
        try:
            reply = await self.server_client.post(downstream, path, json=payload, cookies=dict(request.cookies))
        except aiohttp.ClientError as error:
            raise HTTPException(502, f"{downstream}{path} is unreachable: {error}") from None
        body = await checked_json(reply, f"{downstream}{path}")
        set_cookies(response, cookies_of(reply))
        return body


if __name__ == "__main__":
    LegacyAgent.run_webserver()
