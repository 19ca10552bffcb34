"""`planner.TriggerFinder` against the full trigger search.

The finder takes the op on the consumer's critical path at the latest
allowed level when it may trigger, and falls back to the full search
(`planner._find_trigger`) otherwise. Either way the trigger must be one the
full search could have picked: same level (the simulator sees only levels),
a valid trigger on the consumer's device, an ancestor of the consumer.
"""

import pytest
import tensorflow as tf

from tflms import analysis
from tflms import graph_index as gi
from tflms import planner

import models


def _check_all_queries(index, roles, aheads):
    finder = planner.TriggerFinder(index, roles)
    edges = planner.candidate_edges(index, roles)
    found = 0
    for p, _, consumer, _, distance in edges:
        for ahead in aheads:
            full = planner._find_trigger(index, roles, p, consumer, ahead)  # pylint: disable=protected-access
            fast = finder.find(p, consumer, ahead)
            assert (full is None) == (fast is None), (p, consumer, ahead)
            if full is None:
                continue
            found += 1
            assert index.levels[fast] == index.levels[full]
            assert fast in roles.triggers
            assert analysis.same_device(index.devices[fast],
                                        index.devices[consumer])
            lowest = index.levels[fast]
            assert fast in analysis.ancestors_within(index, consumer, lowest)
            # Remembered answers are the same answers.
            assert finder.find(p, consumer, ahead) == fast
    return found


@pytest.mark.parametrize("name, kwargs", [
    ("cnn_bn", dict(image=12, channels=6, depth=6, batch=2)),
    ("transformer_encoder", dict(layers=2, seq=8, d_model=16, heads=2,
                                 batch=2)),
    ("unet3d", dict(volume=8, base_filters=2, depth=3)),
    ("keras_resnet", dict(image=16, batch=2, blocks=(1, 1))),
])
def test_finder_picks_the_full_searchs_level(name, kwargs):
    graph = tf.Graph()
    with graph.as_default():
        model = models.BUILDERS[name](seed=2, **kwargs)
    index = gi.build_index(model.graph)
    roles = analysis.classify_ops(index)
    assert _check_all_queries(index, roles, (1, 2, 3, 7, 20)) > 20


def test_finder_with_serialization_levels(v1_control_flow):
    """Serialization edges raise levels without a real input one level
    below (the chain breaks there); v1 conds put ops that may not trigger on
    the critical path. The finder still agrees with the full search."""
    import test_control_flow  # pylint: disable=import-outside-toplevel
    _, graph = test_control_flow.keras_bn_graph()
    index = gi.build_index(graph)
    roles = analysis.classify_ops(index)
    assert _check_all_queries(index, roles, (1, 2, 4)) > 5
    edges, _ = planner.serialization_edges(index, roles, (slice(0, None),))
    assert edges
    relevelled = analysis.relevel(index, edges)
    assert _check_all_queries(relevelled, roles, (1, 2, 4)) > 5
