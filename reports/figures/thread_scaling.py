"""Op thread scaling: the Profile's fitted class model against measured kernel times.

For the op classes that take the most time in the step (measured, from the best plan's
executor trace; else estimated with the Profile), one panel each: the fitted model of
the class (`WorkThreadsModel`, line) over 1..cores intra-op threads, evaluated at the
FLOPs and bytes of the class's most time-consuming op, and the kernel times measured for
exactly that op's signature (dots, the Profile's signature table).

Data: graph.json (schedlab search), the run's Profile (schedlab calibrate), and
traces/best.exec.json for the time ranking when present.
"""

from __future__ import annotations

import math
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedlab.graph import Graph, Op
from schedlab.reports import style
from schedlab.reports.figures import FigureRecord, FigureSkipped, describe_conditions, main_for, run_conditions
from schedlab.reports.load import GRAPH_JSON, TRACE_FILES, RunData, file_sha256

if TYPE_CHECKING:
    from schedlab.calibrate.profile import Profile

MAX_CLASSES = 6
MEASURED_AND_MODEL = "measured (dots) and fitted model (lines)"


@dataclass(frozen=True)
class Panel:
    op_class: str
    op: Op  # the representative op: most time among the class's ops with measured points
    signature: str
    class_us: float  # total time of the class in the step (µs)
    share: float  # of the step's total op time
    measured: dict[int, float]  # threads -> kernel µs (the signature row; may be empty)
    model: dict[int, float]  # threads -> kernel µs from the class model
    fit: dict[str, Any]  # how the class model was fitted


def op_times_us(run: RunData, graph: Graph, profile: Profile, cores: int) -> tuple[dict[int, float], str]:
    """Time per op id in one step: measured (best plan, step 0) when the trace is there."""
    trace = run.traces.get("best.exec")
    if trace is not None and trace.meta.get("graph_hash") in (None, graph.hash):
        out: dict[int, float] = {}
        for e in trace.step_events(0):
            if 0 <= e.op < len(graph) and e.kind != "COMM":
                out[e.op] = out.get(e.op, 0.0) + e.dur_ns / 1e3
        if out:
            return out, f"measured ({TRACE_FILES['best.exec']}, step 0)"
    return {op.id: profile.kernel_us(op, cores) for op in graph.ops}, f"estimated with the profile at {cores} threads"


def panels(run: RunData, max_classes: int = MAX_CLASSES) -> tuple[list[Panel], str, int]:
    """The panels to draw, how op time was ranked, and the largest thread count."""
    from schedlab.calibrate.signature import signature

    graph, profile = run.graph, run.profile
    if graph is None:
        raise FigureSkipped(run.problems.get(GRAPH_JSON, f"{GRAPH_JSON} missing"))
    if profile is None:
        raise FigureSkipped(run.problems.get("profile", "no profile"))
    prof_cores = int(profile.machine.get("cores") or 0)
    max_threads = max(prof_cores, run.cores, *(max(r) for r in profile.signatures.values() if r), 1)
    times, ranked_by = op_times_us(run, graph, profile, max(prof_cores, 1))
    total = sum(times.values()) or 1.0
    by_class: dict[str, list[Op]] = {}
    for op in graph.ops:
        if not op.is_view:
            by_class.setdefault(op.op_class, []).append(op)
    class_us = {cls: sum(times.get(op.id, 0.0) for op in ops) for cls, ops in by_class.items()}
    out: list[Panel] = []
    for cls in sorted(class_us, key=lambda c: (-class_us[c], c)):
        if len(out) >= max_classes:
            break
        # Group the class's ops by signature; pick the most time-consuming measured one.
        sig_us: dict[str, float] = {}
        sig_op: dict[str, Op] = {}
        for op in by_class[cls]:
            s = signature(op)
            sig_us[s] = sig_us.get(s, 0.0) + times.get(op.id, 0.0)
            sig_op.setdefault(s, op)
        measured_sigs = [s for s in sig_us if profile.signatures.get(s)]
        if not measured_sigs and cls not in profile.classes:
            continue  # neither a fit nor points of its own: nothing to show for this class
        pool = measured_sigs or list(sig_us)
        sig = max(pool, key=lambda s: (len(profile.signatures.get(s) or {}), sig_us[s], s))
        op = sig_op[sig]
        model = profile.class_model(cls)
        fit = profile.classes.get(cls)
        out.append(
            Panel(
                op_class=cls,
                op=op,
                signature=sig,
                class_us=class_us[cls],
                share=class_us[cls] / total,
                measured=dict(sorted((profile.signatures.get(sig) or {}).items())),
                model={n: model.kernel_us(op.flops, op.bytes_moved, n) for n in range(1, max_threads + 1)},
                fit={
                    "model": fit.model_name if fit else "fallback",
                    "params": model.to_params(),
                    "heldout_mape_pct": fit.heldout_mape if fit else None,
                    "train_mape_pct": fit.train_mape if fit else None,
                    "n_signatures": fit.n_signatures if fit else 0,
                },
            )
        )
    if not out:
        raise FigureSkipped("the profile has no fit or measured points for any op class of this graph")
    return out, ranked_by, max_threads


def draw(run: RunData, out_stem: Path) -> FigureRecord:
    ps, ranked_by, max_threads = panels(run)
    profile = run.profile
    assert profile is not None and run.graph is not None
    host = measured_on(profile)
    ncols = min(3, len(ps))
    nrows = math.ceil(len(ps) / ncols)
    with style.paper():
        fig = style.figure(style.PAGE_IN if ncols > 1 else style.COLUMN_IN, 0.5 + 2.0 * nrows, layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False)
        for i, p in enumerate(ps):
            ax = axes[i // ncols][i % ncols]
            xs = sorted(p.model)
            ax.plot(xs, [p.model[n] for n in xs], color=style.colour(0), lw=1.0, marker=".", ms=3,
                    label="fitted model")
            if p.measured:
                mx = sorted(p.measured)
                ax.plot(mx, [p.measured[n] for n in mx], ls="none", marker="o", ms=4, mfc=style.colour(1),
                        mec=style.INK, mew=0.4, label="measured")
            else:
                ax.text(0.5, 0.5, "no measured points\nfor this shape", transform=ax.transAxes, ha="center",
                        va="center", fontsize=6.5, color=style.GREY)
            wrap = 44 if ncols > 1 else 60
            share = f"{p.share:.0%}" if p.share >= 0.005 else "<1%"
            head = textwrap.fill(f"{p.op_class}: {share} of the step's op time", wrap)
            ax.set_title(f"{head}\n{textwrap.fill(_shape_text(run.graph, p), wrap)}", fontsize=7, loc="left")
            ax.set_ylim(bottom=0, top=max([*p.model.values(), *p.measured.values(), 1e-3]) * 1.3)
            _thread_axis(ax, max_threads)
            if i % ncols == 0:
                ax.set_ylabel("kernel time (µs)")
            if i // ncols == nrows - 1 or i + ncols >= len(ps):
                ax.set_xlabel("intra-op threads")
        for j in range(len(ps), nrows * ncols):
            axes[j // ncols][j % ncols].set_visible(False)
        handles, labels = axes[0][0].get_legend_handles_labels()
        for row in axes:
            for ax in row:
                if len(ax.get_legend_handles_labels()[0]) > len(handles):
                    handles, labels = ax.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper right", ncol=2, handlelength=1.4)
        png, pdf = style.save(
            fig,
            out_stem,
            note=f"Measured on {host}. Lines: class model fitted over all shapes of the class; dots: kernel times "
            f"measured for the op named; classes ranked by time {ranked_by}.",
        )
    sources = [run.path / GRAPH_JSON]
    if run.profile_path is not None:
        sources.append(run.profile_path)
    if ranked_by.startswith("measured"):
        sources.append(run.path / TRACE_FILES["best.exec"])
    conditions: dict[str, Any] = {
        **run_conditions(run),
        "measured_on": host,
        "profile": {
            "path": str(run.profile_path),
            "sha256": file_sha256(run.profile_path) if run.profile_path else None,
            "machine": profile.machine,
            "created_unix_s": profile.created_unix_s,
            "quick": profile.quick,
        },
        "ranked_by": ranked_by,
        "classes": [
            {
                "op_class": p.op_class,
                "share_of_step": round(p.share, 4),
                "op": p.op.name,
                "signature": p.signature,
                "flops": p.op.flops,
                "bytes": p.op.bytes_moved,
                "measured_us": {str(k): v for k, v in p.measured.items()},
                "model_us": {str(k): round(v, 4) for k, v in p.model.items()},
                "fit": p.fit,
            }
            for p in ps
        ],
    }
    return FigureRecord(
        name="thread_scaling",
        title=f"Op thread scaling, fitted model vs measured: {run.workload}",
        files=(png, pdf),
        sources=tuple(sources),
        caption=(
            f"Kernel time against intra-op threads for the {len(ps)} op classes with the most time in the step "
            f"(ranked by time {ranked_by}): the profile's fitted class model (line) and the kernel times measured "
            f"for the class's most time-consuming op shape (dots), measured on {host}."
        ),
        basis=MEASURED_AND_MODEL,
        conditions=conditions,
        conditions_text=describe_conditions(
            MEASURED_AND_MODEL,
            host=host,
            versions=run.versions,
            graph_hash=run.graph_hash or None,
            stats=[f"profile {run.profile_path} (sha256 {conditions['profile']['sha256']})"],
        ),
        run=run.name,
    )


def measured_on(profile: Profile) -> str:
    raw = profile.meta.get("host")
    host: dict[str, Any] = raw if isinstance(raw, dict) else {}
    name = str(host.get("hostname") or "")
    cpu = str(profile.machine.get("cpu_model") or host.get("cpu_model") or "unknown CPU")
    cores = profile.machine.get("cores")
    torch = profile.machine.get("torch") or host.get("torch")
    when = time.strftime("%Y-%m-%d", time.gmtime(profile.created_unix_s))
    parts = [cpu + (f", {cores} cores" if cores else "")]
    if torch:
        parts.append(f"torch {torch}")
    parts.append(f"profile of {when}{' (quick)' if profile.quick else ''}")
    return (f"{name}: " if name else "") + "; ".join(parts)


def _shape_text(graph: Graph | None, p: Panel) -> str:
    shape = ""
    if graph is not None and p.op.outputs:
        meta = graph.values[p.op.outputs[0]]
        if meta is not None and meta.shape:
            shape = "out " + "×".join(str(s) for s in meta.shape) + ", "
    return f"{p.op.name}: {shape}{_si(p.op.flops, 'FLOP')}, {_si(p.op.bytes_moved, 'B')}"


def _si(x: float, unit: str) -> str:
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _thread_axis(ax: Any, max_threads: int) -> None:
    if max_threads <= 8:
        ax.set_xticks(range(1, max_threads + 1))
        ax.set_xlim(0.7, max_threads + 0.3)
    else:
        ax.set_xscale("log", base=2)
        ticks = [2**k for k in range(int(math.log2(max_threads)) + 1)]
        if ticks[-1] != max_threads:
            ticks.append(max_threads)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.minorticks_off()


if __name__ == "__main__":
    sys.exit(main_for(draw, "thread_scaling"))
