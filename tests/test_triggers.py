"""`planner.TriggerFinder` against the full trigger search.

The finder takes the op on the consumer's critical path at the latest
allowed level when it may trigger, and falls back to the full search
(`planner.find_trigger`) otherwise. Either way the trigger must be one the
full search could have picked: same level (the simulator sees only levels),
a valid trigger on the consumer's device, an ancestor of the consumer.
"""

import pytest
import tensorflow as tf

from tflms.tf import reader
from tflms import analysis
from tflms import fusions
from tflms import graph_index as gi
from tflms import planner

from zoo import models


def _check_all_queries(index, roles, aheads):
    finder = planner.TriggerFinder(index, roles)
    edges = planner.candidate_edges(index, roles)
    found = 0
    for p, _, consumer, _, _ in edges:
        for ahead in aheads:
            full = planner.find_trigger(index, roles, p, consumer, ahead)
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
    index = reader.build_index(model.graph)
    roles = analysis.classify_ops(index)
    assert _check_all_queries(index, roles, (1, 2, 3, 7, 20)) > 20


def test_finder_with_serialization_levels(v1_control_flow):
    """Serialization edges raise levels without a real input one level
    below (the chain breaks there); v1 conds put ops that may not trigger on
    the critical path. The finder still agrees with the full search."""
    import test_control_flow
    _, graph = test_control_flow.keras_bn_graph()
    index = reader.build_index(graph)
    roles = analysis.classify_ops(index)
    assert _check_all_queries(index, roles, (1, 2, 4)) > 5
    edges, _ = planner.serialization_edges(index, roles, (slice(0, None),))
    assert edges
    relevelled = gi.with_planned_edges(index, edges)
    assert _check_all_queries(relevelled, roles, (1, 2, 4)) > 5


def _check_spine_searches(index, roles, aheads):
    """The spine searches give exactly the walks' answers: the trigger op
    itself (not only its level) and data reachability."""
    finder = planner.TriggerFinder(index, roles)
    levels = index.levels
    answered = 0
    for p, _, consumer, _, _ in planner.candidate_edges(index, roles):
        for ahead in aheads:
            lower, upper = planner._trigger_window(levels, p, consumer, ahead)
            if upper <= lower:
                continue
            fast = finder._latest_trigger(consumer, lower, upper)
            if fast is planner._UNKNOWN:
                continue
            answered += 1
            assert fast == planner.find_trigger(index, roles, p, consumer,
                                                 ahead), (p, consumer, ahead)
            if fast is None:
                continue
            for op in (fast, p):
                reaches = finder._reaches_by_spine(op, consumer)
                assert reaches is not planner._UNKNOWN
                assert reaches == planner._data_reaches(index, op, consumer)
            # A later op at the trigger's level reaches nothing below it.
            assert not finder._reaches_by_spine(consumer, fast)
    return answered


@pytest.mark.parametrize("name, kwargs", [
    ("cnn_bn", dict(image=12, channels=6, depth=6, batch=2)),
    ("transformer_encoder", dict(layers=2, seq=8, d_model=16, heads=2,
                                 batch=2)),
    ("keras_resnet", dict(image=16, batch=2, blocks=(1, 1))),
])
def test_spine_searches_agree_with_the_walks(name, kwargs):
    """Residual joins, attention's several paths and gradient tuples (whose
    identities take their level from a control input) all need more than
    one spine."""
    graph = tf.Graph()
    with graph.as_default():
        model = models.BUILDERS[name](seed=2, **kwargs)
    index = reader.build_index(model.graph)
    roles = analysis.classify_ops(index)
    assert _check_spine_searches(index, roles, (0, 1, 2, 3, 7, 20, 60)) > 20


# ---- ops TensorFlow merges at run time (oneDNN) --------------------------
def _cnn_bias_index():
    graph = tf.Graph()
    with graph.as_default():
        models.cnn_bias(image=8, channels=2, depth=2, batch=2)
    index = reader.build_index(graph)
    return index, analysis.classify_ops(index)


def test_fusion_partners_pair_filter_gradients_with_bias_gradients():
    index, roles = _cnn_bias_index()
    pairs = {tuple(sorted((index.types[a], index.types[b])))
             for a, ps in roles.fused_with.items() for b in ps}
    assert pairs == {("BiasAddGrad", "Conv2DBackpropFilter"),
                     ("BiasAdd", "Conv2D")}
    for a, ps in roles.fused_with.items():
        for b in ps:
            assert a in roles.fused_with[b]  # symmetric
            if index.types[a] == "BiasAddGrad":
                # Siblings: the same gradient, read through tf.gradients'
                # tuple identities by the filter gradient.
                grad = fusions.through_identities(index, *index.inputs[a][0])
                assert fusions.through_identities(
                    index, *index.inputs[b][2]) == grad


def test_triggers_are_data_ancestors_never_merge_partners():
    index, roles = _cnn_bias_index()
    plan = planner.make_plan(index, roles, planner.SwapParams(1, 1, 0, 0))
    assert plan.swaps
    for swap in plan.swaps:
        for sin in swap.swap_ins:
            (trigger,) = sin.triggers
            for consumer, _ in sin.consumers:
                assert trigger in analysis.ancestors_within(
                    index, consumer, index.levels[trigger], data_only=True)
                assert trigger not in roles.fused_with.get(consumer, ())


def test_without_the_data_rule_a_bias_gradient_would_trigger_its_partner():
    # What the rule prevents: searched through control edges too, the
    # latest ancestor of a filter gradient is its sibling BiasAddGrad (the
    # tuple identities of tf.gradients wait for it).
    index, roles = _cnn_bias_index()
    found = 0
    for c, t in enumerate(index.types):
        if t != "Conv2DBackpropFilter":
            continue
        lower = index.levels[c] - 3
        partners = roles.fused_with.get(c, ())
        assert partners
        everything = analysis.ancestors_within(index, c, lower)
        data = analysis.ancestors_within(index, c, lower, data_only=True)
        assert partners & everything
        assert not partners & data
        found += 1
    assert found == 2
