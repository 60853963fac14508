# The task repositories hold failing tests on purpose; they run in sandboxes, never in this project's suite.
collect_ignore = ["tasks"]
