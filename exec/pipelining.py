"""torch's own pipeline parallelism, the side-by-side reference for schedlab's pipeline plans.

`PipeliningStepper` runs a pipeline plan's stages, micro-batches and schedule under
`torch.distributed.pipelining` inside the multi-process executor's ranks (`schedlab bench
--pipelining`), so schedlab's pipelined step and torch's are timed in the same processes,
alternating step by step, as `schedlab.exec.ddp` does for data parallelism.

The same layer split: each plan stage's layers (`schedlab.pipeline_stages.stage_layers`)
are cut out of the eager model. torch runs a stage as one module whose forward takes one
activation and returns one, so the model must be a sequence of such pieces; that is
written out for the built-in workloads whose layer sequence is explicit (`SEGMENTS`:
mlp's Linear+ReLU pairs and head; transformer's embedding, each block's attention half
and MLP half, and the final norm with the head). A stage must be a run of whole pieces:
a cut inside one (e.g. between a transformer block's two MLP linears) is refused with
the cut points that would work. Every other model (held-out ones, users' own) is cut by
torch's own tracer frontend (`torch.distributed.pipelining.pipeline`, `traced_stages`):
a split point at the first layer of each later plan stage; the model's forward returns
its loss, which is then the schedule's loss (ops outside any layer, such as a residual
add, may fall on the other side of a cut than in schedlab's stages). A cut the tracer
cannot make (a layer that is not called as a module) is one clear error on the ranks.

Everything else matches the plan: the same full batch split into the same micro-batches
(`torch.chunk` along dim 0), the same initial values (the workload's seed), the same loss
(the workload's, per micro-batch, gradients averaged over micro-batches), the optimizer
and learning rate of the captured step, and the plan's intra-op threads. The pipeline's
point-to-point transfers run on their own group of all ranks (made on every rank at the
same point, as DDP's is), so they can never be matched against a schedlab transfer.

With R data-parallel replicas (`replicas` in the spec; `schedlab.pipeline_replicas`),
replica r is ranks r*P .. r*P+P-1, each its own pipeline group, on its share of the batch
(`torch.chunk` into R, then micro-batches). Each written-out stage module is wrapped in
DistributedDataParallel over the group of the R ranks that hold it (the plan's
`bucket_mb` as `bucket_cap_mb`), which torch's pipelining stage runs under `no_sync`
until a step's last backward, as its documentation has stages combined with DDP. A
traced stage cannot be wrapped (torch's traced stage reads its graph module's graph), so
its gradients are averaged by hand after the schedule's step: one flat all-reduce per
stage over the same group, without DDP's overlap with the last backward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from schedlab.errors import SchedlabError
from schedlab.exec.threads import set_intra_op_threads
from schedlab.optim import OPTIMIZERS
from schedlab.workloads import load_workload

PIPELINING_KIND = "pipelining"  # the `kind` of a job's side-by-side spec that runs this
PIPELINING_KEYS = (
    "spec",
    "size",
    "seed",
    "optimizer",
    "lr",
    "threads",
    "schedule",
    "micro_batches",
    "stage_layers",
    "stage_ranks",
)

# Plan schedule name (its base, before ':') -> torch.distributed.pipelining class name.
TORCH_SCHEDULES: dict[str, str] = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "zbv": "ScheduleZBVZeroBubble",
}
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")  # torch takes one stage per rank for these


@dataclass(frozen=True)
class Segment:
    """A piece of a model torch can run as (part of) a stage: one activation in, one out."""

    layers: tuple[str, ...]  # capture's layer names inside it, forward order
    module: nn.Module


class _Chain(nn.Module):
    """A stage: its segments run one after the other."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: Tensor) -> Tensor:
        for part in self.parts:
            x = part(x)
        return x


class _MlpLayer(nn.Module):
    def __init__(self, linear: nn.Module, act: nn.Module) -> None:
        super().__init__()
        self.linear, self.act = linear, act

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.act(self.linear(x))
        return out


class _Embed(nn.Module):
    def __init__(self, tok_emb: nn.Module, pos_emb: nn.Parameter) -> None:
        super().__init__()
        self.tok_emb, self.pos_emb = tok_emb, pos_emb

    def forward(self, tokens: Tensor) -> Tensor:
        out: Tensor = self.tok_emb(tokens) + self.pos_emb  # [B, T, C]
        return out


class _AttnHalf(nn.Module):
    """x + attn(ln1(x)): the first residual half of a pre-norm block."""

    def __init__(self, ln: nn.Module, attn: nn.Module, mask: Tensor) -> None:
        super().__init__()
        self.ln, self.attn = ln, attn
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.attn(self.ln(x), self.mask)


class _MlpHalf(nn.Module):
    """x + mlp(ln2(x)): the second residual half of a pre-norm block."""

    def __init__(self, ln: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.ln, self.mlp = ln, mlp

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mlp(self.ln(x))


def _mlp_segments(model: nn.Module) -> list[Segment]:
    body = model.get_submodule("body")
    assert isinstance(body, nn.Sequential)
    segs = [Segment((f"body.{k}",), _MlpLayer(body[k], body[k + 1])) for k in range(0, len(body), 2)]
    return [*segs, Segment(("head",), model.get_submodule("head"))]


def _transformer_segments(model: nn.Module) -> list[Segment]:
    pos = model.get_parameter("pos_emb")
    mask = model.get_buffer("causal_mask")
    segs = [Segment(("tok_emb",), _Embed(model.get_submodule("tok_emb"), pos))]
    for b in range(len(list(model.get_submodule("blocks").children()))):
        p = f"blocks.{b}"
        attn = _AttnHalf(model.get_submodule(f"{p}.ln1"), model.get_submodule(f"{p}.attn"), mask)
        segs.append(Segment((f"{p}.ln1", f"{p}.attn.qkv", f"{p}.attn.proj"), attn))
        mlp = _MlpHalf(model.get_submodule(f"{p}.ln2"), model.get_submodule(f"{p}.mlp"))
        segs.append(Segment((f"{p}.ln2", f"{p}.mlp.0", f"{p}.mlp.2"), mlp))
    final = nn.Sequential(model.get_submodule("ln_f"), model.get_submodule("head"))
    return [*segs, Segment(("ln_f", "head"), final)]


def _class_loss(out: Tensor, target: Tensor) -> Tensor:
    """The workloads' cross-entropy: [B, classes] logits, or [B, T, V] with [B, T] targets."""
    return F.cross_entropy(out.flatten(0, -2), target.flatten())


# Workload -> (its segments, its loss on the last segment's output and the target input).
SEGMENTS: dict[str, tuple[Callable[[nn.Module], list[Segment]], Callable[[Tensor, Tensor], Tensor]]] = {
    "mlp": (_mlp_segments, _class_loss),
    "transformer": (_transformer_segments, _class_loss),
}


class _InputsAtTheFront(nn.Module):
    """`model` whose inputs are first copied, so that the tracer's first stage takes every
    model input and later stages get the ones they read (labels, say) from the stage before:
    torch's stages take only activations from their predecessor. Its loss comes out as a
    1-element tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: Tensor) -> Tensor:
        loss: Tensor = self.model(*(x.clone() for x in inputs))
        return loss.reshape(1)  # the schedule concatenates micro-batches' outputs: not 0-d


def _own_loss(out: Tensor, target: Tensor) -> Tensor:
    """A traced model's last stage returns the model's loss: the schedule's loss is that."""
    return out.sum()


def traced_stages(model: nn.Module, inputs: Sequence[Tensor], stage_layers: list[list[str]], micro_batches: int) -> Any:
    """torch's split of `model` (a `torch.distributed.pipelining.Pipe`) into the plan's
    stages: its tracer, with a split point at the first layer of each later stage, on one
    micro-batch of `inputs`. A SchedlabError when the tracer cannot cut there."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    split = {f"model.{st[0]}": SplitPoint.BEGINNING for st in stage_layers[1:] if st}
    example = tuple(x.chunk(micro_batches)[0] for x in inputs)
    try:
        pipe = pipeline(_InputsAtTheFront(model), mb_args=example, split_spec=split)
    except Exception as e:
        raise SchedlabError(f"torch's pipeline tracer could not split the model before layers {list(split)}: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    _contiguous_boundaries(pipe)
    if pipe.num_stages != len(stage_layers):
        raise SchedlabError(
            f"torch's pipeline tracer made {pipe.num_stages} stage(s) of the plan's {len(stage_layers)}: a stage "
            f"begins at a layer it does not call as a module ({', '.join(st[0] for st in stage_layers[1:] if st)}); "
            "cut the plan's stages "
            "elsewhere (--stage-cuts)")
    return pipe


def _contiguous_boundaries(pipe: Any) -> None:
    """Make every tensor that crosses stages contiguous, in `pipe`'s stage graphs: gloo sends
    and receives contiguous buffers only, and torch sizes a stage's receive buffer with the
    traced value's strides (an `nn.LSTM(batch_first=True)` output is a transposed view).
    Each stage returns its outputs `.contiguous()`, and each stage's inputs are traced as
    contiguous; within a stage nothing changes."""
    import torch.fx

    for sub in pipe.split_gm.children():
        if isinstance(sub, torch.fx.GraphModule) and _contiguous_stage(sub.graph):
            sub.recompile()


def _contiguous_stage(graph: Any) -> bool:
    """`_contiguous_boundaries` on one stage's graph; whether it changed anything."""
    import torch.fx

    changed = False
    for node in list(graph.nodes):
        val = node.meta.get("val")
        if node.op == "placeholder" and isinstance(val, Tensor) and not val.is_contiguous():
            node.meta["val"] = val.contiguous()
            changed = True
        elif node.op == "output":
            made: dict[Any, Any] = {}
            for arg in _nodes_in(node.args):
                v = arg.meta.get("val")
                if isinstance(v, Tensor) and not v.is_contiguous() and arg not in made:
                    with graph.inserting_before(node):
                        made[arg] = graph.call_method("contiguous", (arg,))
                    made[arg].meta["val"] = v.contiguous()
            if made:
                node.args = torch.fx.node.map_arg(node.args, partial(_swapped, made))
                changed = True
    return changed


def _swapped(made: dict[Any, Any], node: Any) -> Any:
    return made.get(node, node)


def _nodes_in(args: Any) -> list[Any]:
    import torch.fx

    found: list[Any] = []
    torch.fx.node.map_arg(args, found.append)
    return found


def torch_schedule_name(schedule: object) -> str:
    """The torch.distributed.pipelining class for a plan's schedule, or a SchedlabError."""
    if not isinstance(schedule, str):
        raise SchedlabError(
            "--pipelining needs a plan with a named schedule (one of "
            f"{', '.join(TORCH_SCHEDULES)}), not one written out action by action"
        )
    base = schedule.strip().partition(":")[0]
    if base not in TORCH_SCHEDULES:
        raise SchedlabError(
            f"schedule {schedule!r} has no counterpart in torch.distributed.pipelining that runs the same actions; "
            f"--pipelining compares {', '.join(n + (':V' if n == 'interleaved' else '') for n in TORCH_SCHEDULES)}"
        )
    return TORCH_SCHEDULES[base]


def stage_modules(model: nn.Module, spec: str, stage_layers: list[list[str]]) -> list[nn.Module]:
    """Each plan stage of `model` (workload `spec`, one of `SEGMENTS`) as one module, built
    from the model's own submodules (shared, not copied), or a SchedlabError naming cut
    points that work."""
    if spec not in SEGMENTS:
        raise SchedlabError(f"{spec!r} has no pieces written out ({', '.join(SEGMENTS)} do); use traced_stages")
    segments = SEGMENTS[spec][0](model)
    flat = [lay for s in segments for lay in s.layers]
    wanted = [lay for st in stage_layers for lay in st]
    if flat != wanted:
        raise SchedlabError(
            f"the plan's stages hold layers {wanted}, but {spec}'s pieces for torch hold {flat}; "
            "the plan was made for another model"
        )
    starts = {}  # layer index -> segment index, for each segment's first layer
    k = 0
    for i, s in enumerate(segments):
        starts[k] = i
        k += len(s.layers)
    out: list[nn.Module] = []
    k = 0
    for st in stage_layers:
        a, b = k, k + len(st)
        if a not in starts or (b < len(flat) and b not in starts):
            bad = b if a in starts else a
            ok = ", ".join(str(c) for c in sorted(starts) if c > 0)
            raise SchedlabError(
                f"a stage cut at layer {bad} ({flat[bad]}) falls inside one of {spec}'s pieces torch runs whole; "
                f"give the plan stage cut points (--stage-cuts) among: {ok}"
            )
        end = starts[b] if b < len(flat) else len(segments)
        out.append(_Chain([s.module for s in segments[starts[a] : end]]))
        k = b
    return out


class PipeliningStepper:
    """One rank of torch's pipelined training loop (job spec `check_pipelining_spec`, rank
    `rank` of `world`): `timed_step()` runs and times steps."""

    def __init__(self, spec: dict[str, Any], rank: int, world: int, timeout: timedelta) -> None:
        from torch.distributed import pipelining

        if not dist.is_initialized():
            raise SchedlabError("PipeliningStepper runs inside a rank: initialise the default process group first")
        ranks = [int(r) for r in spec["stage_ranks"]]
        R = int(spec.get("replicas", 1))
        if R < 1 or world % R:
            raise SchedlabError(f"{R} replicas do not divide the {world} ranks")
        P = world // R  # ranks per pipeline; replica r is ranks r*P .. r*P+P-1
        if sorted(set(ranks)) != list(range(P)):
            raise SchedlabError(f"the plan's stages run on ranks {ranks}; torch's pipeline needs every one of {P}")
        name = str(spec["schedule"])
        cls_name = torch_schedule_name(name)
        # Every rank makes every group, in one order (see the module doc); each transfer waits at
        # most `timeout` (the job's collective timeout, as the rank's default group's).
        pipes = [dist.new_group(list(range(r * P, (r + 1) * P)), timeout=timeout) for r in range(R)]
        peers = [dist.new_group([r * P + d for r in range(R)], timeout=timeout) for d in range(P)] if R > 1 else []
        replica, local = divmod(rank, P)
        group = pipes[replica]
        workload = load_workload(str(spec["spec"]), str(spec["size"]), seed=int(spec["seed"]))
        model = workload.module
        mine = [s for s, r in enumerate(ranks) if r == local]
        layers = [list(x) for x in spec["stage_layers"]]
        M = int(spec["micro_batches"])
        cpu = torch.device("cpu")
        modules: dict[int, nn.Module] = {}
        if str(spec["spec"]) in SEGMENTS:  # pieces written out: the model's own modules, then its loss
            pieces = stage_modules(model, str(spec["spec"]), layers)
            modules = {s: pieces[s] for s in mine}
            stages = [pipelining.PipelineStage(pieces[s], s, len(pieces), cpu, group=group) for s in mine]
            loss = SEGMENTS[str(spec["spec"])][1]
            x, target = (t.chunk(R)[replica] for t in workload.inputs)
            inputs: tuple[Tensor, ...] = (x,)
        else:  # torch's tracer cuts the model, whose forward returns its loss
            inputs = tuple(t.chunk(R)[replica] for t in workload.inputs)
            pipe = traced_stages(model, inputs, layers, M)  # traced at this replica's micro-batch
            modules = {s: pipe.get_stage_module(s) for s in mine}
            stages = [pipe.build_stage(s, cpu, group=group) for s in mine]
            loss = _own_loss
            target = torch.zeros(inputs[0].shape[0])  # a stand-in, split as the batch is
        self.reduce_by_hand: list[tuple[list[Tensor], Any]] = []  # traced stages: (params, group)
        if R > 1 and str(spec["spec"]) not in SEGMENTS:  # a traced stage runs its graph module itself
            self.reduce_by_hand = [([p for p in m.parameters() if p.requires_grad], peers[local])
                                   for m in modules.values()]
        elif R > 1:  # each stage's gradients averaged over its replicas, once per step
            for stage in stages:
                if any(p.requires_grad for p in stage.submod.parameters()):
                    # find_unused_parameters: without it DDP records every micro-batch's
                    # backward (no_sync ones too) for its bucket rebuild, and its reducer
                    # then fails an internal assert on the second step (torch 2.13)
                    stage.submod = nn.parallel.DistributedDataParallel(
                        stage.submod, process_group=peers[local], bucket_cap_mb=float(spec.get("bucket_mb", 25.0)),
                        find_unused_parameters=True)
        n = len(layers)
        cls = getattr(pipelining, cls_name)
        base = name.partition(":")[0]
        if base in SINGLE_STAGE_SCHEDULES:
            if len(stages) != 1:
                raise SchedlabError(f"schedule {name!r} runs one stage per rank; rank {rank} holds stages {mine}")
            self.schedule = cls(stages[0], M, loss_fn=loss)
        else:
            self.schedule = cls(stages, M, loss_fn=loss)
        params = [p for m in modules.values() for p in m.parameters()]
        self.params = {f"stage{s}.{k}": p for s, m in modules.items() for k, p in m.named_parameters()}
        self.optimizer = OPTIMIZERS[str(spec["optimizer"])].make_torch(params, float(spec["lr"]))
        self.first = 0 in mine
        self.last = n - 1 in mine
        self.inputs, self.target = inputs, target
        self.threads = int(spec["threads"])

    def _step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        args = self.inputs if self.first else ()
        kwargs = {"target": self.target, "losses": []} if self.last else {}
        self.schedule.step(*args, **kwargs)
        for params, group in self.reduce_by_hand:  # a traced stage's gradients: one flat all-reduce
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, group=group)
                flat.div_(dist.get_world_size(group))
                k = 0
                for g in grads:
                    g.copy_(flat[k : k + g.numel()].view_as(g))
                    k += g.numel()
        self.optimizer.step()

    def timed_step(self, steps: int = 1) -> tuple[int, int]:
        """Run `steps` steps back to back; (start, wall) in ns on `time.perf_counter_ns`."""
        before = set_intra_op_threads(self.threads)
        try:
            t0 = time.perf_counter_ns()
            for _ in range(steps):
                self._step()
            return t0, time.perf_counter_ns() - t0
        finally:
            set_intra_op_threads(before)

    def parameters(self) -> dict[str, Tensor]:
        """This rank's stages' parameters, named stage{S}.{path in the stage module}."""
        return {n: p.detach() for n, p in self.params.items()}


def check_pipelining_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A job's pipelining side-by-side spec: the workload (spec, size, seed), optimizer, lr,
    threads, the plan's schedule name and micro-batches, each stage's layers and rank (in
    the first replica), and optionally its replicas and their gradient bucket size."""
    missing = [k for k in PIPELINING_KEYS if k not in spec]
    if missing:
        raise SchedlabError(f"the job's pipelining spec lacks {', '.join(missing)}")
    return {"kind": PIPELINING_KIND, **{k: spec[k] for k in PIPELINING_KEYS},
            "want_params": bool(spec.get("want_params", False)), "replicas": int(spec.get("replicas", 1)),
            "bucket_mb": float(spec.get("bucket_mb", 25.0))}
