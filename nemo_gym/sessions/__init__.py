"""A request's session: its signed cookie (``cookie``, with the cookie's age), the MCP session token (``token``),
the secret that signs both (``secret``), the worker that owns it (``worker``: the owner key and worker IDs), and
what a request gets when its session is gone or cannot be served now (``replies``: 410, and 503 with Retry-After)."""
