"""The jail: every command of a sandbox runs in bubblewrap namespaces that show the system read-only and that sandbox alone.

Inside, the session's repository is ``/repo`` (its own size-capped tmpfs, the only writable place besides a
fresh, capped ``/tmp``); there is no network, a PID namespace that dies with the command, no user
namespaces (``seccomp.py``), and the command runs as the sandbox's own unprivileged uid, in the sandbox's
cgroup, which caps the memory and the processes of all its commands together (``cgroups.py``).
Nothing else of the host is there: no task templates, no hidden tests, no state or socket directory,
no other sandbox, and the Python installation at ``/opt/python`` rather than at its host path.
``NoJail`` runs the same commands unconfined, for ``unsafe_no_jail: true``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from resources_servers.swe_rebench.cgroups import SandboxCgroup
from resources_servers.swe_rebench.sandbox import GIT_IDENTITY, Sandbox
from resources_servers.swe_rebench.seccomp import SeccompUnsupported, no_userns_filter

REPO = Path("/repo")
# Where the jail shows the server's Python installation when it is not part of the system directories.
PYTHON = Path("/opt/python")
# The launcher, as root outside the jail: no core dumps, itself into each of the sandbox's cgroups (``0`` to
# each join file, the arguments up to "--"), then exec of bubblewrap, so every process of the command is born capped.
LAUNCH_SCRIPT = 'ulimit -c 0; while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'
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


@dataclass(frozen=True)
class Interpreter:
    """A Python installation (``prefix``, where its standard library is) and its interpreter, relative to it."""

    prefix: Path
    executable: Path

    @classmethod
    def of_this_process(cls) -> Interpreter:
        """The installation the server's Python runs from; in a virtualenv, the one the virtualenv was made from."""
        return cls.of(Path(sys.base_prefix), Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable))))

    @classmethod
    def of(cls, prefix: Path, executable: Path) -> Interpreter:
        if not executable.is_relative_to(prefix):
            executable = prefix / "bin" / "python3"
        return cls(prefix, executable.relative_to(prefix))

    def in_jail(self) -> Path:
        """Where the jail shows the installation: where it is when the system directories hold it, else ``/opt/python``."""
        return self.prefix if is_system(self.prefix) else PYTHON


class Jail:
    def __init__(self, bwrap: str, limits: Limits, hidden: list[Path], interpreter: Interpreter | None = None) -> None:
        found = shutil.which(bwrap)
        if found is None:
            raise JailError(f"swe_rebench runs every command in a bubblewrap jail and cannot find {bwrap!r}: {INSTALL_HINT}; {UNSAFE_HINT}")
        if os.geteuid() != 0:
            raise JailError(
                "swe_rebench's jail needs root: it mounts a size-capped tmpfs per sandbox and runs commands as "
                f"an unprivileged uid of their own; run the server as root (in a container or a VM), {UNSAFE_HINT}"
            )
        try:
            self.seccomp = no_userns_filter()
        except SeccompUnsupported as error:
            raise JailError(f"swe_rebench's jail refuses user namespaces with a seccomp filter: {error}; {UNSAFE_HINT}") from None
        self.bwrap = found
        self.limits = limits
        self.interpreter = interpreter or Interpreter.of_this_process()
        python = self.interpreter.in_jail()
        self.system = system_view(hidden, limits.disk_bytes, self.interpreter)
        self.python = str(python / self.interpreter.executable)
        self.env = {
            "PATH": os.pathsep.join([str(python / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": "/tmp",
            **common_env(),
        }
        if python == PYTHON:
            # A build with a shared libpython finds it through a run path that names the host's prefix.
            self.env["LD_LIBRARY_PATH"] = str(PYTHON / "lib")

    def command(self, sandbox: Sandbox, argv: list[str], mounts: dict[str, Path]) -> Spawn:
        """``argv`` run in ``sandbox``'s jail, with ``mounts`` read-only at ``/<name>``.

        bubblewrap reads its options (every host path among them) from a memfd (``--args``) and the seccomp
        filter from another, so its command line, which the jail's first process shows, is ``bwrap --args N``,
        ``setpriv`` (to the sandbox's uid) and the command. The launcher shell joins the sandbox's cgroup before it execs bubblewrap.
        """
        extra = [arg for name, source in mounts.items() for arg in ("--ro-bind", str(source), f"/{name}")]
        seccomp = memfd("seccomp", self.seccomp)
        options = [
            *("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"),
            *("--die-with-parent", "--new-session", "--seccomp", str(seccomp)),
            *self.system,
            *("--bind", str(sandbox.repo), str(REPO), *extra, "--chdir", str(REPO)),
            *("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"),
        ]
        args = memfd("bwrap-args", b"".join(os.fsencode(option) + b"\0" for option in options))
        if sandbox.cgroup is None:
            raise JailError(f"sandbox {sandbox.root} has no cgroup: jailed commands run only in a capped sandbox")
        joins = sandbox.cgroup.join_files()
        setpriv = ["setpriv", f"--reuid={sandbox.uid}", f"--regid={sandbox.uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
        jailed = ["sh", "-c", LAUNCH_SCRIPT, "launch", *joins, "--", self.bwrap, "--args", str(args), "--", *setpriv, "--", *argv]
        env = self.env | {name.upper(): f"/{name}" for name in mounts}
        return Spawn(jailed, sandbox.root, env, (args, seccomp), sandbox.cgroup)

    def check(self, sandbox: Sandbox) -> None:
        """Run one command in ``sandbox``'s jail, so a jail that cannot work here stops the start-up."""
        probe = 'test -w "$PWD" && python3 -c "" || exit 1; unshare -U true 2>/dev/null && exit 2; exit 0'
        spawn = self.command(sandbox, ["sh", "-c", probe], {})
        try:
            result = subprocess.run(spawn.argv, cwd=spawn.cwd, env=spawn.env, pass_fds=spawn.fds, capture_output=True, text=True, timeout=60)
        finally:
            spawn.close()
        if result.returncode == 2:
            raise JailError(f"swe_rebench's jail must refuse user namespaces, and `unshare -U` succeeded in it (bwrap {self.bwrap}); {UNSAFE_HINT}")
        if result.returncode != 0:
            raise JailError(f"bubblewrap ({self.bwrap}) cannot make swe_rebench's jail here: {result.stderr.strip()}; {UNSAFE_HINT}")


class NoJail:
    """Commands run as the server's user, with the whole file system and the network: ``unsafe_no_jail``."""

    python = sys.executable

    def command(self, sandbox: Sandbox, argv: list[str], mounts: dict[str, Path]) -> Spawn:
        env = {
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)]),
            "HOME": str(sandbox.root),
            **common_env(),
            # git must never find a repository above the sandbox (the grading copy has none of its own).
            "GIT_CEILING_DIRECTORIES": str(sandbox.root),
            **{name.upper(): str(source) for name, source in mounts.items()},
        }
        return Spawn(argv, sandbox.repo, env)

    def check(self, sandbox: Sandbox) -> None:
        pass


@dataclass
class Spawn:
    """How to start a command: its argv, host working directory and environment, the descriptors it inherits
    (closed here once it has started), and the cgroup it runs in (None unjailed)."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    fds: tuple[int, ...] = ()
    cgroup: SandboxCgroup | None = None

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def memfd(name: str, data: bytes) -> int:
    """An anonymous file holding ``data``, positioned at its start, to be inherited by a child."""
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def is_system(path: Path) -> bool:
    return any(path.is_relative_to(directory) for directory in ["/usr", *SYSTEM_DIRS])


def system_view(hidden: list[Path], tmp_bytes: int, interpreter: Interpreter) -> list[str]:
    """bwrap arguments for the read-only system: /usr, the Python installation, a few files of /etc; ``hidden``
    masked where they fall inside. Only system paths and fixed ones appear in the jail: the installation, when
    it is not in /usr, is at ``/opt/python``, wherever it is on the host."""
    args = ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    bound = [Path("/usr")]
    args += ["--ro-bind", "/usr", "/usr"]
    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            args += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            args += ["--ro-bind", directory, directory]
            bound.append(Path(directory))
    for path in [Path(p) for p in SYSTEM_FILES]:
        if path.exists() and not any(path.is_relative_to(done) for done in bound):
            args += parents_of(path) + ["--ro-bind", str(path), str(path)]
    if not is_system(interpreter.prefix):
        args += parents_of(PYTHON) + ["--ro-bind", str(interpreter.prefix), str(PYTHON)]
    for path in hidden:
        if any(path.is_relative_to(done) for done in bound) and path.is_dir():
            args += ["--tmpfs", str(path)]
    return args


def parents_of(path: Path) -> list[str]:
    """Directories bwrap makes on the way to a bind are private to root unless made first, traversable."""
    return [arg for parent in reversed(path.parents[:-1]) for arg in ("--perms", "0755", "--dir", str(parent))]
