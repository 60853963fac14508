"""How server instances run: one instance's process (``run``), finding and checking its server (``discovery``), the
launcher that starts every instance, and the head endpoint."""
