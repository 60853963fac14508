"""The answer check, run as a Ray task on whichever node the SPREAD strategy picks; its runtime_env puts
this server's directory on the worker's path (so ``ray_checks`` imports there), as upstream's code_gen does."""

import sys
from pathlib import Path

import ray

_SERVER_DIR = str(Path(__file__).parent.parent)


@ray.remote(scheduling_strategy="SPREAD", runtime_env={"py_executable": sys.executable, "env_vars": {"PYTHONPATH": _SERVER_DIR}})
def check_answer_remote(answer: str, expected: int) -> dict:
    words = answer.replace(",", " ").split()
    return {"correct": bool(words) and words[-1] == str(expected), "node_id": ray.get_runtime_context().get_node_id()}
