"""A resources server's own ``POST /<tool>`` routes, served as MCP tools at ``/mcp``.

CLI harnesses in sandboxes keep only the session token minted at ``/seed_session`` and send it in the
``X-NeMo-Gym-Session-Token`` header. This package is everything between that header and the handler:

- ``tools``: which routes are tools, and the start-up check that each can be dispatched faithfully;
- ``endpoint``: ``/mcp``, the official SDK's low-level server over stateless streamable HTTP with JSON
  replies; a tool call is refused without a valid token;
- ``dispatch``: a tool call run in-process through the app's own router as ``POST /<name>`` carrying
  the token's session, so validation and the handler run once, exactly as over HTTP;
- ``seed_metadata``: the ``mcp`` block added to every successful ``/seed_session`` reply;
- ``exposure``: the wiring of these into a server's app.

Each name below loads its module on first use: only a server that exposes its tools loads the ``mcp``
SDK. Routing the token to the worker that owns the session is the router's job (``nemo_gym.routing``),
which runs before any of this.
"""

from __future__ import annotations

import importlib
from typing import Any

from nemo_gym.sessions.token import MCP_PATH

# The key of the MCP metadata in a /seed_session reply (upstream's NEMO_GYM_MCP_METADATA_KEY).
MCP_METADATA_KEY = "mcp"

_EXPORTS = {
    "nemo_gym.mcp_tools.tools": ["NEVER_TOOLS", "McpToolRouteError", "ToolRoute", "default_tool_routes", "tool_route"],
    "nemo_gym.mcp_tools.endpoint": ["LOOPBACK_HOSTS", "McpToolEndpoint", "error_result", "security_settings"],
    "nemo_gym.mcp_tools.dispatch": ["dispatch"],
    "nemo_gym.mcp_tools.seed_metadata": ["SEED_SESSION_PATH", "SeedSessionMcpMetadata", "mcp_metadata"],
    "nemo_gym.mcp_tools.exposure": ["expose_tools"],
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(["MCP_METADATA_KEY", "MCP_PATH", *_HOMES])


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'nemo_gym.mcp_tools' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
