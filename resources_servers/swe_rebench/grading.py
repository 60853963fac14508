"""Grading from what the hidden-test runner reports: the named tests of a task, the runner's orders, and the verdict.

A task names its hidden tests in ``tests.json`` (SWE-bench's shape: ``FAIL_TO_PASS``, the tests the fix must
make pass, and ``PASS_TO_PASS``, those that must keep passing), as unittest ids ``module.Class.method``.
For each run the grader draws a fresh key, opens a report file (a memfd) that only that run inherits, and
hands the runner (``hidden_runner.py``) the descriptor's number, the key and the test ids on stdin. The
runner signs each line it writes there with the key; ``judge`` reads the lines after the run and gives
1.0 only when every line is signed, the runner started, reported every named test once and as passed,
finished, and exited with status 0. Anything else is 0.0 with the reason. stdout, which the code under
test shares, is shown in the reply and never read for the verdict.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

RUNNER_SOURCE = (Path(__file__).resolve().parent / "hidden_runner.py").read_text()
KEY_BYTES = 32
MAX_REPORT_BYTES = 1 << 20


@dataclass(frozen=True)
class NamedTests:
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]

    @property
    def all(self) -> tuple[str, ...]:
        return self.fail_to_pass + self.pass_to_pass

    @classmethod
    def load(cls, path: Path) -> NamedTests:
        data = json.loads(path.read_text())
        named = cls(tuple(data["FAIL_TO_PASS"]), tuple(data["PASS_TO_PASS"]))
        if not named.fail_to_pass or len(set(named.all)) != len(named.all):
            raise ValueError(f"{path}: FAIL_TO_PASS must name at least one test, and no test may be named twice")
        return named


@dataclass(frozen=True)
class Orders:
    """One run's key and what the runner reads on stdin."""

    key: bytes
    stdin: bytes

    @classmethod
    def new(cls, report_fd: int, tests: NamedTests) -> Orders:
        key = secrets.token_bytes(KEY_BYTES)
        return cls(key, "\n".join([f"{report_fd} {key.hex()}", *tests.all]).encode() + b"\n")


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str | None


def judge(report: bytes, key: bytes, tests: NamedTests, exit_code: int | None, timed_out: bool) -> Verdict:
    """The verdict on one run from its report, its exit status and whether it timed out."""
    if len(report) > MAX_REPORT_BYTES:
        return Verdict(False, f"the report channel holds more than {MAX_REPORT_BYTES} bytes: not the runner's report")
    events = []
    for number, raw in enumerate(report.splitlines()):
        signature, _, line = raw.partition(b"\t")
        expected = hmac.new(key, line, hashlib.sha256).hexdigest().encode()
        if not hmac.compare_digest(signature, expected):
            return Verdict(False, "a line on the report channel is not signed with this run's key: the report was forged")
        sequence, *fields = line.decode().split("\t")
        if sequence != str(number):
            return Verdict(False, "the runner's report lines are out of order")
        events.append(fields)
    if not events or events[0][0] != "start":
        reason = "the hidden tests timed out" if timed_out else f"the runner reported nothing (exit code {exit_code})"
        return Verdict(False, reason + " before any test ran")
    for fields in events:
        if fields[0] == "tampered":
            return Verdict(False, f"the test framework or the hidden tests were changed while they ran: {fields[1]}")
    results: dict[str, tuple[str, str]] = {}
    for fields in events[1:]:
        if fields[0] == "result":
            test_id, outcome, detail = fields[1:4]
            if test_id not in tests.all or test_id in results:
                return Verdict(False, f"the runner reported {test_id}, which is not a named test, or twice")
            results[test_id] = (outcome, detail)
    finished = events[-1][0] == "finished"
    missing = [test_id for test_id in tests.all if test_id not in results]
    for test_id in tests.all:
        if test_id not in results:
            continue
        outcome, detail = results[test_id]
        if outcome != "passed":
            kind = "FAIL_TO_PASS" if test_id in tests.fail_to_pass else "PASS_TO_PASS"
            return Verdict(False, f"{kind} test {test_id} {outcome}" + (f": {detail}" if detail else ""))
    if timed_out:
        return Verdict(False, f"the hidden tests timed out after {len(results)} of {len(tests.all)} named tests")
    if not finished:
        return Verdict(False, f"the runner did not finish (exit code {exit_code}); no result for {', '.join(missing) or 'none'}")
    if missing:
        return Verdict(False, f"the runner finished without a result for {', '.join(missing)}")
    if exit_code != 0:
        return Verdict(False, f"every named test passed, but the runner exited with status {exit_code}: the run was interfered with")
    return Verdict(True, None)
