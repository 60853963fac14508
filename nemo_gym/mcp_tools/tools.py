"""Which of a server's routes are MCP tools, and the start-up check that each can be dispatched faithfully.

A tool is a ``POST /<name>`` whose only input is one pydantic body: the body's JSON schema is the
tool's input schema and the handler's docstring its description.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, params
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from mcp.shared.tool_name_validation import validate_tool_name
from pydantic import BaseModel
from starlette.routing import BaseRoute, Route

# The framework's routes, never the policy's tools (closing its session is the harness's call, not the model's).
NEVER_TOOLS = frozenset({"seed_session", "verify", "aggregate_metrics", "reverify_mode", "mcp", "close_session"})


class McpToolRouteError(RuntimeError):
    """A route chosen as an MCP tool that a tool call cannot reach exactly as an HTTP call would."""


@dataclass(frozen=True)
class ToolRoute:
    """One route served as an MCP tool: the tool's name is the route's path without its slash."""

    name: str
    path: str
    description: str
    input_schema: dict[str, Any]


def default_tool_routes(app: FastAPI) -> list[BaseRoute]:
    """Every HTTP route the server registered, except ``/``, FastAPI's docs, and the never-tools."""
    docs = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url}
    chosen = []
    for route in app.routes:
        if not isinstance(route, Route) or route.path == "/" or route.path in docs:
            continue
        if route.path.strip("/").split("/")[0] in NEVER_TOOLS:
            continue
        chosen.append(route)
    return chosen


def tool_route(route: BaseRoute, server_name: str) -> ToolRoute:
    """Check that a route can be dispatched faithfully as a tool, and describe it; else say why not."""
    path = getattr(route, "path", repr(route))
    methods = sorted(getattr(route, "methods", None) or [])
    where = f"{', '.join(methods) or 'route'} {path}"

    def refuse(why: str) -> McpToolRouteError:
        return McpToolRouteError(
            f"{server_name}: {where} cannot be served as an MCP tool: {why}. "
            "Leave it out by overriding SimpleResourcesServer.mcp_tool_routes, or change the route."
        )

    if not isinstance(route, APIRoute):
        raise refuse("it is not a FastAPI route, so it has no request model to take the tool's arguments")
    name = path[1:]
    if name in NEVER_TOOLS:
        raise refuse(f"{', '.join(sorted(NEVER_TOOLS))} are never tools")
    if route.param_convertors:
        raise refuse(f"it has path parameters ({', '.join(route.param_convertors)}), which a tool call has no place for")
    if "/" in name or not validate_tool_name(name).is_valid:
        raise refuse("its path must be one segment, '/<tool name>', of letters, digits, '_', '-' or '.'")
    if methods != ["POST"]:
        raise refuse(f"it answers {', '.join(methods)}, and a tool call is dispatched as one POST")
    dependants = _all_dependants(route.dependant)
    for kind in ("query", "header", "cookie"):
        names = [field.alias for dependant in dependants for field in getattr(dependant, f"{kind}_params")]
        if names:
            raise refuse(f"it takes {kind} parameters ({', '.join(names)}), which a tool's arguments cannot carry")
    bodies = {field.name: field for dependant in dependants for field in dependant.body_params}
    if not bodies:
        schema: dict[str, Any] = {"type": "object", "properties": {}}
    else:
        (field, *others) = bodies.values()
        model = field.field_info.annotation
        if others:
            raise refuse(f"its body is split over several parameters ({', '.join(bodies)}), not one pydantic model")
        if isinstance(field.field_info, params.Form):
            raise refuse("its body is a form, not a JSON pydantic model")
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise refuse(f"its body parameter {field.name!r} is {model!r}, not a pydantic model")
        if getattr(field.field_info, "embed", False):
            raise refuse(f"its body is embedded under {field.alias!r}, so the arguments would not be the model")
        schema = model.model_json_schema()
        if schema.get("type") != "object":
            raise refuse(f"its request model {model.__name__} is not a JSON object, and tool arguments are one")
    description = route.description or route.summary or f"POST {path} on {server_name}."
    return ToolRoute(name=name, path=path, description=description, input_schema=schema)


def _all_dependants(dependant: Dependant) -> list[Dependant]:
    found = [dependant]
    for sub in dependant.dependencies:
        found.extend(_all_dependants(sub))
    return found
