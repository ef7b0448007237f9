"""Arguments and steps several commands share: the workload, its capture, plans, machines."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from schedlab.paths import data_dir
from schedlab.workloads import BUILTIN_WORKLOADS, SIZES

TRACES_DIR = data_dir()
DEFAULT_SIZE = "default"  # of every command that takes a MODEL


def add_model_args(p: argparse.ArgumentParser) -> None:
    """MODEL, --size, --optimizer and --seed, with the same defaults in every command: a plan
    written with `schedlab plan` is checked against the graph `simulate` and `trace` run."""
    p.add_argument(
        "model",
        metavar="MODEL",
        help=f"a built-in workload ({', '.join(BUILTIN_WORKLOADS)}), a held-out model (heldout:NAME, see "
        "`schedlab fidelity --help`) or package.module:function returning (module, example_inputs)",
    )
    add_model_options(p)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """--size, --optimizer and --seed of `add_model_args`, for a command whose first argument
    may be something else than a MODEL (`schedlab validate RUN_DIR | MODEL`)."""
    p.add_argument("--size", choices=SIZES, default=DEFAULT_SIZE, help=f"built-in workload size (default {DEFAULT_SIZE})")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="optimizer of the step (default sgd)")
    p.add_argument("--seed", type=int, default=0, help="seed for parameters and inputs (default 0)")


def add_machine_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--machine",
        default=None,
        metavar="MACHINE",
        help="'host' (default: this machine), a preset (manycore-68, dgx-8gpu) or a machine JSON file",
    )


def add_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-cache", action="store_true",
        help="capture MODEL afresh instead of reusing the graph captured by an earlier command "
        "(cached under the data folder's graphs/, keyed by the model's source, inputs and versions)",
    )


def graph_cache_dir() -> Path:
    """Where captured graphs are cached: `graphs/` in the data folder (traces/ of a checkout)."""
    return data_dir() / "graphs"


def capture_model(args: argparse.Namespace, cache: bool = False) -> Any:
    """Load the workload named on the command line and capture its training step; with
    `cache`, through the graph cache (`schedlab.graph_cache`), so a second command on the
    same model, size, optimizer and seed skips the capture."""
    return capture_spec(args.model, args.size, args.optimizer, args.seed, cache=cache)


def capture_spec(spec: str, size: str, optimizer: str, seed: int = 0, *, cache: bool = True) -> Any:
    """(workload, captured step) of a model spec, through the graph cache unless `cache` is False."""
    step = plan_step_of(spec, size, optimizer, seed, replicas=1, cache=cache)
    return step.workload, step.full


def capture_for_plan(args: argparse.Namespace, replicas: int, cache: bool = True, micro_batches: int = 1) -> Any:
    """The `schedlab.data_parallel.PlanStep` of the command line's model for a plan with
    `replicas` or `micro_batches`: the full-batch step, and with replicas the per-replica
    steps, with micro-batches one micro-batch's step (graph cache)."""
    return plan_step_of(args.model, args.size, args.optimizer, args.seed, replicas=replicas, cache=cache,
                        micro_batches=micro_batches)


def plan_step_of(
    spec: str, size: str, optimizer: str, seed: int, *, replicas: int, cache: bool, micro_batches: int = 1
) -> Any:
    """Capture a model spec for a plan with `replicas` and `micro_batches`
    (`schedlab.microbatch.pipeline_step`; with one micro-batch `data_parallel.plan_step`),
    through the graph cache unless `cache` is False."""
    from schedlab.graph_cache import GraphCacheWarning, capture_cached
    from schedlab.microbatch import pipeline_step
    from schedlab.workloads import load_workload

    workload = load_workload(spec, size, seed=seed)
    root = graph_cache_dir() if cache else None
    with warnings_on_stderr(GraphCacheWarning):
        return pipeline_step(workload, micro_batches, lambda w: capture_cached(w, optimizer, seed, root), replicas)


def plan_steps_of(spec: str, size: str, optimizer: str, seed: int = 0, *, cache: bool = True) -> Any:
    """(replicas, micro-batches) -> `plan_step_of` a plan of that shape runs, each shape
    captured once."""
    memo: dict[tuple[int, int], Any] = {}

    def step_of(replicas: int, micro_batches: int) -> Any:
        if (replicas, micro_batches) not in memo:
            memo[replicas, micro_batches] = plan_step_of(
                spec, size, optimizer, seed, replicas=replicas, cache=cache, micro_batches=micro_batches)
        return memo[replicas, micro_batches]

    return step_of


def plan_ranks(plan: Any) -> int:
    """How many local ranks a plan needs: one more than the highest cpuK it names (1 if it
    names none), times its replicas (replica r runs on the r-th group of devices)."""
    from schedlab.errors import SchedlabError
    from schedlab.machine import cpu_index

    named = {plan.device, *plan.layer_devices.values(), *plan.op_devices.values(), *plan.device_slots,
             *plan.device_threads, *plan.pipeline_devices} - {None}
    top = 0
    for dev in named:
        k = cpu_index(dev)
        if k is None:
            raise SchedlabError(
                f"the plan places ops on device {dev!r}, which this host's local ranks (cpu0..cpu{{N-1}}) do not have; "
                "name the machine that has it with --machine (simulate), or place it on cpuK"
            )
        top = max(top, k)
    return (top + 1) * max(1, plan.replicas)


def load_profile(path: str | None, machine_is_host: bool = True):  # type: ignore[no-untyped-def]
    """The Profile, with a machine mismatch or fits left out as stale printed as one warning
    line each on stderr."""
    from schedlab.calibrate.profile import Profile, ProfileMachineWarning, ProfileRecountWarning

    with warnings_on_stderr(ProfileMachineWarning, ProfileRecountWarning):
        return Profile.load(path, check_machine=machine_is_host)


@contextmanager
def warnings_on_stderr(*categories: type[Warning]) -> Iterator[None]:
    """Warnings of `categories` raised inside, as one `schedlab: warning: ...` line each on
    stderr (no source line, no traceback; each message once); other warnings pass on as
    usual. Shown after an error inside too."""
    caught: list[warnings.WarningMessage] = []
    said: set[str] = set()
    try:
        with warnings.catch_warnings(record=True) as caught:
            for category in categories:
                warnings.simplefilter("always", category)
            yield
    finally:  # an error inside still shows the warnings that came before it
        for w in caught:
            if issubclass(w.category, categories):
                if str(w.message) not in said:
                    said.add(str(w.message))
                    print(f"schedlab: warning: {w.message}", file=sys.stderr)
            else:  # outside catch_warnings: shown (or filtered) as if never caught
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def load_plan_arg(path: str | None) -> Any:
    from schedlab.plan import Plan

    return Plan() if path is None else Plan.load(path)


def resolve_plan_arg(graph: Any, plan: Any, machine: Any, path: str | None, profile: Any = None, steps: int = 1) -> Any:
    """`resolve`; a plan from file `path` that does not fit the graph or machine names the file.
    With a `profile`, a critical-path order ranks ops by its times, as search and validate do,
    and a steady-state sequence (`steps` > 1) weighs ops by them."""
    from schedlab.errors import SchedlabError
    from schedlab.plan import resolve
    from schedlab.sim.cost import op_cost_us

    try:
        return resolve(graph, plan, machine, op_cost_us=None if profile is None else op_cost_us(profile), steps=steps)
    except SchedlabError as e:
        if path is None:
            raise
        raise SchedlabError(f"plan file {path}: {e}") from None


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")

