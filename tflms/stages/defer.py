"""Deferral: fills, counter-based random noise and ops whose inputs are
held anyway, made long before their first reader, wait until just before
it.

A tensor filled with a constant at the start of the step (the gradient
zeros of the branch a v1 ``cond`` does not take, for instance) holds device
memory from the forward phase to the backward one. `planner.deferral_edges`
gives each such fill a control input just before its reader; every plan
carries them out.
"""


from tflms import graph_index as gi
from tflms import planner
from tflms.stages.records import Deferred

__all__ = ["stage"]

_GIB = float(1 << 30)


def stage(context, planned):
    """`planned` with the deferral edges of its planning index
    (`Deferred`)."""
    deferral = planner.deferral_edges(planned.index, context.roles)
    if deferral:
        context.log.info(
            "Delaying %d tensor fills, random-noise ops and ops on held "
            "inputs (%.2f GiB), such as the gradient zeros of the untaken "
            "branch of v1 conds, Keras 3's dropout noise or its accuracy's "
            "mask of the logits, until just before their first reader" % (
                len(deferral), sum(
                    gi.tensor_bytes(planned.index, op, 0, context.batch_size)
                    or 0 for _, op in deferral) / _GIB), 1)
    if not deferral:
        return planned
    return planned.with_record(Deferred(tuple(deferral)))
