"""The graphs of a run's micro-batch counts, kept in its run directory.

A pipeline plan of M micro-batches is simulated on one micro-batch's step, a graph of its
own (`schedlab.microbatch.pipeline_step`). `MicroGraphs` hands out the graph for each M:
M = 1 is the run's graph.json; any other is `graphs/m{M}.json` (`RunPaths.micro_graph`),
captured once by `capture(M)` and written atomically, so a resumed search and every
worker process (which capture nothing) read the same graphs. `fill` captures a space's
counts before workers start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.search.run_dir import RunPaths


class MicroGraphs:
    """M -> the graph a plan of M micro-batches of the run's model resolves against."""

    def __init__(self, run_dir: Path, graph: Graph, capture: Callable[[int], Graph] | None = None) -> None:
        self.paths, self.graph, self.capture = RunPaths(run_dir), graph, capture
        self._loaded: dict[int, Graph] = {1: graph}

    def __call__(self, micro_batches: int) -> Graph:
        if micro_batches < 1:
            raise SchedlabError(f"a plan needs at least one micro-batch, not {micro_batches}")
        if micro_batches not in self._loaded:
            self._loaded[micro_batches] = self._get(micro_batches)
        return self._loaded[micro_batches]

    def fill(self, counts: Iterable[int]) -> None:
        """Have every graph of `counts` in the run directory (captured now if missing; one
        already there is not read)."""
        for m in counts:
            if m not in self._loaded and not self.paths.micro_graph(m).exists():
                self(m)

    def _get(self, micro_batches: int) -> Graph:
        path = self.paths.micro_graph(micro_batches)
        if path.exists():
            return Graph.load(path)
        if self.capture is None:
            raise SchedlabError(
                f"{path} is missing: the search that made {self.paths.root} captures each micro-batch count's "
                "graph before its workers start; run `schedlab search` on this run directory again")
        graph = self.capture(micro_batches)
        graph.save(path)
        return graph
