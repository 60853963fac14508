"""Upstream's ``Profiler``: CPU profiling of a stretch of code with yappi, dumped as a call graph.

``start()`` turns yappi on (CPU clock); ``stop()`` turns it off and writes, under ``base_profile_dir``,
``<name>.callgrind``, ``<name>.dot`` and ``<name>.png`` (gprof2dot and Graphviz's ``dot``, through pydot)
and ``<name>.log``: yappi's function table, whose rows after the header are kept only when they contain
``required_str`` (none when it is None, as upstream's). yappi, gprof2dot and pydot are upstream's ``dev`` tools
and not dependencies here: they are imported at first use, so the module imports without them.
"""

from __future__ import annotations

import importlib
import io
import shutil
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

LOG_COLUMNS = {0: ("name", 200), 1: ("ncall", 10), 2: ("tsub", 8), 3: ("ttot", 8), 4: ("tavg", 8)}


def profiling_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f"{name} is needed for CPU profiling: install yappi, gprof2dot and pydot (upstream's nemo-gym[dev])") from error


class Profiler(BaseModel):
    name: str
    base_profile_dir: Path
    required_str: str | None = None

    def model_post_init(self, context: object) -> None:
        if " " in self.name:
            raise AssertionError(f"Spaces are not allowed in profiler name, but got {self.name!r}")
        super().model_post_init(context)

    def start(self) -> None:
        if shutil.which("dot") is None:
            raise RuntimeError("profiling draws its call graph with Graphviz's `dot`, which is not on PATH (apt install graphviz)")
        yappi = profiling_module("yappi")
        yappi.set_clock_type("CPU")
        yappi.start()
        print(f"Profiling {self.name}")

    def stop(self) -> None:
        print(f"Stopped profiling {self.name}: see {self.base_profile_dir}")
        profiling_module("yappi").stop()
        self.dump()

    def dump(self) -> None:
        yappi, gprof2dot, pydot = (profiling_module(name) for name in ("yappi", "gprof2dot", "pydot"))
        self.base_profile_dir.mkdir(parents=True, exist_ok=True)
        path = {suffix: self.base_profile_dir / f"{self.name}.{suffix}" for suffix in ("callgrind", "dot", "png", "log")}
        callgrind, dot = path["callgrind"], path["dot"]
        yappi.get_func_stats().save(str(callgrind), type="CALLGRIND")
        gprof2dot.main(argv=["--format=callgrind", f"--output={dot}", "-e", "5", "-n", "5", str(callgrind)])
        (graph,) = pydot.graph_from_dot_file(str(dot))
        graph.write_png(str(path["png"]))
        table = io.StringIO()
        yappi.get_func_stats().print_all(out=table, columns=LOG_COLUMNS)
        kept, past_header = [], False
        for line in table.getvalue().splitlines(keepends=True):
            if not past_header or (self.required_str and self.required_str in line):
                kept.append(line)
            past_header = past_header or line.startswith("name")
        path["log"].write_text("".join(kept))
