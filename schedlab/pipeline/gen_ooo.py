"""Out-of-order backprop's pipeline schedule (Oh et al., "Out-Of-Order BackProp: An
Effective Scheduling Technique for Deep Learning", EuroSys 2022).

Our reading of the paper's pipeline-parallel part. Two techniques together:
- gradient fast-forwarding: a stage computes its input gradient (I) and sends it to
  the previous stage before it computes its weight gradient (W), which nothing
  downstream waits for; the W's are deferred and run where the device would otherwise
  wait;
- modulo layer allocation: layers go to devices round-robin (layer l on device l mod P)
  instead of in contiguous blocks, so one micro-batch's backward visits every device
  several times and the fast-forwarded gradient keeps them all busy, each device
  filling the time between its I's with W's.
Here a layer group is a stage and round-robin is the `loop` stage map with V >= 2
stages per device. The paper builds on a synchronous micro-batched pipeline and does not
fix an admission rule; we admit micro-batches under 1F1B's peak memory, so it compares
with 1F1B and interleaved 1F1B at equal memory.
"""

from __future__ import annotations

from schedlab.errors import SchedlabError
from schedlab.pipeline.gen_layout import chain_layout, require_layout
from schedlab.pipeline.gen_list import fast_forward_rank, list_schedule, one_f_one_b_memory
from schedlab.pipeline.schedule import Schedule
from schedlab.pipeline.shape import PipeShape


def ooo(shape: PipeShape, n_microbatches: int) -> Schedule:
    """Fast-forwarded backprop over a modulo (loop) allocation, by list scheduling
    (gen_list, the rule ZB-V uses): a free device runs a ready I first (later stage
    first), else a forward (later stage first; new micro-batches admitted under 1F1B's
    peak memory), else a deferred W. With each stage's F = I = W and M >= P it meets the
    bound of (P - 1) stage-forwards of ramp plus the work: at V stages a device, each
    1/V of its share, the ramp is (P - 1)/V of a share's forward, where interleaved 1F1B
    with its whole B loses (P - 1)/V of a share's F + B.

    P = 4, V = 2, M = 8, at F = I = W = 1 per stage (digits: forwards on the device's
    first stage; f on its second):

        0: 0123ffff   i4i5iii6iiffif7wwwiwiwiiifiwwwwwiwwwiwww
        1:  0123ffff iwi4iii5ii6wifff7wiwiwiiiwifwwwwiwwwiwww
        2:   0123fffifiwiii4ii5wi6wfffi7iwiiiwiwwfwwiwwwiwwww
        3:    0123fififiiifii4wi5w6wfififiii7iwwwwfiwwwiwwwwww
    """
    layout = chain_layout(shape, "ooo")
    if layout.stages_per_device < 2:
        raise SchedlabError(
            "schedule 'ooo' needs the modulo layer allocation, at least 2 stages per device mapped in a loop; "
            f"this pipeline has {layout.stages_per_device}. Build it with generators.default_shape('ooo', P)"
        )
    require_layout(layout, "ooo", "loop")
    return list_schedule(shape, n_microbatches, fast_forward_rank, one_f_one_b_memory(shape), "ooo")
