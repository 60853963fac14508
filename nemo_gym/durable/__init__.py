"""Durable sessions: per-session state that outlives the worker holding it, and a restart.

- ``store``: the ``SessionStore`` protocol every store implements, and the choice of one by its location.
- ``sqlite_store``: the SQLite file (WAL) that every worker of an instance on a host writes its sessions' state to.
- ``postgresql_store``: the PostgreSQL database that the workers of every replica, on any host, share.
- ``lease``: owner leases in a shared store: who may adopt a session of another host's worker, and fencing.
- ``states``: how a server declares its per-session state (``SessionStates``, or its own export/restore).
- ``applied``: the requests that changed a session, remembered in its row with its state (never applied twice).
- ``keeper``: one worker's side: write a session's state when it changed, and hold what it takes over.
- ``write_through``: the middleware that writes each changed session before the reply starts.
- ``adoption``: every way a session is taken over from the store (a dead owner's, a restored row, an idle orphan), and the router's lost-session policy: adopt it, or 410.
- ``replies``: what a durable worker answers in place of the app: a replayed reply, a 409, and its refusals (503s, 500).
- ``transfer``: the file ``gym sessions export`` writes and ``gym sessions restore`` loads.
- ``checkpoint``: the gate a host's workers share, which a checkpoint drains and pauses.
- ``checkpoint_admin``: the checkpoint's endpoints, which ``gym sessions checkpoint`` calls on every replica.
"""
