"""The numerics guard: per-dtype atol + rtol, no false alarm on a zero gradient, real errors caught.

The model (tests/fixtures/conv_bn.py) has a conv bias feeding batch norm, so that bias's
true gradient is zero and the executor's and eager's differ only by rounding noise: the
guard's old relative figure called that a difference of 110%.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import torch

from schedlab.errors import SchedlabError
from schedlab.exec import Executor, check_step
from schedlab.exec.check import TOLERANCES, NumericCheck, Tolerance, compare, output_diffs, tolerance_for
from schedlab.graph import Graph, OutputRole
from schedlab.machine import detect_host
from schedlab.plan import Plan, resolve
from tests.conftest import captured_workload

MODEL = "tests.fixtures.conv_bn:make"
CO_RUN = Plan(slots=2, threads=1, order="random:3")
PERTURBATION = 1e-3
Step = Callable[[dict[int, torch.Tensor]], dict[int, torch.Tensor]]


def _check(
    optimizer: str,
    plan: Plan,
    *,
    graph: Graph | None = None,
    edit: Callable[[dict[int, torch.Tensor]], None] = lambda out: None,
    tolerances: Mapping[torch.dtype, Tolerance] = TOLERANCES,
) -> NumericCheck:
    """One step of the fixture model (or of `graph`, a changed copy of its graph) under `plan`,
    its outputs passed through `edit`, checked against eager PyTorch."""
    w, c = captured_workload(MODEL, optimizer)
    g = graph or c.graph
    ex = Executor(g, resolve(g, plan, detect_host()))

    def step(inputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        out = ex.step(inputs)[0]
        edit(out)
        return out

    return check_step(w.module, g, c.input_values, step, tolerances)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("order", ["random:1", "random:2", "random:3", "random:7", "w-last"])
def test_a_zero_gradient_is_no_false_alarm(optimizer: str, order: str) -> None:
    check = _check(optimizer, Plan(slots=2, threads=1, order=order))
    assert check.ok(), check.describe()
    assert check.max_rel_diff > 0.1  # the old relative figure: the false alarm this guard ends


def test_the_zero_gradient_is_rounding_noise() -> None:
    """The premise: under the plan the conv bias gradient is nonzero noise, far inside atol."""
    w, c = captured_workload(MODEL, "sgd")
    ex = Executor(c.graph, resolve(c.graph, CO_RUN, detect_host()))
    out = ex.step({v: t.clone() for v, t in c.input_values.items()})[0]
    bias = next(d for _, d in output_diffs(w.module, c.graph, c.input_values, out) if d.name == "grad c.bias")
    assert bias.max_rel_diff > 0.1 and bias.max_abs_diff < TOLERANCES[torch.float32].atol / 10


def test_a_gradient_off_by_one_in_a_thousand_fails_and_is_named() -> None:
    _, c = captured_workload(MODEL, "sgd")
    ex = Executor(c.graph, resolve(c.graph, CO_RUN, detect_host()))
    out = ex.step({v: t.clone() for v, t in c.input_values.items()})[0]
    grads = [o for o in c.graph.outputs if o.role is OutputRole.GRAD]
    target = max(grads, key=lambda o: float(out[o.value].abs().max()))  # the largest: fc.weight
    scale = float(out[target.value].abs().max())
    tol = tolerance_for(out[target.value].dtype)
    # The test means something only if the perturbation is well past the tolerance.
    assert PERTURBATION * scale > 10 * (tol.atol + tol.rtol * scale)

    def perturb(outputs: dict[int, torch.Tensor]) -> None:
        outputs[target.value] = outputs[target.value] * (1 + PERTURBATION)

    check = _check("sgd", CO_RUN, edit=perturb)
    assert not check.ok() and not check.numerics_ok
    assert check.worst_tensor == f"grad {target.name}" and check.worst_ratio > 10
    assert check.worst_abs_diff == pytest.approx(PERTURBATION * scale, rel=1e-3)
    assert (check.atol, check.rtol) == (tol.atol, tol.rtol)
    assert f"grad {target.name}" in check.describe()
    # And the test tells tolerances apart: a guard looser than the perturbation lets it by.
    loose = {**TOLERANCES, torch.float32: Tolerance(atol=tol.atol, rtol=10 * PERTURBATION)}
    assert _check("sgd", CO_RUN, edit=perturb, tolerances=loose).ok()


def _swap_sub_inputs(graph: Graph) -> Graph:
    """A copy of `graph` whose one `a - b` of same-shaped tensors computes `b - a`."""
    [sub] = [op for op in graph.ops if op.target == "aten.sub.Tensor"]
    a, b = sub.args[:2]
    assert a != b and graph.values[a["v"]].shape == graph.values[b["v"]].shape  # type: ignore[union-attr]
    swapped = dataclasses.replace(sub, args=(b, a, *sub.args[2:]), inputs=(b["v"], a["v"]))
    return dataclasses.replace(graph, ops=tuple(swapped if op.id == sub.id else op for op in graph.ops))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_graph_with_swapped_inputs_fails(optimizer: str) -> None:
    w, c = captured_workload(MODEL, optimizer)
    bad = _swap_sub_inputs(c.graph)
    assert bad.hash != c.graph.hash
    check = _check(optimizer, CO_RUN, graph=bad)
    assert not check.ok() and check.worst_ratio > 100, check.describe()
    # The swap changes the step itself, not only some tensor near its tolerance: the
    # loss is off, by far more than a thousand times what the guard allows it.
    ex = Executor(bad, resolve(bad, CO_RUN, detect_host()))
    out = ex.step({v: t.clone() for v, t in c.input_values.items()})[0]
    loss = next(d for _, d in output_diffs(w.module, bad, c.input_values, out) if d.name == "loss loss")
    assert loss.ratio > 1000


# ---- the tolerance rule itself ------------------------------------------------------


def test_assert_close_rule_per_element() -> None:
    tol = TOLERANCES[torch.float32]
    want = torch.tensor([0.0, 1.0, 100.0])
    inside = want + torch.tensor([tol.atol, tol.atol + tol.rtol, tol.atol + 100 * tol.rtol]) * 0.9
    assert compare("t", inside, want).ok
    outside = want + torch.tensor([0.0, 0.0, (tol.atol + 100 * tol.rtol) * 1.5])
    d = compare("t", outside, want)
    assert not d.ok and d.ratio == pytest.approx(1.5, rel=0.05) and d.tolerance == tol  # float32 rounding of 100 + 2e-4


def test_non_finite_shape_dtype_and_integers() -> None:
    x = torch.tensor([1.0, float("inf"), float("nan")])
    assert compare("t", x.clone(), x).ratio == 0.0  # equal infs and NaNs: the plan did not change them
    assert compare("t", torch.tensor([1.0, 2.0, float("nan")]), x).ratio == float("inf")
    assert compare("t", torch.zeros(2, 3), torch.zeros(3, 2)).ratio == float("inf")
    assert compare("t", torch.zeros(3, dtype=torch.float64), torch.zeros(3)).ratio == float("inf")
    n = torch.tensor([3, 4])
    assert compare("t", n.clone(), n).ok and compare("t", n + torch.tensor([0, 1]), n).ratio == float("inf")
    assert compare("t", torch.tensor(0.5), torch.tensor(0.0)).ratio == pytest.approx(0.5 / TOLERANCES[torch.float32].atol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_each_float_dtype_passes_its_rounding_and_fails_a_real_error(dtype: torch.dtype) -> None:
    want = torch.linspace(-2, 2, 101, dtype=torch.float64).to(dtype)
    ulp = torch.finfo(dtype).eps * want.abs().to(torch.float64)
    assert compare("t", (want.to(torch.float64) + 4 * ulp).to(dtype), want).ok  # a few units in the last place
    assert not compare("t", want * 1.1, want).ok  # 10% off


def test_an_unknown_float_dtype_is_one_clear_error() -> None:
    with pytest.raises(SchedlabError, match=r"no tolerance for torch\.complex64"):
        tolerance_for(torch.complex64)


def test_the_readme_lists_the_table() -> None:
    text = (Path(__file__).parents[2] / "README.md").read_text()
    section = text[text.index("## Numerics guard") :]
    for dtype, tol in TOLERANCES.items():
        name = str(dtype).removeprefix("torch.")
        row = re.search(rf"^\| `{name}` \| ([^|]+) \| ([^|]+) \|", section, re.MULTILINE)
        assert row is not None, f"README's numerics guard table has no row for {name}"
        assert (float(row[1]), float(row[2])) == (tol.atol, tol.rtol)


def test_the_issues_command_line_passes(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`schedlab plan ... --slots 2 --threads 1 --order random:3`, then `schedlab trace --plan`:
    the run that exited 3 on the conv bias gradient."""
    from schedlab.cli import main

    plan = tmp_path / "p.json"
    assert main(["plan", MODEL, "--slots", "2", "--threads", "1", "--order", "random:3", "-o", str(plan)]) == 0
    capsys.readouterr()
    out = tmp_path / "t.json"
    assert main(["trace", MODEL, "--plan", str(plan), "--steps", "1", "--warmup", "0", "--out", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["numerics_ok"] is True and d["worst_ratio"] <= 1 and (d["atol"], d["rtol"]) == (1e-5, 1.3e-6)
    assert d["worst_tensor"] == d["numeric_check"]["worst_tensor"] and d["max_rel_diff"] > 0.1
    assert main(["trace", MODEL, "--plan", str(plan), "--steps", "1", "--warmup", "0", "--out", str(out)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "numerics" in x)
    assert "matches eager PyTorch: worst " in line and "atol 1e-05, rtol 1.3e-06" in line
