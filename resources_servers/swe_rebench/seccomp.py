"""The jail's seccomp filter: no user namespaces (``clone`` or ``unshare`` with ``CLONE_NEWUSER`` fail with EPERM).

bubblewrap 0.8's ``--disable-userns`` needs ``--unshare-user``, which would run the jail as a uid mapped to
the server's own (root) instead of the sandbox's unprivileged uid; so the jail refuses user namespaces with
this filter instead, handed to bubblewrap as a classic BPF program (``--seccomp FD``), applied before the
command starts. ``clone3`` passes its flags in memory a filter cannot read, so it fails with ENOSYS (the C
library then falls back to ``clone``, which the filter can read). System calls of another ABI than the
machine's own (32-bit ``int 0x80`` on x86_64, x32) fail with EPERM, so they cannot go around it.
"""

from __future__ import annotations

import errno
import os
import struct

CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000
# seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (args[0]'s low half at 16, little-endian).
NR, ARCH, ARG0_LOW = 0, 4, 16
# Per machine: the audit arch, then the numbers of clone, unshare and clone3.
MACHINES = {
    "x86_64": (0xC000003E, 56, 272, 435),
    "aarch64": (0xC00000B7, 220, 97, 435),
}
LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW = 0x7FFF0000
ERRNO = 0x00050000


class SeccompUnsupported(RuntimeError):
    """No filter is known for this machine."""


def no_userns_filter(machine: str | None = None) -> bytes:
    """The BPF program (``struct sock_filter`` array) for ``machine`` (default: this one)."""
    machine = machine or os.uname().machine
    if machine not in MACHINES:
        raise SeccompUnsupported(f"no seccomp filter against user namespaces is known for {machine!r} (known: {', '.join(MACHINES)})")
    arch, clone, unshare, clone3 = MACHINES[machine]
    # Jumps count the instructions skipped after the jump itself; the targets are the last four lines.
    program = [
        (LD_W_ABS, 0, 0, ARCH),
        (JEQ, 0, 8, arch),  # another ABI: deny
        (LD_W_ABS, 0, 0, NR),
        (JGE, 6, 0, X32_SYSCALL_BIT),  # x32: deny
        (JEQ, 6, 0, clone3),  # ENOSYS
        (JEQ, 1, 0, clone),  # read the flags
        (JEQ, 0, 2, unshare),  # allow
        (LD_W_ABS, 0, 0, ARG0_LOW),
        (JSET, 1, 0, CLONE_NEWUSER),  # deny
        (RET, 0, 0, ALLOW),
        (RET, 0, 0, ERRNO | errno.EPERM),
        (RET, 0, 0, ERRNO | errno.ENOSYS),
    ]
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in program)
