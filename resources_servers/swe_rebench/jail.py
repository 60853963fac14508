"""The jail: every command of a sandbox runs in bubblewrap namespaces that show the system read-only and that sandbox alone.

Inside, the session's repository is ``/repo`` (its own size-capped tmpfs, the only writable place besides a
fresh, capped ``/tmp``); there is no network, a PID namespace that dies with the command, and the command
runs as the sandbox's own unprivileged uid, under limits on its memory and its number of processes.
Nothing else of the host is there: no task templates, no hidden tests, no state or socket directory,
no other sandbox. ``NoJail`` runs the same commands unconfined, for ``unsafe_no_jail: true``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from resources_servers.swe_rebench.sandbox import GIT_IDENTITY, Sandbox

REPO = Path("/repo")
INSTALL_HINT = "install bubblewrap (`apt-get install bubblewrap` on Debian and Ubuntu, `dnf install bubblewrap` on Fedora)"
UNSAFE_HINT = "or set unsafe_no_jail: true to run the policy's commands unconfined (only for a trusted policy)"
# Merged-/usr systems have these as symlinks into /usr; older ones as directories.
SYSTEM_DIRS = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
# Enough of /etc for the dynamic loader and Debian's alternatives (awk, editor...): no passwords, no keys.
SYSTEM_FILES = ["/etc/ld.so.cache", "/etc/alternatives"]


class JailError(RuntimeError):
    """The jail cannot be made here; the message says why and what to do."""


@dataclass(frozen=True)
class Limits:
    disk_bytes: int
    memory_bytes: int
    processes: int


def common_env() -> dict[str, str]:
    return {
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        **GIT_IDENTITY,
    }


class Jail:
    def __init__(self, bwrap: str, limits: Limits, hidden: list[Path]) -> None:
        found = shutil.which(bwrap)
        if found is None:
            raise JailError(f"swe_rebench runs every command in a bubblewrap jail and cannot find {bwrap!r}: {INSTALL_HINT}; {UNSAFE_HINT}")
        if os.geteuid() != 0:
            raise JailError(
                "swe_rebench's jail needs root: it mounts a size-capped tmpfs per sandbox and runs commands as "
                f"an unprivileged uid of their own; run the server as root (in a container or a VM), {UNSAFE_HINT}"
            )
        self.bwrap = found
        self.limits = limits
        self.system = system_view(hidden, limits.disk_bytes)
        self.python_bin = os.path.dirname(sys.executable)

    def command(self, sandbox: Sandbox, argv: list[str], mounts: dict[str, Path]) -> tuple[list[str], Path, dict[str, str]]:
        """``argv`` run in ``sandbox``'s jail, with ``mounts`` read-only at ``/<name>``: the argv, host cwd and env to spawn."""
        extra = [arg for name, source in mounts.items() for arg in ("--ro-bind", str(source), f"/{name}")]
        jailed = [
            self.bwrap,
            *("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"),
            *("--die-with-parent", "--new-session"),
            *self.system,
            *("--bind", str(sandbox.repo), str(REPO), *extra, "--chdir", str(REPO)),
            *("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"),
            *("--", "prlimit", f"--as={self.limits.memory_bytes}", f"--nproc={self.limits.processes}", "--core=0"),
            *("--", "setpriv", f"--reuid={sandbox.uid}", f"--regid={sandbox.uid}", "--clear-groups"),
            *("--inh-caps=-all", "--bounding-set=-all", "--", *argv),
        ]
        env = {
            "PATH": os.pathsep.join([self.python_bin, "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": "/tmp",
            **common_env(),
            **{name.upper(): f"/{name}" for name in mounts},
        }
        return jailed, sandbox.root, env

    def check(self, sandbox: Sandbox) -> None:
        """Run one command in ``sandbox``'s jail, so a jail that cannot work here stops the start-up."""
        argv, cwd, env = self.command(sandbox, ["sh", "-c", 'test -w "$PWD" && exec python3 -c ""'], {})
        result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise JailError(f"bubblewrap ({self.bwrap}) cannot make swe_rebench's jail here: {result.stderr.strip()}; {UNSAFE_HINT}")


class NoJail:
    """Commands run as the server's user, with the whole file system and the network: ``unsafe_no_jail``."""

    def command(self, sandbox: Sandbox, argv: list[str], mounts: dict[str, Path]) -> tuple[list[str], Path, dict[str, str]]:
        env = {
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)]),
            "HOME": str(sandbox.root),
            **common_env(),
            # git must never find a repository above the sandbox (the grading copy has none of its own).
            "GIT_CEILING_DIRECTORIES": str(sandbox.root),
            **{name.upper(): str(source) for name, source in mounts.items()},
        }
        return argv, sandbox.repo, env

    def check(self, sandbox: Sandbox) -> None:
        pass


def system_view(hidden: list[Path], tmp_bytes: int) -> list[str]:
    """bwrap arguments for the read-only system: /usr, this Python, a few files of /etc; ``hidden`` masked where they fall inside."""
    args = ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    bound = [Path("/usr")]
    args += ["--ro-bind", "/usr", "/usr"]
    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            args += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            args += ["--ro-bind", directory, directory]
            bound.append(Path(directory))
    for path in [Path(p) for p in SYSTEM_FILES] + python_dirs():
        if path.exists() and not any(path.is_relative_to(done) for done in bound):
            args += parents_of(path) + ["--ro-bind", str(path), str(path)]
            bound.append(path)
    for path in hidden:
        if any(path.is_relative_to(done) for done in bound) and path.is_dir():
            args += ["--tmpfs", str(path)]
    return args


def python_dirs() -> list[Path]:
    """Where this interpreter and its standard library live (a virtualenv has two places), so ``python3`` runs inside."""
    return sorted({Path(prefix) for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)})


def parents_of(path: Path) -> list[str]:
    """Directories bwrap makes on the way to a bind are private to root unless made first, traversable."""
    return [arg for parent in reversed(path.parents[:-1]) for arg in ("--perms", "0755", "--dir", str(parent))]
