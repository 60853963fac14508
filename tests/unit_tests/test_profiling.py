"""nemo_gym.profiling: upstream's Profiler imports without its tools, and says which one is missing at use."""

from __future__ import annotations

import shutil
import sys

import pytest
from pydantic import ValidationError

from nemo_gym.profiling import Profiler


def test_a_profiler_name_with_a_space_is_refused_as_upstreams_a_validation_error():
    with pytest.raises(ValidationError, match="Spaces are not allowed"):
        Profiler(name="two words", base_profile_dir="/tmp")


def test_start_without_graphviz_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="Graphviz"):
        Profiler(name="run", base_profile_dir=tmp_path).start()


def test_start_without_yappi_names_it(tmp_path, monkeypatch):
    (tmp_path / "dot").write_text("#!/bin/sh\n")
    (tmp_path / "dot").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "yappi", None)
    with pytest.raises(ModuleNotFoundError, match="yappi is needed for CPU profiling"):
        Profiler(name="run", base_profile_dir=tmp_path).start()


def test_a_profiled_stretch_leaves_its_call_graph_and_table(tmp_path):
    for name in ("yappi", "gprof2dot", "pydot"):
        pytest.importorskip(name)
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed")
    profiler = Profiler(name="run", base_profile_dir=tmp_path / "profile", required_str="test_profiling")
    profiler.start()
    sum(index * index for index in range(10_000))
    profiler.stop()
    assert {path.name for path in (tmp_path / "profile").iterdir()} == {"run.callgrind", "run.dot", "run.png", "run.log"}
    assert (tmp_path / "profile" / "run.log").read_text().count("\n") >= 1
