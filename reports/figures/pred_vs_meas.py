"""Predicted (simulated) against measured step time of every validated plan.

Log-log scatter with the line y = x and a ±10% band; whiskers are the interquartile
range of the measured step times. The box gives the mean absolute percentage error of
the prediction and Kendall's τ between predicted and measured order (does the simulator
rank plans as the hardware does? that is what the search relies on).

Data: results.json (schedlab validate).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

from schedlab.reports import style
from schedlab.reports.figures import (
    BOTH,
    FigureRecord,
    FigureSkipped,
    main_for,
    median_spread_text,
    run_conditions,
    run_conditions_text,
)
from schedlab.reports.load import RESULTS_JSON, Measured, RunData

BAND = 0.10  # the shaded band: prediction within ±10%


def identity_band(ax: Any, lo: float, hi: float, *, log: bool, legend: bool) -> None:
    """Axes scale, the y = x line and the ±BAND shade of a predicted-vs-measured panel."""
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.plot([lo, hi], [lo, hi], color=style.INK, lw=0.7, zorder=1, **({"label": "y = x"} if legend else {}))
    ax.fill_between(
        [lo, hi], [lo * (1 - BAND), hi * (1 - BAND)], [lo * (1 + BAND), hi * (1 + BAND)],
        color=style.GREY, alpha=0.15, lw=0, zorder=0, **({"label": f"±{BAND:.0%}"} if legend else {}),
    )


def square_limits(ax: Any, lo: float, hi: float, *, log: bool) -> None:
    """Equal x and y ranges [lo, hi] (round ticks on log axes) and the predicted-time label."""
    if log:
        ticks = style.log_ticks(lo, hi)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(FixedLocator(ticks))
            axis.set_major_formatter(style.fmt_tick_formatter())
            axis.set_minor_locator(NullLocator())
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("predicted step time (ms, simulated)")
_BASELINE_MARKERS = ("s", "^", "v", "P", "X")


def error_pct(m: Measured) -> float:
    assert m.predicted_s is not None
    return (m.predicted_s - m.measured_s) / m.measured_s * 100.0


def mape(points: list[Measured]) -> float:
    return sum(abs(error_pct(m)) for m in points) / len(points)


def kendall_tau(points: list[Measured]) -> float | None:
    if len(points) < 3:
        return None
    from scipy.stats import kendalltau

    tau = kendalltau([m.predicted_s for m in points], [m.measured_s for m in points]).statistic
    return None if tau is None or math.isnan(tau) else float(tau)


def draw(run: RunData, out_stem: Path) -> FigureRecord:
    res = run.results
    cands = [m for m in res.candidates if m.predicted_s is not None]
    bases = [(n, m) for n, m in sorted(res.baselines.items()) if m.predicted_s is not None]
    points = cands + [m for _, m in bases]
    if not points:
        why = "; ".join(f"{label}: {reason}" for label, reason in res.excluded)
        raise FigureSkipped(f"{RESULTS_JSON} holds no plan with a predicted and a clean measured step time" +
                            (f" ({why})" if why else ""))
    best = res.best_searched
    strategies = sorted({m.strategy or "?" for m in cands})
    ms = 1e3
    lo = min(min(m.predicted_s or m.measured_s, m.spread_s[0] if m.spread_s else m.measured_s, m.measured_s) for m in points)
    hi = max(max(m.predicted_s or m.measured_s, m.spread_s[1] if m.spread_s else m.measured_s, m.measured_s) for m in points)
    pad = (hi / lo) ** 0.08 if hi > lo else 1.15
    lo_ms, hi_ms = lo * ms / pad, hi * ms * pad
    err = mape(points)
    tau = kendall_tau(points)
    with style.paper():
        fig = style.figure(style.COLUMN_IN, 3.5)
        ax = fig.add_subplot()
        identity_band(ax, lo_ms, hi_ms, log=True, legend=True)
        for si, strat in enumerate(strategies):
            pts = [m for m in cands if (m.strategy or "?") == strat and m is not best]
            if pts:
                _scatter(ax, pts, ms, marker="o", colour=style.colour(si), label=f"candidate ({strat})")
        if best is not None and best.predicted_s is not None:
            _scatter(ax, [best], ms, marker="*", colour=style.colour(strategies.index(best.strategy or "?")),
                     label="best searched plan", size=9, edge=style.INK)
        for bi, (name, m) in enumerate(bases):
            _scatter(ax, [m], ms, marker=_BASELINE_MARKERS[bi % len(_BASELINE_MARKERS)], colour="white",
                     label=f"baseline: {name}", edge=style.INK)
        square_limits(ax, lo_ms, hi_ms, log=True)
        ax.set_ylabel("measured step time (ms, median)")
        text = f"MAPE {err:.1f}% (n = {len(points)})"
        if tau is not None:
            text += f"\nKendall τ = {tau:.2f}"
        fx, fy, ha, va = _emptier_corner(points, lo_ms / ms, hi_ms / ms)
        ax.text(fx, fy, text, transform=ax.transAxes, ha=ha, va=va, fontsize=7, zorder=6,
                bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": style.GREY, "lw": 0.5})
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, handletextpad=0.3, columnspacing=1.0)
        png, pdf = style.save(
            fig,
            out_stem,
            note=_footnote(run),
        )
    conditions: dict[str, Any] = {
        **run_conditions(run),
        "mape_pct": round(err, 3),
        "excluded": [list(e) for e in res.excluded],
        "kendall_tau": None if tau is None else round(tau, 4),
        "points": [
            {
                "label": m.label,
                "role": m.role,
                "strategy": m.strategy,
                "plan_hash": m.plan_hash,
                "predicted_s": m.predicted_s,
                "median_s": m.measured_s,
                "spread_s": None if m.spread_s is None else list(m.spread_s),
                "error_pct": round(error_pct(m), 3),
            }
            for m in points
        ],
    }
    return FigureRecord(
        name="pred_vs_meas",
        title=f"Predicted vs measured step time: {run.workload}",
        files=(png, pdf),
        sources=(run.path / RESULTS_JSON,),
        caption=(
            f"Step time the simulator predicted (x, simulated) against the median measured on the executor (y) "
            f"for the {len(cands)} validated candidates and {len(bases)} baselines; whiskers: interquartile range "
            f"of the measured steps; shaded: within ±{BAND:.0%}. MAPE {err:.1f}%"
            + ("" if tau is None else f", Kendall τ {tau:.2f}")
            + "."
            + ("" if not res.excluded else " Left out (no clean measurement): "
               + "; ".join(f"{label}: {why}" for label, why in res.excluded) + ".")
        ),
        basis=BOTH,
        conditions=conditions,
        conditions_text=run_conditions_text(
            run,
            BOTH + " (x simulated)",
            plan_hashes=_hashes_text(best, len(points)),
            stats=([] if best is None else [f"best {median_spread_text(best.measured_s, best.spread_s)}"])
            + [f"MAPE {err:.1f}%"]
            + ([f"{len(res.excluded)} plan(s) without a clean measurement left out"] if res.excluded else []),
        ),
        run=run.name,
    )


def _hashes_text(best: Measured | None, n: int) -> list[str]:
    if best is None:
        return [f"{n} plans"]
    return [f"{best.plan_hash} (best)"] + ([f"and {n - 1} more"] if n > 1 else [])


def _emptier_corner(points: list[Measured], lo: float, hi: float) -> tuple[float, float, str, str]:
    """Where the error box goes: the off-diagonal corner (lower right or upper left) with fewer points."""

    def frac(v: float) -> float:
        return (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))

    def count(x0: float, x1: float, y0: float, y1: float) -> int:
        n = 0
        for m in points:
            ys = [m.measured_s, *(m.spread_s or ())]
            if x0 <= frac(m.predicted_s or m.measured_s) <= x1 and any(y0 <= frac(y) <= y1 for y in ys):
                n += 1
        return n

    lower_right = count(0.5, 1.0, 0.0, 0.22)
    upper_left = count(0.0, 0.5, 0.78, 1.0)
    if lower_right <= upper_left:
        return 0.96, 0.04, "right", "bottom"
    return 0.04, 0.96, "left", "top"


def _scatter(
    ax: Any, pts: list[Measured], ms: float, *, marker: str, colour: str, label: str,
    size: float = 4.5, edge: str | None = None,
) -> None:
    xs = [(m.predicted_s or 0.0) * ms for m in pts]
    ys = [m.measured_s * ms for m in pts]
    lo = [max(m.measured_s - m.spread_s[0], 0.0) * ms if m.spread_s else 0.0 for m in pts]
    hi = [max(m.spread_s[1] - m.measured_s, 0.0) * ms if m.spread_s else 0.0 for m in pts]
    ax.errorbar(
        xs, ys, yerr=[lo, hi], fmt=marker, ms=size, color=colour, mec=edge or colour, mew=0.6,
        elinewidth=0.6, ecolor=edge or colour, capsize=1.2, label=label, zorder=3,
    )


def _footnote(run: RunData) -> str:
    res = run.results
    reps = f"{res.repeats} repeats" if res.repeats else "repeats unknown"
    if res.steps_per_repeat:
        reps += f" × {res.steps_per_repeat} steps"
    torch = run.versions.get("torch", "?")
    return f"Measured on {run.host}, torch {torch}, {reps}; graph {run.graph_hash or '?'}. x: simulated."


if __name__ == "__main__":
    sys.exit(main_for(draw, "pred_vs_meas"))
