"""Multi-tower models: one replica of the network per device.

The towers are placed on ``/device:GPU:0`` and ``/device:GPU:1`` in the
graph and run on the CPU through soft placement. LMS either runs once per
device (``gpu_device``) or once for every device; in both cases each
tower's swaps stay with its tower: the swapped tensor, the consumers of its
swap-ins and the ops that trigger them are all on the same device, and
training gives exactly the numbers of the graph without LMS.
"""

import numpy as np
import pytest
import tensorflow as tf

from tflms.tf import reader
from tflms import LMS
from tflms.lms import Outcome
from tflms import graph_index as gi

from _graphs import assert_swaps_ran, trace_options

_v1 = tf.compat.v1
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
TOWERS = ("/device:GPU:0", "/device:GPU:1")
WIDTH = 12


def tower_graph(depth=4, shared_loss=False):
    """Two towers sharing CPU variables.

    With ``shared_loss=False`` (the classic data-parallel recipe) each tower
    computes its own loss and gradients and the CPU averages them. With
    ``shared_loss=True`` the towers have different depths and one loss on
    GPU:0 combines their scalar losses, so the backward pass of tower 1
    starts from ops on GPU:0 (only scalars cross between the towers).

    Returns:
      (graph, handles) with losses, train, init, variables, feed.
    """
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    with graph.as_default():
        with tf.device("/cpu:0"):
            weights = [_v1.get_variable(
                "w%d" % i, initializer=rng.uniform(
                    -0.5, 0.5, (WIDTH, WIDTH)).astype(np.float32))
                for i in range(depth)]
        feed, losses, grads, last = {}, [], [], []
        for t, device in enumerate(TOWERS):
            with tf.device(device), tf.name_scope("tower_%d" % t):
                x = _v1.placeholder(tf.float32, [4, WIDTH], name="x")
                feed[x] = rng.randn(4, WIDTH).astype(np.float32)
                h = x
                for w in weights[:depth - (2 * t if shared_loss else 0)]:
                    h = tf.nn.relu(tf.matmul(h, w))
                loss = tf.reduce_mean(tf.square(h), name="loss")
                losses.append(loss)
                last.append(h)
                if not shared_loss:
                    grads.append(_v1.gradients(
                        loss, weights, colocate_gradients_with_ops=True))
        opt = _v1.train.MomentumOptimizer(0.05, 0.9)
        if shared_loss:
            with tf.device(TOWERS[0]):
                total = losses[0] * losses[1] + tf.reduce_sum(
                    tf.sin(tf.tanh(last[0])))
            train = opt.minimize(total, colocate_gradients_with_ops=True)
        else:
            with tf.device("/cpu:0"):
                average = [tf.add_n(list(g)) / len(TOWERS)
                           for g in zip(*grads)]
                train = opt.apply_gradients(zip(average, weights))
        variables = _v1.global_variables()
        init = _v1.variables_initializer(variables)
    return graph, dict(losses=losses, train=train, init=init,
                       variables=variables, feed=feed)


def train(graph, handles, steps=3):
    config = _v1.ConfigProto(allow_soft_placement=True)
    md = _v1.RunMetadata()
    with _v1.Session(graph=graph, config=config) as sess:
        sess.run(handles["init"])
        losses = [sess.run([handles["losses"], handles["train"]],
                           handles["feed"], options=trace_options(),
                           run_metadata=md)[0] for _ in range(steps)]
        weights = sess.run(handles["variables"])
    return losses, weights, md


_BASE = {}


def baseline(shared_loss):
    if shared_loss not in _BASE:
        _BASE[shared_loss] = train(*tower_graph(shared_loss=shared_loss))[:2]
    return _BASE[shared_loss]


def assert_same_numbers(got, base):
    assert got[0] == base[0]
    assert len(got[1]) == len(base[1])
    for a, b in zip(base[1], got[1]):
        np.testing.assert_array_equal(a, b)


def tower_of(index, op_id):
    device = index.devices[op_id]
    return TOWERS.index(device) if device in TOWERS else None


def assert_swaps_stay_in_towers(index, plan, only_tower=None):
    """Every swap: tensor, consumers and triggers in one tower; returns the
    towers that have swaps."""
    towers = set()
    for swap in plan.swaps:
        tower = tower_of(index, swap.producer)
        assert tower is not None, index.names[swap.producer]
        assert only_tower is None or tower == only_tower
        towers.add(tower)
        for sin in swap.swap_ins:
            for consumer, _ in sin.consumers:
                assert tower_of(index, consumer) == tower, (
                    index.names[swap.producer], index.names[consumer])
            for trigger in sin.triggers:
                assert tower_of(index, trigger) == tower, (
                    index.names[swap.producer], index.names[trigger])
    return towers


def test_one_lms_per_device():
    graph, handles = tower_graph()
    index = reader.build_index(graph)
    results = []
    for t, device in enumerate(TOWERS):
        lms = LMS(gpu_device=device, **FIXED)
        result = lms.run(graph)
        assert result.swapout_ops
        assert assert_swaps_stay_in_towers(index, lms.last_run.plan, t) == {t}
        results.append(result)
    for op in graph.get_operations():
        if "lms/" in op.name:
            assert gi.is_cpu_device(op.device)
    # Each device's LMS, or one for all devices, now finds its work done.
    signature = graph.as_graph_def().SerializeToString(deterministic=True)
    for device in TOWERS + (None,):
        assert LMS(gpu_device=device, **FIXED).run(graph).outcome is \
            Outcome.ALREADY_REWRITTEN
    assert graph.as_graph_def().SerializeToString(
        deterministic=True) == signature
    got = train(graph, handles)
    assert_same_numbers(got, baseline(False))
    for result in results:
        assert_swaps_ran(graph, result, got[2])


def test_one_lms_for_every_device():
    graph, handles = tower_graph()
    index = reader.build_index(graph)
    lms = LMS(**FIXED)
    result = lms.run(graph)
    assert assert_swaps_stay_in_towers(index, lms.last_run.plan) == {0, 1}
    got = train(graph, handles)
    assert_same_numbers(got, baseline(False))
    assert_swaps_ran(graph, result, got[2])
    # The towers are replicas: each gets the same number of swaps.
    per_tower = [sum(1 for n in result.swapout_ops
                     if n.startswith("lms/swapout_tower_%d" % t))
                 for t in range(2)]
    assert per_tower[0] == per_tower[1] > 0


@pytest.mark.parametrize("ahead", [1, 3, 4, 6, 8])
def test_triggers_stay_on_the_consumer_device(ahead):
    """Tower 1's backward pass starts from GPU:0 ops (the shared loss); its
    swap-ins must still be triggered by tower-1 ops."""
    graph, handles = tower_graph(shared_loss=True)
    index = reader.build_index(graph)
    lms = LMS(swapout_threshold=1, swapin_ahead=ahead, swapin_groupby=0)
    result = lms.run(graph)
    assert 1 in assert_swaps_stay_in_towers(index, lms.last_run.plan)
    if ahead == 4:
        got = train(graph, handles)
        assert_same_numbers(got, baseline(True))
        assert_swaps_ran(graph, result, got[2])


def test_a_device_without_ops_is_refused_and_names_the_towers():
    graph, _ = tower_graph()
    before = graph.as_graph_def().SerializeToString(deterministic=True)
    with pytest.raises(ValueError, match=(
            r"gpu_device='/device:GPU:2' matches no operation in the graph; "
            r"ops are placed on .*/device:GPU:0, /device:GPU:1")):
        LMS(gpu_device="/device:GPU:2", **FIXED).run(graph)
    assert graph.as_graph_def().SerializeToString(
        deterministic=True) == before


# Trains with and without LMS: run with oneDNN off and on (tools/run_tests.sh).
pytestmark = pytest.mark.numerics
