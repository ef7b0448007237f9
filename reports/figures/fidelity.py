"""Simulator fidelity: predicted against measured step time of every plan, coloured by model.

One panel per kind of prediction in the file: a held-out file (`schedlab fidelity
--held-out`) has two, profile-only (the stored Profile alone) and trace-calibrated (the
Profile plus the op times of one measured run of the same model); a built-in file
(`schedlab fidelity`) has the one it was run with. x is the simulated step time, y the
median measured one (whiskers: min to max of the timed steps), with y = x and a ±10%
band; log-log when the times span more than a factor of 8. Hollow markers are plans whose
shape the prediction was calibrated on; in a held-out file the calibration plan is left
out of the panel's error, as `schedlab fidelity` leaves it out. Each panel gives the MAPE
over the plans it scores and the median over models of Kendall's τ between predicted and
measured order (within one model: does the simulator rank plans as the hardware does?).

Data: the results file of `schedlab fidelity` (traces/fidelity.json,
traces/fidelity-heldout.json). Redraw alone with
`python -m schedlab.reports.figures.fidelity RESULTS.json [OUT_DIR]`.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.calibrate.fidelity import PROFILE_ONLY, PROTOCOL_SETS, TRACE_CALIBRATED
from schedlab.errors import SchedlabError
from schedlab.io import read_json
from schedlab.reports import style
from schedlab.reports.figures import BOTH, FigureRecord, FigureSkipped, describe_conditions
from schedlab.reports.figures.pred_vs_meas import BAND, identity_band, square_limits
from schedlab.reports.load import host_text
from schedlab.workloads import short_name

NAME = "fidelity"
METHODS = (PROFILE_ONLY, TRACE_CALIBRATED)
LOG_SPAN = 8.0  # log axes when the largest time is more than this many times the smallest
# A marker per model as well as a colour: the palette has 7 colours, the held-out set 8 models.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


@dataclass(frozen=True)
class FidelityPoint:
    """One plan of one model, predicted one way."""

    workload: str
    plan: str
    method: str  # PROFILE_ONLY or TRACE_CALIBRATED
    measured_s: float  # median of the timed steps
    spread_s: tuple[float, float] | None  # min, max of the timed steps
    predicted_s: float  # simulated
    calibrated_on: bool  # the prediction was calibrated on this plan's shape
    scored: bool  # counts in the error, as `schedlab fidelity` wrote (False: a held-out calibration plan)

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


@dataclass(frozen=True)
class FidelityData:
    """A `schedlab fidelity` results file, reduced to what the figure draws."""

    path: Path
    points: tuple[FidelityPoint, ...]
    host: str
    versions: dict[str, str] = field(default_factory=dict)
    size: str = "?"
    optimizer: str = "?"
    steps_per_plan: int | None = None
    calibration_plan: str | None = None  # held-out files: the plan the trace calibration used
    set_name: str = "built-in"  # the file's "set": "built-in", "held-out" or "dev"
    foreign_cpu_fracs: tuple[float, ...] = ()  # per measured plan: the CPU share other processes used
    runs: int = 1  # a re-scored file (`schedlab fidelity --held-out --rescore`): the runs its medians are over

    @property
    def methods(self) -> list[str]:
        present = {p.method for p in self.points}
        return [m for m in METHODS if m in present]

    @property
    def held_out(self) -> bool:
        """Whether the file is of the held-out protocol (two predictions per plan), on the
        held-out set or the dev set."""
        return self.set_name in PROTOCOL_SETS

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(p.workload for p in self.points))


def load_fidelity(path: str | Path) -> FidelityData:
    """Read a fidelity results file; a file that is not one is one SchedlabError naming it."""
    return fidelity_from_json(read_json(path, what="fidelity results"), Path(path))


def fidelity_from_json(d: Any, p: Path) -> FidelityData:
    """A fidelity results file's loaded JSON `d` (read from `p`), as `load_fidelity` reads it."""
    hint = "write one with `schedlab fidelity` or `schedlab fidelity --held-out`"
    if not isinstance(d, dict) or not isinstance(d.get("plans"), list):
        raise SchedlabError(f"{p} is not a fidelity results file (no list of plans); {hint}")
    set_name = str(d.get("set", "built-in"))
    # Older built-in files name no method per plan: the file says how all were predicted.
    default_method = TRACE_CALIBRATED if d.get("trace_calibration", True) else PROFILE_ONLY
    points: list[FidelityPoint] = []
    for i, r in enumerate(d["plans"]):
        try:
            method = str(r.get("method", default_method))
            if method not in METHODS:
                raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
            measured, predicted = float(r["measured_s"]), float(r["predicted_s"])
            if not (measured > 0 and predicted > 0 and math.isfinite(measured) and math.isfinite(predicted)):
                raise ValueError("measured_s and predicted_s must be positive numbers")
            spread = r.get("measured_spread_s")
            points.append(
                FidelityPoint(
                    workload=str(r["workload"]),
                    plan=str(r["plan"]),
                    method=method,
                    measured_s=measured,
                    spread_s=(float(spread[0]), float(spread[1])) if spread else None,
                    predicted_s=predicted,
                    calibrated_on=bool(r.get("in_calibration", False)),
                    scored=bool(r.get("scored", True)),
                )
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise SchedlabError(f"{p}: plans[{i}] is malformed ({type(e).__name__}: {e}); {hint}") from None
    if not points:
        raise SchedlabError(f"{p} holds no plans; {hint}")
    # One measurement per (model, plan), whatever the number of predictions of it.
    foreign = {
        (r["workload"], r["plan"]): float(r["foreign_cpu_frac"])
        for r in d["plans"]
        if isinstance(r.get("foreign_cpu_frac"), (int, float))
    }
    machine, versions, cores = d.get("machine"), d.get("versions"), d.get("cores")
    machine = machine if isinstance(machine, dict) else {}
    versions = versions if isinstance(versions, dict) else {}
    steps = d.get("steps_per_plan")
    return FidelityData(
        path=p,
        set_name=set_name,
        points=tuple(points),
        host=host_text({"host": machine, "devices": [{"cores": cores}] if isinstance(cores, int) else []}),
        versions={str(k): str(v) for k, v in versions.items()},
        size=str(d.get("size", "?")),
        optimizer=str(d.get("optimizer", "?")),
        steps_per_plan=steps if isinstance(steps, int) else None,
        calibration_plan=str(d["calibration_plan"]) if d.get("calibration_plan") else None,
        foreign_cpu_fracs=tuple(foreign.values()),
        runs=len(d["runs"]) if d.get("rescored") and isinstance(d.get("runs"), list) and d["runs"] else 1,
    )


# ---- statistics of a panel ----------------------------------------------------------------------


def mape_pct(points: Sequence[FidelityPoint]) -> float:
    return 100.0 * statistics.fmean(abs(p.error) for p in points)


def median_tau(points: Sequence[FidelityPoint]) -> float | None:
    """Median over models of Kendall's τ between predicted and measured (models with 3+ plans)."""
    from scipy.stats import kendalltau

    taus = []
    for w in dict.fromkeys(p.workload for p in points):
        ps = [p for p in points if p.workload == w]
        if len(ps) >= 3:
            tau = kendalltau([p.predicted_s for p in ps], [p.measured_s for p in ps]).statistic
            if tau is not None and math.isfinite(tau):
                taus.append(float(tau))
    return statistics.median(taus) if taus else None


# ---- the figure -----------------------------------------------------------------------------------


def draw(data: FidelityData, out_stem: Path) -> FigureRecord:
    methods = data.methods
    if not methods:
        raise FigureSkipped(f"{data.path} holds no predicted and measured plans")
    workloads = data.workloads
    every = [v for p in data.points for v in (p.predicted_s, p.measured_s, *(p.spread_s or ()))]
    ms = 1e3
    lo, hi = min(every) * ms, max(every) * ms
    log = hi / lo > LOG_SPAN
    if log:
        pad = (hi / lo) ** 0.06
        lo, hi = lo / pad, hi * pad
    else:
        pad = (hi - lo) * 0.06 or hi * 0.1
        lo, hi = max(0.0, lo - pad), hi + pad
    panels: dict[str, dict[str, Any]] = {}
    with style.paper():
        width = style.PAGE_IN if len(methods) > 1 else style.COLUMN_IN
        fig = style.figure(width, 3.5)
        axes = fig.subplots(1, len(methods), squeeze=False)[0]
        fig.subplots_adjust(wspace=0.3)
        for ax, method in zip(axes, methods, strict=True):
            pts = [p for p in data.points if p.method == method]
            scored = [p for p in pts if p.scored]
            err = mape_pct(scored) if scored else None
            tau = median_tau(scored)
            panels[method] = {"mape_pct": err, "median_kendall_tau": tau, "n_scored": len(scored), "n": len(pts)}
            _panel(ax, pts, workloads, lo, hi, log, ms)
            ax.set_title(_panel_title(data, method), fontsize=8)
            text = ("MAPE –" if err is None else f"MAPE {err:.1f}%") + f" (n = {len(scored)})"
            if tau is not None:
                text += f"\nmedian τ per model {tau:.2f}"
            # The box goes in the corner off the diagonal where fewer points are.
            over = sum(1 for p in pts if p.predicted_s > p.measured_s) > len(pts) / 2
            fx, fy, ha, va = (0.04, 0.96, "left", "top") if over else (0.96, 0.04, "right", "bottom")
            ax.text(fx, fy, text, transform=ax.transAxes, ha=ha, va=va, fontsize=7, zorder=6,
                    bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": style.GREY, "lw": 0.5})
        axes[0].set_ylabel("measured step time (ms, median)")
        handles = [_model_handle(style.colour(i), short_name(w), MARKERS[i % len(MARKERS)]) for i, w in enumerate(workloads)]
        handles.append(_model_handle("white", "calibration plan shape" if not data.held_out
                                     else "calibration plan (not scored)", edge=style.INK))
        # On the axes, below them (a figure legend is outside the box `style.save` puts the note under).
        axes[0].legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.14), ncol=5 if len(methods) > 1 else 2,
                       handletextpad=0.3, columnspacing=1.0)
        png, pdf = style.save(fig, out_stem, note=_footnote(data))
    per_model: dict[str, dict[str, Any]] = {}
    for w in workloads:
        per_model[short_name(w)] = {}
        for m in methods:
            scored = [p for p in data.points if p.workload == w and p.method == m and p.scored]
            per_model[short_name(w)][m] = {"mape_pct": round(mape_pct(scored), 3) if scored else None, "n_scored": len(scored)}
    stats = [
        f"{m}: MAPE " + ("–" if panels[m]["mape_pct"] is None else f"{panels[m]['mape_pct']:.1f}%")
        for m in methods
    ]
    return FigureRecord(
        name=NAME,
        title=f"Simulator fidelity per plan: {data.set_name} models",
        files=(png, pdf),
        sources=(data.path,),
        caption=_caption(data, methods, panels),
        basis=BOTH,
        conditions={
            "set": data.set_name,
            "host": data.host,
            "versions": data.versions,
            "size": data.size,
            "optimizer": data.optimizer,
            "steps_per_plan": data.steps_per_plan,
            "calibration_plan": data.calibration_plan,
            "foreign_cpu_frac": _busy(data.foreign_cpu_fracs),
            "axes": "log-log" if log else "linear",
            "panels": {
                m: {k: (None if v is None else round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}
                for m, d in panels.items()
            },
            "models": per_model,
        },
        conditions_text=describe_conditions(
            BOTH + " (x simulated)",
            host=data.host,
            versions=data.versions,
            stats=[f"size {data.size}", f"{data.steps_per_plan or '?'} timed steps per plan (median)", *stats],
        ),
    )


def _panel(ax: Any, pts: list[FidelityPoint], workloads: list[str], lo: float, hi: float, log: bool, ms: float) -> None:
    identity_band(ax, lo, hi, log=log, legend=False)
    for i, w in enumerate(workloads):
        colour, marker = style.colour(i), MARKERS[i % len(MARKERS)]
        for hollow in (False, True):
            ps = [p for p in pts if p.workload == w and p.calibrated_on == hollow]
            if not ps:
                continue
            below = [max(p.measured_s - p.spread_s[0], 0.0) * ms if p.spread_s else 0.0 for p in ps]
            above = [max(p.spread_s[1] - p.measured_s, 0.0) * ms if p.spread_s else 0.0 for p in ps]
            ax.errorbar(
                [p.predicted_s * ms for p in ps], [p.measured_s * ms for p in ps], yerr=[below, above], fmt=marker,
                ms=3.5, color=colour, mfc="white" if hollow else colour, mec=colour, mew=0.8, elinewidth=0.5,
                capsize=1.0, alpha=0.9, zorder=4 if hollow else 3,
            )
    square_limits(ax, lo, hi, log=log)


def _model_handle(colour: str, label: str, marker: str = "o", edge: str | None = None) -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], marker=marker, ls="none", ms=4, color=colour, mfc=colour, mec=edge or colour, label=label)


def _panel_title(data: FidelityData, method: str) -> str:
    if method == PROFILE_ONLY:
        return "profile-only: the stored profile alone"
    if data.held_out:
        return f"trace-calibrated on {data.calibration_plan or 'one plan'} of each model"
    return "trace-calibrated on one-slot program-order runs"


def _caption(data: FidelityData, methods: list[str], panels: dict[str, dict[str, Any]]) -> str:
    kind = {
        "held-out": "held-out models (never used by calibration)",
        "dev": "dev models (never used by calibration; where changes to the simulator are judged)",
    }.get(data.set_name, "built-in workloads (also calibration's training set)")
    parts = [
        f"Step time the simulator predicted (x, simulated) against the median measured on the executor (y) for "
        f"every plan of the spread, {len(data.workloads)} {kind}, coloured by model; whiskers: min to max of the "
        f"timed steps; shaded: within ±{BAND:.0%}." if data.runs == 1 else
        f"Step time the simulator predicted (x, simulated) against the median of {data.runs} measured runs (y) "
        f"for every plan of the spread, {len(data.workloads)} {kind}, coloured by model; whiskers: min to max "
        f"of the runs' medians; shaded: within ±{BAND:.0%}."
    ]
    for m in methods:
        p = panels[m]
        text = f" {m}: MAPE " + ("–" if p["mape_pct"] is None else f"{p['mape_pct']:.1f}%") + f" over {p['n_scored']} plans"
        if p["median_kendall_tau"] is not None:
            text += f", median Kendall τ per model {p['median_kendall_tau']:.2f}"
        parts.append(text + ".")
    if data.held_out and TRACE_CALIBRATED in methods:
        parts.append(f" Hollow: the plan each model was trace-calibrated on ({data.calibration_plan or '?'}), "
                     "left out of the trace-calibrated error.")
    elif any(p.calibrated_on for p in data.points):
        parts.append(" Hollow: plans of a shape used in trace calibration (separate runs).")
    return "".join(parts)


def _footnote(data: FidelityData) -> str:
    torch = data.versions.get("torch", "?")
    steps = f"{data.steps_per_plan} timed steps per plan" if data.steps_per_plan else "timed steps unknown"
    if data.runs > 1:
        steps += f", the median of {data.runs} runs"
    busy = _busy(data.foreign_cpu_fracs)
    others = (f"; other processes used a median {busy['median']:.0%}, at most {busy['max']:.0%} of the CPU "
              "while a plan was measured" if busy else "")
    return (f"Measured on {data.host}, torch {torch}, size {data.size}, optimizer {data.optimizer}, {steps}"
            f"{others}; from {data.path.name}. x: simulated.")


def _busy(fracs: Sequence[float]) -> dict[str, float] | None:
    """Median and largest share of the CPU other processes used while plans were measured."""
    return {"median": statistics.median(fracs), "max": max(fracs)} if fracs else None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m schedlab.reports.figures.fidelity RESULTS.json [OUT_DIR]`: redraw the figure."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 2:
        print("usage: python -m schedlab.reports.figures.fidelity RESULTS.json [OUT_DIR]", file=sys.stderr)
        return 2
    data = load_fidelity(args[0])
    out_dir = Path(args[1]) if len(args) == 2 else data.path.with_name(data.path.stem + "-report")
    print(*draw(data, out_dir / NAME).files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
