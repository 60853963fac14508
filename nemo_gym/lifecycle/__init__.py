"""Session lifecycle: when a session ends (verify, close, idle, expiry, conflict), the hook that tears it down,
the 410 that its later requests get, and the caps on how many sessions an instance holds (docs/lifecycle.md)."""
