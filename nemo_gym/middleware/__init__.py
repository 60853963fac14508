"""The ASGI middlewares every server has: body limit, strict JSON, errors as JSON, cancel on disconnect."""
