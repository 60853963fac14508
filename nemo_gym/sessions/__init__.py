"""A request's session: its signed cookie (``cookie``), the MCP session token (``token``) and the secret that signs both (``secret``)."""
