"""Profile: JSON round-trip, clear errors on bad files, machine warnings, cost lookups."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest

from schedlab.calibrate import DEFAULT_PROFILE_PATH, Profile, ProfileMachineWarning, ProfileRecountWarning, signature
from schedlab.errors import SchedlabError
from schedlab.flops import FLOP_COUNTING
from schedlab.machine import Device, Machine
from tests.calibrate.factories import DISPATCH, FALLBACK_MODEL, MM_MODEL, make_op, make_profile

HOST_FP = {"cpu_model": "Test CPU", "cores": 2, "torch": "2.13.0"}


def machine(cpu_model: str = "Test CPU", cores: int = 2, torch: str = "2.13.0") -> Machine:
    return Machine(
        name="m",
        devices=(Device(id="cpu0", kind="cpu", cores=cores, memory_bytes=2**30),),
        host={"cpu_model": cpu_model, "torch": torch},
    )


def test_default_path_is_under_repo_traces() -> None:
    assert DEFAULT_PROFILE_PATH.parts[-2:] == ("traces", "profile.json")
    assert (DEFAULT_PROFILE_PATH.parent.parent / "calibrate" / "profile.py").exists()


def test_json_round_trip(tmp_path: Path) -> None:
    op = make_op()
    p = make_profile(signatures={signature(op): {1: 123.25, 2: 70.5}})
    path = p.save(tmp_path / "p.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = Profile.load(path, machine=machine())
    assert q.to_json() == p.to_json()
    d = json.loads(path.read_text())
    assert d["schema"] == "schedlab.profile" and d["version"] == 2
    assert d["signatures"][signature(op)] == {"1": 123.25, "2": 70.5}
    assert set(d["classes"]["mm"]) >= {"model", "params", "heldout_mape", "n_points"}
    assert q.kernel_us(op, 2) == 70.5


def test_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(SchedlabError, match=r"profile file not found: .*nope\.json.*calibrate"):
        Profile.load(tmp_path / "nope.json")


def test_not_json_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"schema": "schedlab.profile", "version": 1,')
    with pytest.raises(SchedlabError, match=r"profile file .*p\.json is not valid JSON \(line 1"):
        Profile.load(path)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema="schedlab.trace"), r'is not a schedlab profile \(missing "schema": "schedlab.profile"\)'),
        (lambda d: d.update(version=7), r"profile version 7; this schedlab reads versions 1, 2 \(re-run"),
        (lambda d: d.pop("dispatch"), r"corrupt profile file .*: bad dispatch: missing field 'dispatch'"),
        (lambda d: d["dispatch"].pop("op_us"), r"bad dispatch: missing field 'op_us'"),
        (lambda d: d["classes"]["mm"]["params"].update(a_us=-1), r"bad classes\.mm: parameter a_us must be .* >= 0"),
        (lambda d: d["classes"]["mm"].update(model="magic"), r"bad classes\.mm: unknown model 'magic'"),
        (lambda d: d["signatures"].update(x={"one": 3.0}), r"bad signatures\['x'\]: invalid literal"),
        (lambda d: d["signatures"].update(x={"1": "fast"}), r"bad signatures\['x'\]: expected a number"),
        (lambda d: d.update(quick="yes"), r"bad quick: field 'quick' has type str"),
        (lambda d: d["corun"].update(views_wait="yes"), r"bad corun: views_wait must be true or false"),
    ],
)
def test_corrupt_profile_is_one_clear_error(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    d = make_profile(signatures={"x": {1: 1.0}}).to_json()
    mutate(d)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(SchedlabError, match=message):
        Profile.load(path, check_machine=False)


def test_top_level_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text("[1, 2]")
    with pytest.raises(SchedlabError, match="is not a schedlab profile"):
        Profile.load(path)


def test_profile_from_another_machine_warns_naming_the_fields(tmp_path: Path) -> None:
    path = make_profile(machine={**HOST_FP, "cores": 68}).save(tmp_path / "p.json")
    with pytest.warns(ProfileMachineWarning) as record:
        p = Profile.load(path, machine=machine())
    assert len(record) == 1
    msg = str(record[0].message)
    assert "cores: profile has 68, this machine has 2" in msg
    assert "cpu_model" not in msg and "torch" not in msg
    assert p.machine["cores"] == 68  # it still loads


ATTENTION = "_scaled_dot_product_flash_attention_for_cpu"


def test_fits_made_before_their_class_was_counted_anew_are_left_out_with_one_warning(tmp_path: Path) -> None:
    """Attention fitted on one FLOP per output element would be applied to its quadratic
    count (`schedlab.flops.FLOP_COUNTING`): a profile without the current counting drops it."""
    p = make_profile(machine=HOST_FP)
    fits = {"mm": p.classes["mm"], ATTENTION: p.classes["mm"], f"{ATTENTION}_backward[strided]": p.classes["mm"]}
    old = dataclasses.replace(p, classes=fits)
    with pytest.warns(ProfileRecountWarning, match=rf"FLOPs of {ATTENTION}, {ATTENTION}_backward\[strided\] anew"):
        q = Profile.load(old.save(tmp_path / "old.json"), machine=machine())
    assert set(q.classes) == {"mm"} and q.meta["recounted_dropped"] == [ATTENTION, f"{ATTENTION}_backward[strided]"]
    op = make_op(target=f"aten.{ATTENTION}.default", flops=4e7, nbytes=400_000)
    assert q.kernel_us(op, 1) != old.kernel_us(op, 1)  # the roofline, not the stale fit
    new = dataclasses.replace(old, meta={**old.meta, "flop_counting": FLOP_COUNTING})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert set(Profile.load(new.save(tmp_path / "new.json"), machine=machine()).classes) == set(fits)


def test_machine_mismatch_lists_every_differing_field() -> None:
    p = make_profile()
    assert p.machine_mismatch(machine()) == []
    diffs = p.machine_mismatch(machine(cpu_model="Other", torch="2.12.0"))
    assert [d.split(":")[0] for d in diffs] == ["cpu_model", "torch"]


def test_signature_beats_class_model() -> None:
    op = make_op(flops=2e6)
    assert make_profile().kernel_us(op, 1) == pytest.approx(MM_MODEL.kernel_us(2e6, op.bytes_moved, 1))
    p = make_profile(signatures={signature(op): {1: 500.0, 2: 260.0}})
    assert p.kernel_us(op, 1) == 500.0
    assert p.kernel_us(op, 2) == 260.0


def test_unmeasured_threads_interpolate_then_follow_the_class_shape() -> None:
    op = make_op(flops=2e8)
    p = make_profile(signatures={signature(op): {1: 1000.0, 4: 400.0}})
    # between measured counts: linear in 1/threads
    w = (1 / 2 - 1 / 4) / (1 - 1 / 4)
    assert p.kernel_us(op, 2) == pytest.approx(w * 1000.0 + (1 - w) * 400.0)
    # beyond: the class model's ratio from the nearest measured count
    ratio = MM_MODEL.kernel_us(op.flops, op.bytes_moved, 8) / MM_MODEL.kernel_us(op.flops, op.bytes_moved, 4)
    assert p.kernel_us(op, 8) == pytest.approx(400.0 * ratio)
    assert p.kernel_us(op, 8) < 400.0


def test_unknown_class_uses_the_fallback() -> None:
    op = make_op(target="aten.weird_op.default", flops=100.0, nbytes=1_000_000)
    assert make_profile().kernel_us(op, 1) == pytest.approx(FALLBACK_MODEL.kernel_us(100.0, 1_000_000, 1))
    assert make_profile().kernel_us(op, 1) == pytest.approx(101.0)


def test_views_cost_only_dispatch() -> None:
    view = make_op(target="aten.t.default", is_view=True, args=({"v": 0},))
    p = make_profile(signatures={signature(view): {1: 99.0}})
    assert p.kernel_us(view, 1) == 0.0
    assert p.dispatch_us(view) == DISPATCH.view_us
    assert p.dispatch_us(make_op()) == DISPATCH.op_us


def test_corun_slowdown_mixes_memory_share_and_scales_with_busy_cores() -> None:
    p = make_profile()
    mm = make_op()  # compute-bound: its class model has no memory term; 20 us of work, 2 us fixed
    mem = make_op(target="aten.relu.default", flops=1e3, nbytes=10**7)  # fallback: memory only
    assert p.corun_slowdown(mm, 0, 8) == 1.0
    assert p.corun_slowdown(mm, 7, 8) == pytest.approx(1.0 + 0.1 * 20 / 22)  # the work slows, not the fixed cost
    assert p.corun_slowdown(mem, 7, 8) == pytest.approx(1.5, rel=1e-3)
    assert p.corun_slowdown(mem, 1, 2) == pytest.approx(1.5, rel=1e-3)
    assert 1.0 < p.corun_slowdown(mem, 3, 8) < 1.5
    assert p.corun_slowdown(mem, 5, 1) == 1.0


def test_a_tiny_op_is_all_fixed_cost_and_hardly_slows_next_to_another() -> None:
    p = make_profile()
    tiny = make_op(flops=2.0, nbytes=12)  # 2e-5 us of work next to 2 us of fixed cost
    assert p.corun_slowdown(tiny, 1, 2) == pytest.approx(1.0, abs=1e-5)


def test_kernel_lookup_is_cached_per_op_and_correct_for_equal_ops() -> None:
    a, b = make_op(op_id=0), make_op(op_id=1)
    p = make_profile(signatures={signature(a): {1: 42.0}})
    assert signature(a) == signature(b)  # same work, same non-tensor args
    assert p.kernel_us(a, 1) == p.kernel_us(b, 1) == 42.0
    assert p.kernel_us(a, 1) == 42.0


def test_dispatch_for_corun_slots() -> None:
    p = make_profile()
    op, view = make_op(), make_op(target="aten.t.default", is_view=True, args=({"v": 0},))
    q = p.for_slots(2)
    assert q.dispatch_us(op) == DISPATCH.corun_op_us
    assert q.dispatch_us(view) == pytest.approx(DISPATCH.view_us * DISPATCH.corun_op_us / DISPATCH.op_us)
    assert q.for_slots(1).dispatch_us(op) == DISPATCH.op_us
    assert q.to_json() == p.to_json()  # a use of the profile, not part of it


def test_oversubscription_factor_applies_only_when_others_fill_every_core() -> None:
    import dataclasses

    from schedlab.calibrate.corun import CorunFigures
    from tests.calibrate.factories import fit, make_op, make_profile

    base = make_profile()
    prof = dataclasses.replace(
        base,
        corun=CorunFigures(
            mem_slowdown=1.0, compute_slowdown=1.0, gil_slowdown=1.0, measured=True, oversub_mem=2.0, oversub_compute=2.0
        ),
    )
    op = make_op()
    assert prof.corun_slowdown(op, busy_cores=1, total_cores=4) == 1.0  # co-run, cores to spare
    assert prof.corun_slowdown(op, busy_cores=4, total_cores=4) == pytest.approx(2.0)  # others fill every core
    # The factor applies to the op's parallel share: an op that ATen runs on one thread
    # (here: a class whose model never scales) is not descheduled inside a team.
    serial = dataclasses.replace(prof, classes={"mm": fit(dataclasses.replace(MM_MODEL, p_max=0.0))})
    assert serial.corun_slowdown(op, busy_cores=4, total_cores=4) == 1.0
    again = type(prof).from_json(prof.to_json())
    assert again.corun.oversub_mem == 2.0
    # Profiles written before the factor existed load with no oversubscription cost.
    d = prof.to_json()
    del d["corun"]["oversub_mem"], d["corun"]["oversub_compute"]
    assert type(prof).from_json(d).corun.oversub_mem == 1.0


def test_the_oversubscription_factor_fades_with_the_kernel_time_as_two_sizes_measured() -> None:
    """A team descheduled inside its region costs its op a bounded time: the factor's excess
    is ``A * T / (T + kernel)``, and two sizes of one op give T. A long kernel of a profile
    with the fade pays less of the factor than a short one; without it (a profile of before),
    all of it."""
    from schedlab.calibrate.corun import CorunFigures, oversub_fade
    from tests.calibrate.factories import make_op

    def factor(d: float) -> float:
        return 1.0 + 2.0 * 60.0 / (60.0 + d)

    assert oversub_fade((23.0, factor(23.0)), (700.0, factor(700.0))) == pytest.approx(60.0)
    assert oversub_fade((23.0, 2.0), (700.0, 2.0)) is None  # no fade: the long call paid as much
    assert oversub_fade((23.0, 2.0), (700.0, 1.0)) == 0.0  # the long call paid nothing
    # It paid a little, but less than 1 / kernel time would leave (1.0 * 23 / 700 = 0.033):
    # the fade is at least that fast, not absent.
    assert oversub_fade((23.0, 2.0), (700.0, 1.02)) == 0.0
    assert oversub_fade((23.0, 2.0), (700.0, 1.05)) > 0.0
    assert oversub_fade((23.0, 1.0), (700.0, 1.0)) is None  # nothing to fade
    figs = CorunFigures(1.0, 1.0, 1.0, measured=True, oversub_mem=3.0, oversub_compute=3.0,
                        oversub_decay_us=60.0, oversub_ref_us=23.0, oversub_long_us=700.0,
                        oversub_long=factor(700.0))
    assert figs.oversub_share(23.0) == 1.0 and figs.oversub_share(5.0) == 1.0  # no more than measured
    assert figs.oversub_share(700.0) == pytest.approx(83.0 / 760.0)
    assert dataclasses.replace(figs, oversub_decay_us=None).oversub_share(700.0) == 1.0
    base = make_profile()
    op = make_op(flops=2e8)  # 2 ms of one-thread work under MM_MODEL
    faded = dataclasses.replace(base, corun=figs)
    whole = dataclasses.replace(base, corun=dataclasses.replace(figs, oversub_decay_us=None))
    assert 1.0 < faded.corun_slowdown(op, 2, 2) < whole.corun_slowdown(op, 2, 2)
    again = Profile.from_json(json.loads(json.dumps(faded.to_json())))
    assert again.corun == dataclasses.replace(faded.corun, oversub_long=round(factor(700.0), 4))
    assert (again.corun.oversub_long_us, again.corun.oversub_long) == (700.0, pytest.approx(factor(700.0), abs=1e-4))
    d = faded.to_json()
    d["corun"]["oversub_decay_us"] = -1.0
    with pytest.raises(SchedlabError, match=r"bad corun: .*>= 0"):
        Profile.from_json(d)
    d["corun"]["oversub_decay_us"] = 60.0
    d["corun"]["oversub_long"] = float("nan")
    with pytest.raises(SchedlabError, match=r"bad corun"):
        Profile.from_json(d)
    # a profile of before: no fade, and no long call kept
    for key in ("oversub_decay_us", "oversub_ref_us", "oversub_long_us", "oversub_long"):
        del d["corun"][key]
    before = Profile.from_json(d).corun
    assert before.oversub_decay_us is None and (before.oversub_long_us, before.oversub_long) == (0.0, 1.0)


def test_calibrate_prints_the_two_sizes_the_fade_was_read_from() -> None:
    from schedlab.calibrate.corun import CorunFigures
    from schedlab.cli.calibrate_cmd import _oversub_line

    figs = CorunFigures(1.0, 1.0, 1.0, measured=True, oversub_mem=2.42, oversub_compute=1.03,
                        oversub_decay_us=0.0, oversub_ref_us=28.0, oversub_long_us=750.0, oversub_long=1.03)
    line = _oversub_line(figs.to_json())
    assert "28 us x2.42" in line and "750 us x1.03" in line and "T = 0 us" in line
    before = dataclasses.replace(figs, oversub_decay_us=None, oversub_long_us=0.0).to_json()
    assert "750 us" not in _oversub_line(before) and "no fade" in _oversub_line(before)


def test_kept_signatures_are_the_ops_own_and_change_no_answer() -> None:
    """A bound Profile reads signatures kept on the graph (`graph_signatures`) and keeps each
    op's kernel time for its other questions: the answers must equal a fresh lookup's."""
    from schedlab.calibrate.signature import graph_signatures
    from tests.conftest import captured_workload

    _, c = captured_workload("heldout:conv1d-two-branch", "sgd", "tiny")
    g = c.graph
    sigs = graph_signatures(g)
    assert sigs == tuple(signature(op) for op in g.ops)
    assert graph_signatures(g) is sigs  # kept on the graph object
    measured = {sigs[i]: {1: 10.0 + i, 2: 6.0 + i} for i in range(0, len(g.ops), 3)}
    base = make_profile(signatures=measured)
    for slots in (1, 2):
        bound = base.for_graph(g).for_slots(slots)
        other = base.for_slots(slots)  # bound to no graph: each op's own signature, asked afresh (no first-use extra here)
        for op in g.ops:
            for n in (1, 2):
                assert bound.kernel_us(op, n) == other.kernel_us(op, n)
            assert bound.dispatch_us(op) == other.dispatch_us(op)
            assert bound.serial_us(op) == other.serial_us(op)
