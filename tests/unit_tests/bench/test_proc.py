"""scripts/bench/proc.py: reading /proc/<pid>/stat, and the CPU of a whole process tree."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from scripts.bench.proc import CSTIME, CUTIME, STIME, UTIME, cpu_ticks, stat_fields, tree_cpu_seconds

# A stat line as Linux writes it, for a command whose name holds a space and a parenthesis.
STAT = "4242 (odd ) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 31 7 120 45 20 0 1 0 12345 1000 100"


def test_stat_fields_start_after_the_last_parenthesis_of_the_command_name():
    fields = stat_fields(STAT)
    assert fields[0] == "S"
    assert [fields[UTIME], fields[STIME], fields[CUTIME], fields[CSTIME]] == ["31", "7", "120", "45"]


def test_cpu_ticks_sum_the_fields_asked_for():
    assert cpu_ticks(STAT, (UTIME, STIME)) == 38
    assert cpu_ticks(STAT, (UTIME, STIME, CUTIME, CSTIME)) == 203


BURN = textwrap.dedent(
    """
    import time
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    """
)


def test_the_cpu_of_a_child_that_has_ended_counts_in_its_parents_tree():
    # The parent starts a child that burns 0.3 s of CPU and ends, reaps it, then waits to be read.
    parent_code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURN!r}]); print('reaped', flush=True); sys.stdin.read()"
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "reaped"
        assert tree_cpu_seconds(parent.pid) >= 0.3
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)
