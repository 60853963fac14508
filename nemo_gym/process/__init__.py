"""How one server instance runs: its process (``run``), the launcher that starts every instance, and the head endpoint."""
