"""Session routing: every request of a session reaches the uvicorn worker that holds its state.

A request crosses these modules top to bottom, and none of them imports ``nemo_gym.durable``:

- ``router``: the ASGI middleware that decides, per request: serve here, start the session where
  ``placement`` says, forward to the owner, or refuse (400); and, when the owner cannot be reached,
  answers for a busy one (503) and does what the lost-session policy says for a dead one.
- ``owner``: reading the owner worker out of a signed session cookie or MCP session token, once.
- ``request_id``: the id (``Idempotency-Key``) a request that may change a session carries on every hop,
  the client's or one the router assigns.
- ``replica``: which replica of a replica set (the same server on several hosts) owns a session.
- ``placement``: where a new session starts (the worker that has started the fewest).
- ``forwarder``: sending a request to its owner through the transport; it raises what went wrong.
- ``hop_tracing``: each forward a span of the request's trace, where OpenTelemetry is set up.
- ``exchange``: one forwarded request: the body streamed up, the reply streamed back as ASGI messages.
- ``relay``: a request for another replica's session taken by the public port's protocol before any layer sees
  it, and relayed as bytes on a kept connection to its owner; anything else it leaves to the router.
- ``early_hand_off``: a request for a sibling's session taken by the public port's protocol before any layer sees
  it, its connection handed to its owner then; one the owner refuses goes on to the router.
- ``to_holder``: a request whose MCP token names a worker that no longer holds its session (another host
  took it over while that worker's lease was lapsed) is sent on to the holder the store names.
- ``lost``: the ``LostSessionPolicy`` seam (serve here, forward to another owner, or reply), and the
  in-memory policy: a dead owner's session is lost (410). ``nemo_gym.durable.adoption`` is the other.
- ``transport``: the ``Transport`` seam (connect to an owner, is it alive, forget it, serve the
  siblings), and its implementations: private Unix sockets with abstract names between the workers of
  a host (``transport.unix``), and TCP between the replicas of a replica set (``transport.tcp``).
- ``cancel_on_disconnect``: a handler whose caller leaves is cancelled.

The server picks the transport and the policy where it builds its app (``nemo_gym.server``).
"""
