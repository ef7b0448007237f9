"""What of a schedlab Plan TensorFlow's runtime can honour, as its threading settings.

TensorFlow has one intra-op pool per CPU device (every kernel gets the same number of
threads) and one inter-op pool (how many kernels run side by side). So a plan maps onto
it directly: `threads` -> intra-op threads, `slots` -> inter-op threads, and a placement
on cpu0..cpu{N-1} -> N logical CPU devices (`schedlab.tf.placement`). What it cannot
honour is refused with one message naming the field, rather than run as something else:
per-op or per-class thread counts, per-device slots or threads (TF gives every CPU device
the same pool size and the session one inter-op pool), an op order with more than one slot
(`schedlab.tf.order` imposes one with control dependencies, which run nodes one at a
time), replicas and pipelines (not yet in this backend).
"""

from __future__ import annotations

from schedlab.errors import SchedlabError
from schedlab.plan import Plan
from schedlab.tf.placement import plan_devices
from schedlab.tf.runtime import TFThreads


def tf_threads_for_plan(plan: Plan) -> TFThreads:
    """The TensorFlow threading that runs `plan`, or one error naming what TF cannot honour."""
    why = []
    if plan.class_threads or plan.op_threads:
        why.append("per-class or per-op thread counts (TensorFlow gives every kernel its device's intra-op pool)")
    if plan.order != "topo" and plan.slots != 1:
        order = plan.order if isinstance(plan.order, str) else "an explicit op list"
        why.append(f"op order {order!r} with {plan.slots} slots (TensorFlow takes ready ops in its own order; the "
                   "control dependencies that impose an order run nodes one at a time, so it needs slots 1)")
    if plan.device_slots or plan.device_threads:
        why.append("per-device slots or threads (TensorFlow sizes every CPU device's intra-op pool alike, and runs "
                   "one inter-op pool for the session)")
    if plan.replicas > 1:
        why.append("replicas (not yet in the TensorFlow backend)")
    if plan.pipelined:
        why.append("a pipeline schedule (not yet in the TensorFlow backend)")
    if why:
        raise SchedlabError(f"plan {plan.name or plan.describe()!r} cannot run on the TensorFlow backend: it sets "
                            + "; ".join(why) + ". TensorFlow honours slots (inter-op threads), threads (intra-op threads) and "
                            "placement on logical CPU devices cpu0, cpu1, ..., and an op order with one slot")
    return TFThreads(intra_op=plan.threads or 0, inter_op=plan.slots, cpu_devices=plan_devices(plan))


def recommended_threads(physical_cores: int, sockets: int) -> TFThreads:
    """TensorFlow's recommended CPU threading (Intel's guide for TF, as the concurrency paper
    compares against): intra-op = physical cores, inter-op = sockets."""
    return TFThreads(intra_op=max(physical_cores, 1), inter_op=max(sockets, 1))
