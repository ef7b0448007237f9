"""Capture one training step (forward, backward, optimizer update) as one Graph of aten ops.

The forward and backward come from `aot_export_module(..., trace_joint=True)`, which keeps
the weight-gradient and input-gradient matmuls of a layer as separate nodes (what
out-of-order backprop needs); an `nn.LSTM` layer stays one fused op each way, as eager
runs it (`schedlab.recurrent`). The optimizer update is written functionally in
`schedlab/optim.py` and traced per parameter with `make_fx`, so each update op knows its
layer and can start as soon as its gradient is ready.

Kinds:
- F: work the loss or an updated buffer depends on.
- B: backward work that the gradients of two or more layers depend on (so earlier layers
  wait on it), including the loss gradient seed.
- W: backward work that feeds the parameter gradients of one layer only: nothing else
  waits on it, so it may be deferred (Oh et al., EuroSys 2022).
- OPT: optimizer update.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from schedlab.errors import SchedlabError
from schedlab.flops import op_cost
from schedlab.graph import (
    COMPUTE_CLASSES,
    Graph,
    GraphInput,
    GraphOutput,
    InputRole,
    Op,
    OpKind,
    OutputRole,
    TensorMeta,
    conv_arg,
    conv_groups,
    op_class_of,
    storage_root,
)
from schedlab.op_kinds import owner_of, tag_kinds
from schedlab.optim import OPTIMIZERS, OptimizerSpec
from schedlab.recurrent import fused_lstm_capture
from schedlab.workloads import Workload

_ALIAS_OPS = {torch.ops.aten.detach.default, torch.ops.aten.alias.default, torch.ops.aten.lift_fresh.default}
# Views whose schema declares no alias (so autograd does not track them): `_unsafe_view`
# (what `matmul` reshapes with) returns its input's storage under a new shape and moves no
# data. Costed as the copy its schema suggests, the class fit of a few tiny calibration
# shapes (2-8 us each) charged a held-out model's larger ones 178 us a call against 4
# measured (mha-regressor on 16 Xeon cores, 2026-11-27: 3.6 ms of a 24.5 ms step).
UNANNOTATED_VIEWS = frozenset({"aten::_unsafe_view"})


@dataclass(frozen=True)
class Captured:
    """A Graph and the tensors of its inputs (value id -> tensor) for the first step."""

    graph: Graph
    input_values: dict[int, torch.Tensor]


class _LossTuple(nn.Module):
    """aot_export_module wants tuple outputs; user modules return a scalar loss."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.m = module

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.m(*inputs),)


def _strip(name: str) -> str:
    return name[2:] if name.startswith("m.") else name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_meta(t: Any) -> TensorMeta | None:
    if not isinstance(t, torch.Tensor):
        return None
    return TensorMeta(shape=tuple(int(s) for s in t.shape), dtype=dtype_name(t.dtype), nbytes=int(t.numel() * t.element_size()))


class _Importer:
    """Appends fx graphs to one growing list of ops and values."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.values: list[TensorMeta | None] = []
        self.inputs: list[GraphInput] = []
        self.input_values: dict[int, torch.Tensor] = {}

    def new_value(self, meta: TensorMeta | None) -> int:
        self.values.append(meta)
        return len(self.values) - 1

    def add_input(self, name: str, role: InputRole, tensor: torch.Tensor) -> int:
        v = self.new_value(tensor_meta(tensor))
        self.inputs.append(GraphInput(v, name, role))
        self.input_values[v] = tensor.detach().clone()
        return v

    def encode(self, a: Any, env: dict[fx.Node, Any], used: list[int]) -> Any:
        if isinstance(a, fx.Node):
            v = env[a]
            if not isinstance(v, int):
                raise SchedlabError(f"capture: node {a.name} is used as a tensor but is not one")
            if v not in used:
                used.append(v)
            return {"v": v}
        if isinstance(a, (list, tuple)):
            return [self.encode(x, env, used) for x in a]
        if isinstance(a, torch.dtype):
            return {"dtype": dtype_name(a)}
        if isinstance(a, torch.device):
            return {"device": str(a)}
        if isinstance(a, torch.layout):
            return {"layout": str(a).removeprefix("torch.")}
        if isinstance(a, torch.memory_format):
            return {"memory_format": str(a).removeprefix("torch.")}
        if a is None or isinstance(a, (bool, int, float, str)):
            return a
        raise SchedlabError(f"capture: cannot encode argument {a!r} of type {type(a).__name__}")

    def import_graph(
        self,
        gm: fx.GraphModule,
        placeholder_values: Sequence[int],
        kind_of: Callable[[fx.Node], OpKind],
        layer_of: Callable[[fx.Node], str | None],
        prefix: str = "",
    ) -> list[Any]:
        """Import `gm`'s ops; returns the value ids (or tuples of them) of its outputs."""
        env: dict[fx.Node, Any] = {}
        placeholders = iter(placeholder_values)
        result: list[Any] = []
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "get_attr":
                const = getattr(gm, str(node.target))
                env[node] = self.add_input(f"{prefix}{node.target}", InputRole.CONST, const)
            elif node.op == "call_function" and node.target is operator.getitem:
                src, idx = node.args
                env[node] = env[src][idx]  # type: ignore[index]
            elif node.op == "call_function" and node.target in _ALIAS_OPS:
                env[node] = env[node.args[0]]  # type: ignore[index]
            elif node.op == "call_function":
                env[node] = self._add_op(node, env, kind_of(node), layer_of(node), prefix)
            elif node.op == "output":
                outs = node.args[0]
                result = [env[o] if isinstance(o, fx.Node) else None for o in (outs if isinstance(outs, (list, tuple)) else [outs])]
            else:
                raise SchedlabError(f"capture: unsupported fx node {node.op} {node.name}")
        return result

    def _add_op(self, node: fx.Node, env: dict[fx.Node, Any], kind: OpKind, layer: str | None, prefix: str) -> Any:
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            raise SchedlabError(f"capture: node {node.name} calls {target!r}, which is not an aten op")
        used: list[int] = []
        args = tuple(self.encode(a, env, used) for a in node.args)
        kwargs = {k: self.encode(v, env, used) for k, v in node.kwargs.items()}
        val = node.meta.get("val")
        multi = isinstance(val, (list, tuple))
        vals: list[Any] = list(val) if isinstance(val, (list, tuple)) else [val]
        # A view shares storage with an input: the schema's alias set says which one, or, for
        # the views whose schema hides it (`UNANNOTATED_VIEWS`), their first argument.
        schema = target._schema
        alias_src: int | None = None
        is_view = bool(schema.returns) and schema.returns[0].alias_info is not None and not schema.returns[0].alias_info.is_write
        if schema.name in UNANNOTATED_VIEWS and node.args and isinstance(node.args[0], fx.Node):
            is_view, alias_src = True, env[node.args[0]]
        elif is_view:
            for arg_schema, a in zip(schema.arguments, node.args, strict=False):
                if arg_schema.alias_info is not None and isinstance(a, fx.Node):
                    alias_src = env[a]
                    break
        out_ids: list[int] = []
        for v in vals:
            m = tensor_meta(v)
            if m is not None and alias_src is not None:
                m = TensorMeta(m.shape, m.dtype, m.nbytes, alias_of=storage_root(self.values, alias_src))
            out_ids.append(self.new_value(m))
        in_metas = [self.values[i] for i in used]
        out_metas = [self.values[i] for i in out_ids]
        flops, nbytes = op_cost(target, node.args, node.kwargs, vals, in_metas, out_metas, is_view)
        op = Op(
            id=len(self.ops),
            name=f"{prefix}{node.name}",
            target=str(target),
            kind=kind,
            args=args,
            kwargs=kwargs,
            inputs=tuple(used),
            outputs=tuple(out_ids),
            flops=flops,
            bytes_moved=nbytes,
            layer=layer,
            is_view=is_view,
            strided=not is_view and reads_strided(op_class_of(str(target)), _traced_tensors(node.args)),
            row_len=softmax_row_len(op_class_of(str(target)), [_traced(a) for a in node.args]),
            group_channels=conv_group_channels(op_class_of(str(target)), [_traced(a) for a in node.args]),
        )
        self.ops.append(op)
        return tuple(out_ids) if multi else out_ids[0]


# Copies into a new layout: they move a permuted view's innermost contiguous rows whole, so
# only a view whose rows are short reads as strided (`reads_strided`).
COPY_CLASSES = frozenset({"clone"})
MIN_COPY_ROW = 16  # elements: a copy of rows at least this long ran at a contiguous copy's speed


def reads_strided(op_class: str, inputs: Iterable[Any]) -> bool:
    """Whether a call of `op_class` on `inputs` (tensors, or anything else, which is skipped)
    is marked `Op.strided`: a memory-bound op (not one of `COMPUTE_CLASSES`, which read a
    transposed operand as a BLAS flag) that reads a permuted view (`is_transposed`); for a
    copy (`COPY_CLASSES`), one whose innermost contiguous run (`contiguous_run`) is shorter
    than `MIN_COPY_ROW`. Capture asks it of every traced op, the sweep of every synthetic case.

    Why copies differ, timed on the 2-core AMD EPYC VM (2026-12-08, one thread, 1 MiB of
    float32, `.contiguous()` of each view): a contiguous clone 20.6 us; attention's head
    permute, (B, T, H, D) read as (B, H, T, D), 72.8-142 us at D of 1-4, 61 at 8, 21-27 at
    16-128; a transpose of the last two dimensions 152-464 us. Marked strided all alike, a
    model's head-permute copies (held-out mha-regressor: D of 32) were charged 3.1x what
    they took in its step. An elementwise op does not copy rows whole: `gelu` on the head
    permute took 1.7x, 1.7x and 1.5x its contiguous time at D of 4, 16 and 64, as on a transpose, and
    an `add` of it and a contiguous tensor 9.3x, 2.3x and 1.3x."""
    if op_class in COMPUTE_CLASSES:
        return False
    copy = op_class in COPY_CLASSES
    return any(
        isinstance(t, torch.Tensor) and is_transposed(t) and (not copy or contiguous_run(t) < MIN_COPY_ROW)
        for t in inputs
    )


def contiguous_run(t: torch.Tensor) -> int:
    """Elements of `t` that lie back to back in memory in its innermost dimensions (size-1
    dimensions skipped): its size for a contiguous tensor, D for the head permute above, 1
    for a transpose of the last two dimensions."""
    run = 1
    for size, stride in zip(reversed(t.shape), reversed(t.stride()), strict=True):
        if size == 1:
            continue
        if stride != run:
            break
        run *= int(size)
    return run


# Where each softmax class's call has its dimension; its tensor is the first argument.
SOFTMAX_DIM_ARG = {
    "_softmax": 1, "_log_softmax": 1, "_safe_softmax": 1, "_softmax_backward_data": 2, "_log_softmax_backward_data": 2,
}  # fmt: skip


def softmax_row_len(op_class: str, args: Sequence[Any]) -> int:
    """`Op.row_len` of a call of `op_class` on `args` (as called: tensors, or traced
    values): for a softmax or its backward over the innermost dimension of its tensor
    (every dimension after it of size 1), that dimension's length; otherwise 0. Capture asks
    it of every traced op, the sweep of every synthetic case."""
    at = SOFTMAX_DIM_ARG.get(op_class)
    if at is None or len(args) <= at or not isinstance(args[0], torch.Tensor) or args[0].dim() == 0:
        return 0
    shape, dim = tuple(args[0].shape), args[at]
    if not isinstance(dim, int):
        return 0
    dim %= len(shape)
    return int(shape[dim]) if all(int(n) == 1 for n in shape[dim + 1:]) else 0


def conv_group_channels(op_class: str, args: Sequence[Any]) -> tuple[int, int]:
    """`Op.group_channels` of a call of `op_class` on `args` (as called: tensors, or traced
    values): for a convolution or its backward of more than one group, its (input, output)
    channels per group, read off its weight ([out, in / groups, *kernel]); otherwise (0, 0).
    Capture asks it of every traced op, the sweep of every synthetic case."""
    groups, weight = conv_groups(op_class, args), conv_arg(op_class, args, "weight")
    if groups <= 1 or not isinstance(weight, torch.Tensor) or weight.dim() < 3:
        return (0, 0)
    return int(weight.shape[1]), int(weight.shape[0]) // groups


def _traced(a: Any) -> Any:
    """An fx node's traced value; anything else as it is."""
    return a.meta.get("val") if isinstance(a, fx.Node) else a


def _traced_tensors(args: Any) -> Iterator[Any]:
    """The traced values of the fx nodes among `args`, at any depth of lists."""
    if isinstance(args, (list, tuple)):
        for a in args:
            yield from _traced_tensors(a)
    elif isinstance(args, fx.Node):
        yield args.meta.get("val")


def is_transposed(t: torch.Tensor) -> bool:
    """Whether `t`'s dimensions are permuted: over its dimensions of more than one element
    that are not broadcast (stride 0), a stride exceeds the one before it. A transpose of
    the last two dimensions and attention's head permute ((B, T, H, D) as (B, H, T, D))
    are; a slice along the last dimension (an LSTM's gate chunks, rows still in order) and
    a broadcast are not."""
    strides = [st for size, st in zip(t.shape, t.stride(), strict=True) if size > 1 and st > 0]
    return any(a < b for a, b in itertools.pairwise(strides))


# Op names that mark a kernel only the CPU has: oneDNN's (mkldnn) fused LSTM layer and
# the CPU flash attention. A graph holding one runs on the CPU only (`cpu_only_ops`).
CPU_ONLY_MARKERS = ("_for_cpu", "mkldnn_")


def cpu_only_ops(graph: Graph) -> list[str]:
    """The distinct targets of `graph`'s ops that only a CPU runs, sorted (empty: portable)."""
    return sorted({op.target for op in graph.ops if any(m in op.target for m in CPU_ONLY_MARKERS)})


@contextlib.contextmanager
def _lowering(portable: bool) -> Iterator[None]:
    """How the export lowers what has device-specific kernels. As eager does on the CPU
    (default): an `nn.LSTM` layer as oneDNN's fused layer, attention as the CPU's flash
    kernel. `portable`: ops every device runs, for a graph that is compiled for a GPU
    although captured here (the LSTM cell unrolled into matmuls and pointwise ops,
    attention in its math form: matmuls and a softmax)."""
    if not portable:
        with fused_lstm_capture():
            yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        yield


def _check_workload_exports(workload: Workload, portable: bool = False) -> tuple[Any, Any]:
    from torch._functorch.aot_autograd import aot_export_module

    wrapper = _LossTuple(workload.module)
    try:
        with warnings.catch_warnings(), _lowering(portable):
            warnings.simplefilter("ignore")
            return aot_export_module(wrapper, list(workload.inputs), trace_joint=True, output_loss_index=0)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SchedlabError(f"cannot capture workload {workload.name!r} as a joint graph: {type(e).__name__}: {msg}") from None


def capture(workload: Workload, optimizer: str = "sgd", lr: float | None = None, *, portable: bool = False) -> Captured:
    """One training step of `workload` with `optimizer` ("sgd" or "adam") as a Graph;
    `portable`: of ops a GPU runs too (see `_lowering`), for the GPU path."""
    if optimizer not in OPTIMIZERS:
        raise SchedlabError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    spec: OptimizerSpec = OPTIMIZERS[optimizer]
    lr = spec.default_lr if lr is None else lr
    module = workload.module
    gm, sig = _check_workload_exports(workload, portable)

    imp = _Importer()
    named_params = {_strip(k): p for k, p in _LossTuple(module).named_parameters()}
    named_buffers = {_strip(k): b for k, b in _LossTuple(module).named_buffers()}
    user_iter = iter(workload.inputs)
    placeholder_values: list[int] = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        if node.name in sig.inputs_to_parameters:
            name = _strip(sig.inputs_to_parameters[node.name])
            placeholder_values.append(imp.add_input(name, InputRole.PARAM, named_params[name]))
        elif node.name in sig.inputs_to_buffers:
            name = _strip(sig.inputs_to_buffers[node.name])
            placeholder_values.append(imp.add_input(name, InputRole.BUFFER, named_buffers[name]))
        else:
            idx = len([i for i in imp.inputs if i.role is InputRole.USER])
            placeholder_values.append(imp.add_input(f"input{idx}", InputRole.USER, next(user_iter)))

    joint_outs = imp.import_graph(gm, placeholder_values, lambda n: OpKind.F, lambda n: None)
    n_mut = len(sig.buffers_to_mutate) + len(sig.user_inputs_to_mutate) + len(sig.parameters_to_mutate)
    outputs: list[GraphOutput] = []
    mutated_names = [_strip(b) for b in sig.buffers_to_mutate.values()]
    for i, v in enumerate(joint_outs[: len(sig.buffers_to_mutate)]):
        outputs.append(GraphOutput(v, mutated_names[i], OutputRole.BUFFER))
    loss_value = joint_outs[n_mut]
    outputs.append(GraphOutput(loss_value, "loss", OutputRole.LOSS))
    grad_names = [_strip(p) for p in sig.backward_signature.gradients_to_parameters.values()]
    grads: dict[str, int] = {}
    for name, v in zip(grad_names, joint_outs[n_mut + len(sig.user_outputs):], strict=True):
        if v is not None:
            grads[name] = v
            outputs.append(GraphOutput(v, name, OutputRole.GRAD))

    param_of_value = {i.value: i.name for i in imp.inputs if i.role is InputRole.PARAM}
    forward_outputs = [o.value for o in outputs if o.role in (OutputRole.LOSS, OutputRole.BUFFER)]
    imp.ops = tag_kinds(imp.ops, imp.values, forward_outputs, grads, param_of_value)

    # Optimizer update: shared scalar work once, then one traced update per parameter.
    param_values = {i.name: i.value for i in imp.inputs if i.role is InputRole.PARAM}
    shared_inputs = [imp.add_input(f"{optimizer}.{n}", InputRole.OPT_STATE, t) for n, t in spec.shared_state().items()]
    shared_gm = spec.trace_shared(lr)
    shared_outs = imp.import_graph(shared_gm, shared_inputs, lambda n: OpKind.OPT, lambda n: None, prefix="opt.")
    for name, v in zip(spec.shared_state(), shared_outs[: len(shared_inputs)], strict=True):
        outputs.append(GraphOutput(v, f"{optimizer}.{name}", OutputRole.OPT_STATE))
    scalars = shared_outs[len(shared_inputs):]
    for pname, g in grads.items():
        p = named_params[pname]
        layer = owner_of(pname) or None
        state = spec.param_state(p)
        state_inputs = [imp.add_input(f"{pname}.{s}", InputRole.OPT_STATE, t) for s, t in state.items()]
        upd_gm = spec.trace_update(p, state, lr)
        outs = imp.import_graph(
            upd_gm,
            [param_values[pname], g, *state_inputs, *scalars],
            lambda n: OpKind.OPT,
            lambda n, _layer=layer: _layer,  # type: ignore[misc]
            prefix=f"opt[{pname}].",
        )
        outputs.append(GraphOutput(outs[0], pname, OutputRole.PARAM))
        for s, v in zip(state, outs[1:], strict=True):
            outputs.append(GraphOutput(v, f"{pname}.{s}", OutputRole.OPT_STATE))

    graph = Graph(
        name=workload.name,
        inputs=tuple(imp.inputs),
        outputs=tuple(outputs),
        ops=tuple(imp.ops),
        values=tuple(imp.values),
        meta={
            "size": workload.size,
            "optimizer": optimizer,
            "lr": lr,
            "torch": torch.__version__,
            "params": len(named_params),
            "param_elements": int(sum(p.numel() for p in named_params.values())),
            **({"portable": True} if portable else {}),
        },
    )
    graph.validate()
    return Captured(graph=graph, input_values=imp.input_values)
