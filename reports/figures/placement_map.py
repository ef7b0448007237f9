"""Where each strategy's best placement puts the model: layers by op kind, coloured by device.

One panel per strategy (its fastest plan in search.json "best"), the fastest of the whole
search marked. Columns are the model's layers in forward order (`layers_in_order`; ops
with no layer last); the rows of a panel are the op kinds (F forward, B input gradient,
W weight gradient, OPT optimizer), so a placement that splits a layer's backward from
its forward shows. A cell is coloured by the device its ops run on, split in proportion
where they run on several; blank: the layer has no op of that kind. Each op's device is
what `schedlab.plan.place` resolves for the plan on the machine the search used.

Data: graph.json, search.json (best), run.json (machine).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.graph import Graph, OpKind
from schedlab.layer_split import layers_in_order
from schedlab.machine import Machine
from schedlab.plan import place
from schedlab.reports import style
from schedlab.reports.figures import (
    SIMULATED,
    FigureRecord,
    FigureSkipped,
    describe_conditions,
    main_for,
    run_conditions,
)
from schedlab.reports.load import GRAPH_JSON, RUN_JSON, SEARCH_JSON, RunData
from schedlab.reports.load_placement import (
    BestEntry,
    PlacementDataError,
    best_entries,
    is_tf_run,
    machine_label,
    require_placement_run,
    searched_machine,
    strategy_sort_key,
)

NAME = "placement_map"
NO_LAYER = "(no layer)"
KIND_ORDER = (OpKind.F, OpKind.B, OpKind.W, OpKind.OPT, OpKind.COMM)
# Distinct device colours: Tol "bright" without its grey, then Tol "muted" ones unlike them;
# devices past these repeat a colour with a hatch.
DEVICE_COLOURS = (*style.PALETTE[:6], "#332288", "#44AA99", "#882255", "#999933")
_HATCHES = ("", "////", "xxxx", "....")
_MS = 1e3


def device_style(i: int) -> tuple[str, str]:
    """(colour, hatch) of the i-th device of the machine."""
    n = len(DEVICE_COLOURS)
    return DEVICE_COLOURS[i % n], _HATCHES[(i // n) % len(_HATCHES)]


@dataclass(frozen=True)
class LayerMap:
    """A placement summarised by layer and op kind."""

    columns: tuple[str, ...]  # layers in forward order, then NO_LAYER if some op has no layer
    kinds: tuple[str, ...]  # op kinds present in the graph, in KIND_ORDER
    counts: dict[tuple[str, str], dict[str, int]]  # (column, kind) -> device id -> op count
    ops_per_device: dict[str, int]

    def layer_devices(self) -> dict[str, str]:
        """column -> its device, or "mixed" where its ops run on more than one."""
        out: dict[str, str] = {}
        for col in self.columns:
            devs = {d for k in self.kinds for d in self.counts.get((col, k), {})}
            out[col] = devs.pop() if len(devs) == 1 else "mixed"
        return out


def layer_map(graph: Graph, op_device: Sequence[str]) -> LayerMap:
    columns = layers_in_order(graph)
    if any(op.layer is None for op in graph.ops):
        columns.append(NO_LAYER)
    present = {op.kind for op in graph.ops}
    kinds = tuple(k.value for k in KIND_ORDER if k in present)
    counts: dict[tuple[str, str], dict[str, int]] = {}
    per_device: dict[str, int] = {}
    for op, dev in zip(graph.ops, op_device, strict=True):
        cell = counts.setdefault((op.layer or NO_LAYER, op.kind.value), {})
        cell[dev] = cell.get(dev, 0) + 1
        per_device[dev] = per_device.get(dev, 0) + 1
    return LayerMap(columns=tuple(columns), kinds=kinds, counts=counts, ops_per_device=per_device)


@dataclass(frozen=True)
class Row:
    entry: BestEntry
    map: LayerMap


def strategy_rows(graph: Graph, machine: Machine, entries: Sequence[BestEntry]) -> tuple[list[Row], list[str]]:
    """Each strategy's fastest plan placed on `machine`; and why any could not be (one line each)."""
    firsts: dict[str, BestEntry] = {}
    for e in entries:  # fastest first
        firsts.setdefault(e.strategy, e)
    rows, problems = [], []
    for name in sorted(firsts, key=strategy_sort_key):
        e = firsts[name]
        try:
            rows.append(Row(entry=e, map=layer_map(graph, place(graph, e.plan, machine))))
        except SchedlabError as err:
            problems.append(f"{name}: plan {e.plan.hash} cannot be placed on {machine.name}: {err}")
    return rows, problems


def draw(run: RunData, out_stem: Path) -> FigureRecord:
    try:
        require_placement_run(run)
        machine = searched_machine(run)
        entries = best_entries(run)
    except PlacementDataError as e:
        raise FigureSkipped(str(e)) from None
    graph = run.graph
    if graph is None:
        raise FigureSkipped(run.problems.get(GRAPH_JSON, f"{GRAPH_JSON} missing") + " (written by `schedlab search`)")
    if not entries:
        raise FigureSkipped(f"{run.path / SEARCH_JSON} lists no best plans")
    if is_tf_run(run):  # one strategy, settings with and without a placement: its fastest of each
        entries = tuple(dataclasses.replace(e, strategy="placed" if e.plan.multi_device else "unplaced")
                        for e in entries)
    rows, problems = strategy_rows(graph, machine, entries)
    if not rows:
        raise FigureSkipped("no best plan could be placed: " + "; ".join(problems))
    fastest = entries[0]
    columns = rows[0].map.columns
    kinds = rows[0].map.kinds
    dev_index = {d.id: i for i, d in enumerate(machine.devices)}
    mlabel = machine_label(machine)
    row_h = 0.12 * len(kinds) + 0.3
    with style.paper():
        legend_h = 0.25 * ((len(machine.devices) + 7) // 8)
        fig = style.figure(style.PAGE_IN, 0.9 + row_h * len(rows) + legend_h, layout="constrained")
        # One panel per strategy, then a row that holds only the device legend (below the layer names).
        grid = fig.add_gridspec(len(rows) + 1, 1, height_ratios=[row_h] * len(rows) + [legend_h])
        axes = [fig.add_subplot(grid[i, 0]) for i in range(len(rows))]
        for ax in axes[1:]:
            ax.sharex(axes[0])
        for ax in axes[:-1]:
            ax.tick_params(axis="x", labelbottom=False)
        for ax, row in zip(axes, rows, strict=True):
            _draw_row(ax, row.map, columns, kinds, dev_index)
            entry = row.entry
            star = "  (fastest of the search)" if entry is fastest else ""
            per_dev = ", ".join(f"{d} {n}" for d, n in sorted(row.map.ops_per_device.items(),
                                                              key=lambda kv: dev_index.get(kv[0], 0)))
            ax.set_title(f"{entry.strategy}: {entry.predicted_s * _MS:.3f} ms simulated (ops: {per_dev}){star}",
                         loc="left", pad=2)
        step = max(1, len(columns) // 40)
        ticks = list(range(0, len(columns), step))
        labels = [columns[i] for i in ticks]
        if len(ticks) <= 10 and max(len(t) for t in labels) <= 14:
            axes[-1].set_xticks(ticks, labels)
        else:
            axes[-1].set_xticks(ticks, labels, rotation=60, ha="right", rotation_mode="anchor", fontsize=6)
        axes[-1].set_xlabel("layer (forward order)")
        axes[-1].set_xlim(-0.6, len(columns) - 0.4)
        handles = [_device_patch(i, d.id) for i, d in enumerate(machine.devices)]
        legend_ax = fig.add_subplot(grid[-1, 0])
        legend_ax.axis("off")
        legend_ax.legend(handles=handles, loc="center", ncol=min(len(handles), 8), handlelength=1.2,
                         columnspacing=1.0, title="device", title_fontsize=7)
        fig.suptitle(f"Placements on {mlabel}, {run.workload} (simulated step times)", x=0.01, ha="left")
        png, pdf = style.save(
            fig, out_stem,
            note=f"Each op's device resolved by schedlab.plan.place for {machine.name}; rows: op kinds "
            f"(F forward, B input gradient, W weight gradient, OPT optimizer); graph {run.graph_hash or '?'}."
            + ("" if not problems else " Not drawn: " + "; ".join(problems)),
        )
    conditions: dict[str, Any] = {
        **run_conditions(run),
        "simulated": True,
        "machine_simulated": machine.name,
        "devices": [d.id for d in machine.devices],
        "layers": list(columns),
        "kinds": list(kinds),
        "strategies": {
            r.entry.strategy: {
                "plan_hash": r.entry.plan.hash,
                "trial": r.entry.trial,
                "predicted_s": r.entry.predicted_s,
                "ops_per_device": r.map.ops_per_device,
                "layer_devices": r.map.layer_devices(),
            }
            for r in rows
        },
        "fastest_strategy": fastest.strategy,
        "not_drawn": problems,
    }
    return FigureRecord(
        name=NAME,
        title=f"Placement map: {run.workload} on {machine.name}",
        files=(png, pdf),
        sources=(run.path / RUN_JSON, run.path / GRAPH_JSON, run.path / SEARCH_JSON),
        caption=(
            f"The fastest placement of each of {len(rows)} strategies on {mlabel}: the model's {len(columns)} layers "
            f"in forward order (columns) by op kind (rows), coloured by the device their ops run on. "
            f"Fastest of the search: {fastest.strategy}, {fastest.predicted_s * _MS:.3f} ms simulated."
            + ("" if not problems else " Not drawn: " + "; ".join(problems) + ".")
        ),
        basis=SIMULATED,
        conditions=conditions,
        conditions_text=describe_conditions(
            SIMULATED,
            host=f"{mlabel} (simulated)",
            versions=run.versions,
            graph_hash=run.graph_hash or None,
            plan_hashes=[r.entry.plan.hash for r in rows],
            stats=[f"{len(rows)} strategies", f"{len(columns)} layers"],
        ),
        run=run.name,
    )


def _device_patch(i: int, label: str) -> Any:
    from matplotlib.patches import Patch

    colour, hatch = device_style(i)
    return Patch(facecolor=colour, hatch=hatch or None, edgecolor="white", linewidth=0.3, label=label)


def _draw_row(ax: Any, lm: LayerMap, columns: Sequence[str], kinds: Sequence[str], dev_index: dict[str, int]) -> None:
    """One panel: a cell per (layer, kind), split among devices in proportion to op counts."""
    width = 0.9
    by_device: dict[str, tuple[list[float], list[float], list[float]]] = {}  # device -> (y, left, width)
    for y, kind in enumerate(kinds):
        for x, col in enumerate(columns):
            cell = lm.counts.get((col, kind))
            if not cell:
                continue
            total = sum(cell.values())
            left = x - width / 2
            for dev in sorted(cell, key=lambda d: dev_index.get(d, len(dev_index))):
                w = width * cell[dev] / total
                ys, lefts, widths = by_device.setdefault(dev, ([], [], []))
                ys.append(y)
                lefts.append(left)
                widths.append(w)
                left += w
    for dev, (ys, lefts, widths) in by_device.items():
        colour, hatch = device_style(dev_index.get(dev, len(dev_index)))
        ax.barh(ys, widths, height=0.82, left=lefts, color=colour, hatch=hatch or None, edgecolor="white",
                linewidth=0.3)
    ax.set_yticks(range(len(kinds)), list(kinds))
    ax.set_ylim(len(kinds) - 0.5, -0.5)  # F on top
    ax.tick_params(axis="y", length=0, pad=2)
    ax.spines["left"].set_visible(False)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m schedlab.reports.figures.placement_map RUN_DIR [OUT_DIR]`: redraw this figure from a stored run."""
    return main_for(draw, NAME, argv)


if __name__ == "__main__":
    sys.exit(main())
