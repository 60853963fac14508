"""The ASGI middlewares every server has: body limit, input limits, strict JSON, errors as JSON, cancel on disconnect."""
