"""Session routing: every request of a session reaches the uvicorn worker that holds its state.

- ``worker``: who this worker is, and where each worker's private socket lives.
- ``owner``: reading the owner worker out of a signed session cookie or MCP session token.
- ``private_server``: this worker's app served again on its own Unix socket.
- ``forwarder``: sending a request to the owner's socket and streaming the reply back.
- ``router``: the ASGI middleware that decides, per request, local or forward (or 410).
"""
