"""Side chains first: the chains that reduce a large tensor (a metric of
the logits) run before the tensor's other reader makes a large output
(the loss and its gradient), in every plan where that lowers the peak.

`planner.reductions` finds the edges; the order stage tries
them only when nothing fits, after the search failed at the budget. On a
language model's step (Keras 3's accuracy over GPT-2's logits) they are
what every plan near the floor needs: without them the accuracy's
``argmax`` runs beside the loss's gradient, and keeps the logits live
after the loss. So they go into the planning index up front, as
serialization's do, where the lower of two peaks, the step's without
swaps and the most aggressive plan's the settings allow, is no higher with
them (a chain run early may keep what the most aggressive plan would
swap, while the step without swaps gains its whole temporaries).
"""

import dataclasses

from tflms import graph_index as gi
from tflms import planner
from tflms.settings import AUTO
from tflms.planner import reductions
from tflms.stages.records import Reduced

__all__ = ["stage"]

_GIB = float(1 << 30)


def stage(context, planned):
    """`planned` with the reduction edges in its planning index
    (`Reduced`), where they raise the lower of its two peaks
    (`_peaks`) no higher."""
    if not context.settings.order_peaks:
        return planned
    index = planned.index
    edges = reductions.reduction_edges(index, context.roles,
                                       context.batch_size)
    if not edges:
        return planned
    reduced = gi.with_planned_edges(index, edges)
    before, after = min(_peaks(context, index)), min(_peaks(context,
                                                            reduced))
    if after > before:
        context.log.info(
            "Not running %d side chains (a metric of the logits) before "
            "the readers beside them: the lowest peak would rise from "
            "%.2f to %.2f GiB" % (len(edges), before / _GIB, after / _GIB),
            1)
        return planned
    context.log.info(
        "Running %d side chains that reduce a large tensor (a metric of "
        "the logits) before its other reader makes a large output: the "
        "lowest peak %.2f -> %.2f GiB" % (len(edges), before / _GIB,
                                         after / _GIB), 1)
    return dataclasses.replace(planned, index=reduced).with_record(
        Reduced(tuple(edges)))


def _peaks(context, index):
    """``(peak without swaps, peak of the most aggressive plan)`` of
    `index`: every parameter on auto at its smallest, the deferral edges
    carried out."""
    requested = context.requested

    def given(value, smallest):
        return smallest if value == AUTO else value

    params = planner.SwapParams(
        given(requested.swapout_threshold, 1),
        given(requested.swapin_ahead, 1),
        given(requested.swapin_groupby, 0),
        given(requested.sync_mode, 0))
    deferral = planner.deferral_edges(index, context.roles)
    model = context.model(index)
    plain = planner.make_plan(index, context.roles, params,
                              batch_size=context.batch_size,
                              deferral=deferral, only_tensors=frozenset())
    aggressive = planner.make_plan(index, context.roles, params,
                                   batch_size=context.batch_size,
                                   deferral=deferral)
    return (model.replay(plain).peak_device_bytes,
            model.replay(aggressive).peak_device_bytes)
