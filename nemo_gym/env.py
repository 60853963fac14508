"""The launcher-to-process contract: every environment variable the launcher (or uvicorn's supervisor) sets for a
server process, and the defaults both sides share."""

from __future__ import annotations

DEFAULT_HOST = "127.0.0.1"
# The head endpoint's port (upstream's DEFAULT_HEAD_SERVER_PORT).
DEFAULT_HEAD_PORT = 11000

# What the launcher runs for each instance: ``python -m SERVER_PROCESS_MODULE``.
SERVER_PROCESS_MODULE = "nemo_gym.process.run"

# Set by the launcher for every process it starts.
CONFIG_PATH_ENV = "NEMO_GYM_CONFIG_PATH"  # the resolved config, a JSON file
INSTANCE_ENV = "NEMO_GYM_INSTANCE"  # the instance this process serves
HEAD_PORT_ENV = "NEMO_GYM_HEAD_PORT"
# The launcher's PID: the process dies with it (nemo_gym/process/parent.py).
PARENT_PID_ENV = "NEMO_GYM_PARENT_PID"
EXTRA_ROOTS_ENV = "NEMO_GYM_EXTRA_ROOTS"  # search roots for server code, joined by os.pathsep
# Where each worker of a multi-worker server writes its output, to a file of its own (the launcher's logs).
WORKER_LOG_DIR_ENV = "NEMO_GYM_WORKER_LOG_DIR"
# A multi-worker server's socket directory: its workers' private sockets, life names and placement counters.
SOCKET_DIR_ENV = "NEMO_GYM_SOCKET_DIR"
# A replica's forwarding port (a replica set's), chosen and held by the server's main process for its workers.
FORWARD_PORT_ENV = "NEMO_GYM_FORWARD_PORT"
# Where state that outlives a restart is kept (signing secrets, durable sessions); set by the user or a test.
STATE_DIR_ENV = "NEMO_GYM_STATE_DIR"

# Upstream's names, set in each worker of a multi-worker server (``is_nemo_gym_fastapi_entrypoint``).
WORKER_ENV = "IS_NEMO_GYM_FASTAPI_WORKER"
ENTRYPOINT_ENV = "IS_NEMO_GYM_FASTAPI_ENTRYPOINT"
NUM_WORKERS_ENV = "NEMO_GYM_FASTAPI_NUM_WORKERS"
