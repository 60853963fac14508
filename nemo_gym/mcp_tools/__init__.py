"""A resources server's own ``POST /<tool>`` routes, served as MCP tools at ``/mcp``."""
