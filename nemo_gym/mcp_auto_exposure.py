"""Upstream's ``maybe_auto_expose(server, app)``: the tools a resources server serves over MCP, by name.

Here a server that sets ``expose_tools_over_mcp`` already mounts ``/mcp`` in its own
``setup_webserver`` (nemo_gym.mcp_tools); this call only takes the tool routes now, as upstream's does
once the app is built, so a route that cannot be a tool fails here, named. It mounts nothing twice,
and imports nothing of the MCP SDK until a server that opted in is asked.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi import FastAPI


def maybe_auto_expose(server: Any, app: FastAPI) -> Optional[dict[str, Any]]:
    """None unless the server opted in; else its MCP tools by name (checked, as at start-up)."""
    if not getattr(getattr(server, "config", None), "expose_tools_over_mcp", False):
        return None
    endpoint = getattr(server, "_mcp_endpoint", None)
    if endpoint is None:
        raise ValueError(
            f"{type(server).__name__} sets expose_tools_over_mcp but its app has no /mcp: "
            "build the app with the server's setup_webserver() (SimpleResourcesServer's mounts it)"
        )
    endpoint.serve(app, server.mcp_tool_routes(app))
    return dict(endpoint.tools)
