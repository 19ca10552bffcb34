"""Serialization: control edges that chain the ops of the chosen levels.

`Settings.serialization` names levels (and ``serialization_by_size`` adds
the levels whose tensors pass a size); the ops of each are made to run one
after the other, so their outputs are not all alive at once. The edges go
into the planning index (`graph_index.with_planned_edges`), whose levels
count them, so every later stage plans on the serialized step.
"""

import dataclasses

from tflms import graph_index as gi
from tflms import initializers
from tflms import planner
from tflms.stages.records import Serialized

__all__ = ["stage", "serialization_edges"]


def serialization_edges(context, index):
    """``(edges, levels)`` that serialize the settings' levels of `index`."""
    settings = context.settings
    extra = ()
    if settings.serialization_by_size:
        extra = planner.levels_over_size(
            index, context.roles, settings.serialization_by_size,
            settings.batch_size)
    if not settings.serialization_levels and not extra:
        return (), []
    excluded = initializers.initializer_inputs(index)
    return planner.serialization_edges(
        index, context.roles, settings.serialization_levels, extra, excluded)


def stage(context, planned):
    """`planned` with its index serialized as the settings ask.

    Raises:
      ValueError: serialization that would close a cycle.
    """
    edges, levels = serialization_edges(context, planned.index)
    if not edges:
        return planned
    context.log.info("Serializing %d levels: %s" % (
        len(levels), _compact_levels(levels)))
    index = gi.with_planned_edges(planned.index, edges)
    context.log.info("New categorized topological sort has %d levels"
                     % index.num_levels)
    return dataclasses.replace(planned, index=index).with_record(
        Serialized(tuple(levels)))


def _compact_levels(levels):
    if len(levels) <= 12:
        return str(list(levels))
    return "%s ... %s" % (list(levels[:6]), list(levels[-3:]))
