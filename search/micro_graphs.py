"""The graphs of a run's micro-batch and replica counts, kept in its run directory.

A pipeline plan of M micro-batches and R replicas is simulated on one replica's
micro-batch step, a graph of its own (`schedlab.microbatch.pipeline_step`). `MicroGraphs`
hands out the graph for each (M, R): M = R = 1 is the run's graph.json; any other is
`graphs/m{M}.json`, or `graphs/r{R}-m{M}.json` with replicas (`RunPaths.micro_graph`),
captured once by `capture(M, R)` and written atomically, so a resumed search and every
worker process (which capture nothing) read the same graphs. `fill` captures a space's
(replicas, micro-batches) shapes before workers start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from schedlab.errors import SchedlabError
from schedlab.graph import Graph
from schedlab.search.run_dir import RunPaths


class MicroGraphs:
    """(M, R) -> the graph a plan of M micro-batches and R replicas of the run's model
    resolves against."""

    def __init__(self, run_dir: Path, graph: Graph, capture: Callable[[int, int], Graph] | None = None) -> None:
        self.paths, self.graph, self.capture = RunPaths(run_dir), graph, capture
        self._loaded: dict[tuple[int, int], Graph] = {(1, 1): graph}

    def __call__(self, micro_batches: int, replicas: int = 1) -> Graph:
        if micro_batches < 1 or replicas < 1:
            raise SchedlabError(f"a plan needs at least one micro-batch and replica, not {micro_batches} and {replicas}")
        key = (replicas, micro_batches)
        if key not in self._loaded:
            self._loaded[key] = self._get(micro_batches, replicas)
        return self._loaded[key]

    def fill(self, shapes: Iterable[tuple[int, int]]) -> None:
        """Have the graph of every (replicas, micro-batches) of `shapes` in the run directory
        (captured now if missing; one already there is not read)."""
        for r, m in shapes:
            if (r, m) not in self._loaded and not self.paths.micro_graph(m, r).exists():
                self(m, r)

    def _get(self, micro_batches: int, replicas: int) -> Graph:
        path = self.paths.micro_graph(micro_batches, replicas)
        if path.exists():
            return Graph.load(path)
        if self.capture is None:
            raise SchedlabError(
                f"{path} is missing: the search that made {self.paths.root} captures each micro-batch count's "
                "graph before its workers start; run `schedlab search` on this run directory again")
        graph = self.capture(micro_batches, replicas)
        graph.save(path)
        return graph
