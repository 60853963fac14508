"""The wire: uvicorn's HTTP protocol as every listener of a server speaks it (``input_limits``: the limits on
request heads and slow clients, on the public port, the siblings' private sockets and a replica's forwarding
port; the transports add their own admission on top, ``nemo_gym.routing.transport``)."""
