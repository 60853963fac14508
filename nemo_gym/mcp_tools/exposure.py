"""The wiring of MCP exposure into one resources server's app: ``/mcp``, and the token in its seed replies.

Only a server whose config sets ``expose_tools_over_mcp`` imports this module, and with it the ``mcp`` SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from nemo_gym.mcp_tools.endpoint import McpToolEndpoint
from nemo_gym.mcp_tools.seed_metadata import SeedSessionMcpMetadata
from nemo_gym.sessions.token import mint_token

if TYPE_CHECKING:
    from nemo_gym.base_resources_server import SimpleResourcesServer


def expose_tools(server: SimpleResourcesServer, app: FastAPI) -> McpToolEndpoint:
    """Mount the server's ``/mcp`` endpoint on its app, and make its ``/seed_session`` replies carry the token.

    The tools are chosen and checked later, in the lifespan (``McpToolEndpoint.serve``), once every route exists.
    """
    serializer = server.tokens
    endpoint = McpToolEndpoint(server.name, serializer, server.session_cookie, server.config.host)
    endpoint.mount(app)
    # Added here, before build_app's session middlewares, so it sits inside them and sees the session.
    app.add_middleware(
        SeedSessionMcpMetadata,
        server_name=server.name,
        mint=lambda session_id: mint_token(serializer, session_id, server.worker_id, server.replica_keys),
    )
    return endpoint
