"""Import each module of a package alone, each in a process forked from one that holds none of the package.

Run as ``python -c "$(cat import_alone.py)" PACKAGE ENTRY...`` (an entry ``MODULE``, or ``MODULE:NAME,NAME`` for
``from MODULE import NAME, NAME``) from the directory the package lives in
(so that directory, not this file's, is first on ``sys.path``). A fresh interpreter per module paid the
import of every third-party library again for each (seconds each, 150 modules); here a parent imports
them once, the third-party modules that importing the whole package loads (listed by a throwaway child),
and with no module of the package loaded forks a child per module that imports that module alone.
What the package does to itself on import (a circle between two of its modules) is seen as in a fresh
interpreter: no module of it is loaded before the one imported.

Prints one JSON object: each module that failed, with the last line of its error. ``imports_alone`` runs it.
"""

import importlib
import json
import os
import select
import subprocess
import sys
import traceback
from pathlib import Path

CHILD_SECONDS = 120
RUN_SECONDS = 600


def imports_alone(root: Path, package: str, modules: list[str]) -> dict[str, str]:
    """Each of ``modules`` (of ``package``, under ``root``; ``MODULE`` or ``MODULE:NAME,NAME``) that fails to import
    alone, with its error's last line."""
    command = [sys.executable, "-c", Path(__file__).read_text(), package, *modules]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=RUN_SECONDS)
    if result.returncode != 0:
        raise RuntimeError(f"{command[3:]} exited with {result.returncode}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def fork(work) -> tuple[int, int]:
    """Run ``work()`` in a forked child; its PID, and the pipe it writes its error (or what ``work`` returned) to."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        status, said = 0, ""
        try:
            said = work() or ""
        except BaseException:
            status, said = 1, traceback.format_exc().strip().splitlines()[-1]
        os.write(write, said.encode())
        os._exit(status)
    os.close(write)
    return pid, read


def collect(pid: int, read: int, timeout: float = CHILD_SECONDS) -> tuple[int, str]:
    """A forked child's exit status (0 when its work returned) and what it wrote; killed after ``timeout`` seconds."""
    chunks = []
    while select.select([read], [], [], timeout)[0]:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    else:
        os.kill(pid, 9)
        chunks.append(f"no answer within {timeout} s".encode())
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode(errors="replace")


def third_party(package: str, modules: list[str]) -> list[str]:
    """The modules outside ``package`` that importing every module of it loads, in the order they were loaded."""

    def load_all() -> str:
        before = set(sys.modules)
        for module in modules:
            try:
                importlib.import_module(module)
            except BaseException:
                pass
        outside = [name for name in sys.modules if name not in before and name.split(".")[0] != package]
        return json.dumps(outside)

    _, said = collect(*fork(load_all))
    return json.loads(said or "[]")


def import_one(entry: str) -> None:
    """``MODULE``: ``import MODULE``; ``MODULE:NAME,NAME``: ``from MODULE import NAME, NAME``."""
    module, _, names = entry.partition(":")
    if names:
        exec(f"from {module} import {', '.join(names.split(','))}", {})
    else:
        importlib.import_module(module)


def main(package: str, modules: list[str]) -> dict[str, str]:
    for name in third_party(package, [entry.partition(":")[0] for entry in modules]):
        try:
            importlib.import_module(name)
        except BaseException:
            pass
    loaded = sorted(name for name in sys.modules if name.split(".")[0] == package)
    if loaded:
        return {"(parent)": f"the parent loaded modules of {package}: {loaded}"}
    # As many children at once as there are cores.
    running: dict[str, tuple[int, int]] = {}
    failed = {}
    for number, module in enumerate(modules):
        running[module] = fork(lambda: import_one(module))
        while running and (len(running) >= (os.cpu_count() or 2) or number == len(modules) - 1):
            oldest = next(iter(running))
            code, error = collect(*running.pop(oldest))
            if code != 0:
                failed[oldest] = error or f"exit status {code}"
    return failed


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
