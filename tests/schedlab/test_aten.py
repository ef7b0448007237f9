"""`schedlab.aten.fast_callable`: where the executor calls an op through its public torch
function, that function must bind exactly the same overload and give the same result."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from schedlab.aten import PUBLIC_BINDINGS, fast_callable

aten = torch.ops.aten
x, y = torch.randn(3, 4), torch.randn(3, 4)
m, k = torch.randn(4, 5), torch.randn(3, 5)

# Per overload: calls as captured graphs make them (positional, then the schema's keyword names).
CALLS: dict[Any, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {
    aten.mm.default: [((x, m), {})],
    aten.bmm.default: [((x.view(1, 3, 4), m.view(1, 4, 5)), {})],
    aten.addmm.default: [((k, x, m), {}), ((k, x, m), {"beta": 0.5, "alpha": 2.0})],
    aten.add.Tensor: [((x, y), {}), ((x, y), {"alpha": -1.0}), ((x, 2.0), {})],
    aten.sub.Tensor: [((x, y), {}), ((x, 1), {"alpha": 3})],
    aten.mul.Tensor: [((x, y), {}), ((x, 0.5), {})],
    aten.div.Tensor: [((x, y), {}), ((x, 4), {})],
    aten.neg.default: [((x,), {})],
    aten.exp.default: [((x,), {})],
    aten.sigmoid.default: [((x,), {})],
    aten.tanh.default: [((x,), {})],
    aten.relu.default: [((x,), {})],
    aten.addcmul.default: [((x, y, x), {}), ((x, y, x), {"value": -0.1})],
    aten.clone.default: [((x,), {}), ((x.t(),), {"memory_format": torch.contiguous_format})],
    aten.cat.default: [(([x, y],), {}), (([x, y], 1), {})],
    aten.stack.default: [(([x, y],), {}), (([x, y], 1), {})],
    aten.t.default: [((x,), {})],
    aten.transpose.int: [((x, 0, 1), {})],
    aten.permute.default: [((x, [1, 0]), {})],
    aten.unsqueeze.default: [((x, 1), {})],
    aten.select.int: [((x, 0, 2), {})],
    aten.unbind.int: [((x,), {}), ((x, 1), {})],
    aten.view.default: [((x, [12]), {}), ((x, [-1, 6]), {})],
    aten.expand.default: [((x[:1], [3, 4]), {})],
    aten.sum.dim_IntList: [((x, [0]), {}), ((x, [1], True), {}), ((x, [0, 1]), {"dtype": torch.float64})],
    aten.mean.dim: [((x, [0]), {}), ((x, [1], True), {})],
}


class Record(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Any] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


def test_every_binding_has_calls_to_check() -> None:
    assert set(CALLS) == set(PUBLIC_BINDINGS)


@pytest.mark.parametrize("op", list(PUBLIC_BINDINGS), ids=str)
def test_the_public_function_binds_exactly_this_overload(op: Any) -> None:
    fn = fast_callable(op)
    assert fn is PUBLIC_BINDINGS[op]
    for args, kwargs in CALLS[op]:
        with Record() as rec:
            got = fn(*args, **kwargs)
        assert rec.calls == [op], (op, rec.calls)
        want = op._op(*args, **kwargs)
        for a, b in zip(got if isinstance(got, (tuple, list)) else [got], want if isinstance(want, (tuple, list)) else [want],
                        strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)


def test_other_overloads_keep_their_cpp_entry_point() -> None:
    assert fast_callable(aten.div.Tensor_mode) is aten.div.Tensor_mode._op
