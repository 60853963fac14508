"""One replica on its node: ``python -m nemo_gym.ray_cluster.keeper CONFIG NAME TIMEOUT``, started by its
``ReplicaNode`` actor (nemo_gym/ray_cluster/replicas.py).

A launcher of the one instance ``NAME`` of the config file ``CONFIG`` (that replica's settings), with no
head endpoint: it prints ``ready`` once the server serves, then keeps it until SIGTERM (sent by its
actor, or by the kernel when the actor's process ends: ``PR_SET_PDEATHSIG``) and stops it as the
launcher stops a server: SIGTERM, then its whole process group SIGKILLed. It exits at once if its
server process exits.
"""

from __future__ import annotations

import json
import signal
import sys
import threading

from nemo_gym import config as gym_config
from nemo_gym.process.launcher import LaunchError, Launcher
from nemo_gym.process.parent import follow_parent
from nemo_gym.ray_cluster.replicas import READY


def main(config_path: str, name: str, timeout: float) -> int:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    follow_parent()
    with open(config_path) as file:
        config = json.load(file)
    instances = gym_config.parse(config, check_ports=False)
    settings = {key: value for key, value in config.items() if key != name}
    launcher = Launcher({name: instances[name]}, None, start_timeout=timeout, settings=settings)
    try:
        launcher.start()
    except LaunchError as error:
        print(error, file=sys.stderr)
        return 1
    try:
        print(READY, flush=True)
        process = launcher.processes[name]
        while not stop.wait(0.5):
            if process.poll() is not None:
                print(f"replica {name} exited with code {process.returncode}:\n{launcher.log_tail(name)}", file=sys.stderr)
                return 1
    finally:
        launcher.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
