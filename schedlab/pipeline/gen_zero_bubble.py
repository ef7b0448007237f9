"""Zero Bubble's schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024):
the backward split into I (input gradient, which the previous stage waits for) and W
(weight gradient, which nothing waits for), and the W's moved into what were bubbles.

ZB-H1 and ZB-H2 are the paper's handcrafted schedules, rebuilt here from its text and
figure 3: 1F1B's list with other warm-up counts and with each W trailing its I by a
per-device lag. ZB-V is the V-shaped schedule of the same authors (two stages per
device, stage s and 2P - 1 - s together), built by list scheduling.

Pictures are drawn at F = I = W = 1 per stage, one column per time unit: a digit is a
forward of that micro-batch on the device's first stage, f one on its second; i and w
the split backward.
"""

from __future__ import annotations

from schedlab.pipeline.gen_classic import one_f_one_b_order
from schedlab.pipeline.gen_layout import chain_layout, require_layout
from schedlab.pipeline.gen_list import fast_forward_rank, list_schedule, one_f_one_b_memory
from schedlab.pipeline.schedule import Schedule
from schedlab.pipeline.shape import PipeShape


def zb_h1(shape: PipeShape, n_microbatches: int) -> Schedule:
    """ZB-H1, 1F1B's memory: device d keeps 1F1B's P - 1 - d warm-up forwards, then runs
    I, F pairs; its W's trail their I's by d micro-batches (the fewer warm-up forwards,
    the later W starts), and after the last forward each I is followed by one waiting
    W. I reaches the previous stage a W earlier than 1F1B's B, and the late W's fill the
    cool-down: with F = I = W the bubble is (P - 1)(F + I - W), a third of 1F1B's
    (P - 1)(F + I + W), and no device holds more micro-batches than in 1F1B.

        0: 0123   i4wi5wi6wi7wiwiwiwiw
        1:  012  i3i4wi5wi6wi7wiwiwiww
        2:   01 i2i3i4wi5wi6wi7wiwiwww
        3:    0i1i2i3i4wi5wi6wi7wiwwww
    """
    layout = chain_layout(shape, "zb-h1")
    require_layout(layout, "zb-h1", "loop", 1)
    p = layout.n_devices
    orders = tuple(
        one_f_one_b_order(s, n_microbatches, p - d, split=True, w_lag=d) for d, (s,) in enumerate(layout.stages_of)
    )
    return Schedule(shape=shape, n_microbatches=n_microbatches, orders=orders, name="zb-h1")


def zb_h2(shape: PipeShape, n_microbatches: int) -> Schedule:
    """ZB-H2, zero bubble for more memory: device d runs 2(P - 1 - d) + 1 forwards before
    its first I, exactly enough to keep it busy until that I arrives, then I, F pairs
    with W's trailing by 2d micro-batches, and one waiting W after each I once the
    forwards are done. The late W's turn 1F1B's trapezoid into a parallelogram: with
    F = I = W each device computes without a gap from its first action to its last
    (device d starts d F's late and ends d F's late), and device 0 holds 2P - 1
    micro-batches (the paper's (2p - 1) M_B).

        0: 0123456i7wi8wi9wiwiwiwiwiwiwiw
        1:  01234i5i6i7wi8wi9wiwiwiwiwiwww
        2:   012i3i4i5i6i7wi8wi9wiwiwiwwwww
        3:    0i1i2i3i4i5i6i7wi8wi9wiwwwwwww
    """
    layout = chain_layout(shape, "zb-h2")
    require_layout(layout, "zb-h2", "loop", 1)
    p = layout.n_devices
    orders = tuple(
        one_f_one_b_order(s, n_microbatches, 2 * (p - 1 - d) + 1, split=True, w_lag=2 * d)
        for d, (s,) in enumerate(layout.stages_of)
    )
    return Schedule(shape=shape, n_microbatches=n_microbatches, orders=orders, name="zb-h2")


def zbv(shape: PipeShape, n_microbatches: int) -> Schedule:
    """ZB-V: two stages per device in a V (stage d and 2P - 1 - d on device d), so the
    loss turns around on device 0 and each device holds both ends of a micro-batch's
    life. Built by list scheduling (gen_list): a free device runs a ready I first (later
    stage first), else a forward (later stage first), else a waiting W; a new micro-batch
    is admitted only while the device holds at most 1F1B's peak (P micro-batches of its
    share), and a forward that would pass it waits behind any other ready work.

    With each stage's F = I = W and M >= P this meets the bound of P - 1 stage-forwards
    of ramp plus the work (3M stage-units per stage), at no more memory than 1F1B; from
    M = 2P - 1 on, no device idles between its first and last action. W's hold no memory
    by default (`w_mem` = 0), so they gather at the end; give them memory and the bound
    pulls them forward.

    P = 4, M = 8:

        0: 0123456fifififii7iwiwiwfifififiiwiwiwiwwwwwwwwww
        1:  01234f5fififiiii6i7iwfwfififiiiiwiwiwwwwwwwwwwww
        2:   012f3f4fifiiiiii5i6f7fwfifiiiiiiwiwwwwwwwwwwwwww
        3:    0f1f2f3fiiiiiiii4f5f6f7fiiiiiiiiwwwwwwwwwwwwwwww
    """
    layout = chain_layout(shape, "zbv")
    require_layout(layout, "zbv", "v", 2)
    return list_schedule(shape, n_microbatches, fast_forward_rank, one_f_one_b_memory(shape), "zbv")
