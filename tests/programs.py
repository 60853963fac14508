"""Programs some tests run that a machine may lack, each with the Debian package that has it (.ci/run installs
them): a test that needs one is skipped where it is missing, saying which and how to install it, never errors."""

from __future__ import annotations

import shutil

import pytest

PACKAGES = {"bwrap": "bubblewrap", "haproxy": "haproxy", "ip": "iproute2", "nsenter": "util-linux", "unshare": "util-linux"}


def lacking(*programs: str) -> str | None:
    """Why ``programs`` cannot run here: each one not on PATH, with the package that has it; None when all can."""
    missing = [program for program in programs if shutil.which(program) is None]
    return "; ".join(f"no {program} (install: apt-get install {PACKAGES[program]})" for program in missing) or None


def needs(*programs: str) -> pytest.MarkDecorator:
    """A mark that skips a test, or a module as ``pytestmark``, where any of ``programs`` is missing."""
    reason = lacking(*programs)
    return pytest.mark.skipif(reason is not None, reason=reason or "")
