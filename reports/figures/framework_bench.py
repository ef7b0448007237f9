"""TensorFlow against PyTorch: the absolute step time of each workload in both frameworks.

Per workload, three bars: TensorFlow's step (its own runtime, a fresh worker process per
round), eager PyTorch's step and schedlab's executor on the same model and weights, each
the median over all rounds (whiskers: min to max of the timed steps), with TF / eager
above the group. A workload whose numerics check failed is marked.

Data: the JSON of `schedlab bench MODEL ... --backend tensorflow --json`, saved to a file.
Redraw alone with `python -m schedlab.reports.figures.framework_bench BENCH.json [OUT_DIR]`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError
from schedlab.io import read_json
from schedlab.reports import style
from schedlab.reports.figures import MEASURED, FigureRecord, FigureSkipped, describe_conditions
from schedlab.reports.load import host_text

NAME = "tf-vs-torch"
SIDES = (("tf", "TensorFlow"), ("eager", "eager PyTorch"), ("exec", "schedlab executor"))


@dataclass(frozen=True)
class BenchRow:
    workload: str
    step_s: dict[str, float]  # side -> median step
    times_s: dict[str, tuple[float, ...]]  # side -> every timed step
    numerics_ok: bool


@dataclass(frozen=True)
class BenchData:
    path: Path
    rows: tuple[BenchRow, ...]
    host: str
    optimizer: str = "?"
    size: str = "?"
    tf_threads: dict[str, Any] = field(default_factory=dict)
    torch_threads: int | None = None
    rounds: int | None = None
    repeats: int | None = None


def is_tf_bench(d: Any) -> bool:
    """Whether a loaded JSON object is the output of `schedlab bench --backend tensorflow --json`."""
    results = d.get("results") if isinstance(d, dict) else None
    return isinstance(results, dict) and bool(results) and all(
        isinstance(r, dict) and "tf_step_s" in r for r in results.values())


def load_bench(path: str | Path) -> BenchData:
    """Read a saved TF bench; a file that is not one is one SchedlabError naming it."""
    return bench_from_json(read_json(path, what="TensorFlow bench results"), Path(path))


def bench_from_json(d: Any, p: Path) -> BenchData:
    """A saved TF bench's loaded JSON `d` (read from `p`), as `load_bench` reads it."""
    if not is_tf_bench(d):
        raise SchedlabError(f"{p} is not the JSON of `schedlab bench ... --backend tensorflow --json`")
    rows = []
    for name, r in d["results"].items():
        try:
            step = {side: float(r[f"{side}_step_s"]) for side, _ in SIDES}
            times = {side: tuple(float(t) for t in r.get(f"{side}_step_times_s") or ()) for side, _ in SIDES}
        except (TypeError, ValueError, KeyError) as e:
            raise SchedlabError(f"{p}: workload {name!r} has no step times for every side ({e})") from e
        if not all(v > 0 and math.isfinite(v) for v in step.values()):
            raise SchedlabError(f"{p}: workload {name!r} has a step time that is not a positive number")
        rows.append(BenchRow(str(name), step, times, bool(r.get("numerics_ok", True))))
    machine = d.get("machine") if isinstance(d.get("machine"), dict) else {}
    plan = d.get("torch_plan") if isinstance(d.get("torch_plan"), dict) else {}
    return BenchData(
        path=p, rows=tuple(rows), host=host_text({"host": machine}), optimizer=str(d.get("optimizer", "?")),
        size=str(d.get("size", "?")), tf_threads=dict(d.get("tf_threads") or {}),
        torch_threads=plan.get("threads") if isinstance(plan.get("threads"), int) else None,
        rounds=d.get("rounds") if isinstance(d.get("rounds"), int) else None,
        repeats=d.get("repeats") if isinstance(d.get("repeats"), int) else None,
    )


def draw(data: BenchData, out_stem: Path) -> FigureRecord:
    if not data.rows:
        raise FigureSkipped(f"{data.path} holds no workload")
    ms = 1e3
    with style.paper():
        fig = style.figure(style.COLUMN_IN, 2.6)
        ax = fig.subplots()
        width = 0.26
        top = 0.0
        for k, (side, label) in enumerate(SIDES):
            xs = [i + (k - 1) * width for i in range(len(data.rows))]
            meds = [r.step_s[side] * ms for r in data.rows]
            spans = [_span_ms(r, side) for r in data.rows]
            lo = [max(0.0, m - s[0]) for m, s in zip(meds, spans, strict=True)]
            hi = [max(0.0, s[1] - m) for m, s in zip(meds, spans, strict=True)]
            ax.bar(xs, meds, width, yerr=[lo, hi], color=style.colour(k), label=label, capsize=1.5,
                   error_kw={"elinewidth": 0.6})
            top = max(top, *(m + h for m, h in zip(meds, hi, strict=True)))
        for i, r in enumerate(data.rows):
            ratio = r.step_s["tf"] / r.step_s["eager"]
            mark = "" if r.numerics_ok else " (numerics FAILED)"
            ax.text(i, top * 1.04, f"TF/eager {ratio:.2f}{mark}", ha="center", va="bottom", fontsize=6.5)
        ax.set_ylim(0, top * 1.18)
        ax.set_xticks(range(len(data.rows)), [r.workload for r in data.rows])
        ax.set_ylabel("step time (ms, median)")
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.12), ncol=3, handletextpad=0.3, columnspacing=1.0)
        png, pdf = style.save(fig, out_stem, note=_footnote(data))
    ratios = {r.workload: round(r.step_s["tf"] / r.step_s["eager"], 4) for r in data.rows}
    return FigureRecord(
        name=NAME,
        title="TensorFlow and PyTorch step time per workload",
        files=(png, pdf),
        sources=(data.path,),
        caption="Median step time of each workload in TensorFlow's runtime, eager PyTorch and schedlab's executor, "
        "same model and weights (whiskers: min to max of the timed steps); above each group, TF over eager.",
        basis=MEASURED,
        conditions={"host": data.host, "optimizer": data.optimizer, "size": data.size, "tf_threads": data.tf_threads,
                    "torch_threads": data.torch_threads, "rounds": data.rounds, "repeats": data.repeats,
                    "tf_over_eager": ratios},
        conditions_text=describe_conditions(
            MEASURED, host=data.host, repeats=data.rounds, steps_per_repeat=data.repeats,
            stats=[f"size {data.size}", f"optimizer {data.optimizer}"]),
    )


def _span_ms(row: BenchRow, side: str) -> tuple[float, float]:
    """Min and max of one side's timed steps (ms); its median when none were kept."""
    times = row.times_s[side] or (row.step_s[side],)
    return min(times) * 1e3, max(times) * 1e3


def _footnote(data: BenchData) -> str:
    t = data.tf_threads
    return (f"Measured on {data.host}, size {data.size}, optimizer {data.optimizer}; TensorFlow intra-op "
            f"{t.get('intra_op', '?')} (0: TF's default), inter-op {t.get('inter_op', '?')}; PyTorch "
            f"{data.torch_threads or '?'} intra-op threads; {data.rounds or '?'} rounds x {data.repeats or '?'} steps "
            f"each side; from {data.path.name}.")


def main(argv: list[str]) -> None:  # pragma: no cover - the one-script-per-figure entry point
    src = Path(argv[0])
    out = Path(argv[1]) if len(argv) > 1 else src.parent
    out.mkdir(parents=True, exist_ok=True)
    print(draw(load_bench(src), out / NAME).files[0])


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
