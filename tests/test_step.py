"""The training step: LMS plans and edits the fan-in of the step's fetches
and nothing else (`tflms.step`, `tflms.tf.reader.build_index`, the
rewriter's check). The rules that find the fetches are tested in
tests/test_reader.py.

The graphs here hold more than their step, as users' graphs do: a Keras
application used as a layer library in a Session graph keeps the forward
pass Keras built on its own `Input` (batch norm under a learning-phase
cond), and beside the train op sit an evaluation head and summaries. Every
planning stage (ordering, serialization, recompute, fewer waits) is run on
such a graph at a size where it engages, and after each rewrite the step
runs exactly the ops it ran before plus LMS's own.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

from tflms.tf import reader
from tflms import LMS, analysis, pipeline
from tflms.tf import rewriter
from tflms import graph_index as gi
from tflms.tf import compat
from tflms.settings import Settings
from tflms.tf.verify import verify
from tflms.stages import records

from _graphs import tiny_step

_GIB = float(1 << 30)


def keras_app_graph(size=256, batch=1, app="ResNet50", seed=1):
    """A Keras application called on tensors in a Session graph, trained
    with a v1 optimizer, with an evaluation head and summaries beside the
    train op. Returns (graph, train_op, loss)."""
    keras = compat.keras2()
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        if app == "small":
            model = _small_functional_cnn(keras, size)
        else:
            model = getattr(keras.applications, app)(
                weights=None, input_shape=(size, size, 3), classes=10,
                classifier_activation=None)
        x = tf.random.uniform([batch, size, size, 3], seed=seed)
        y = tf.random.uniform([batch], maxval=10, dtype=tf.int32, seed=seed)
        logits = model(x, training=True)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                           logits=logits))
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOSSES, loss)
        train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(
            loss, var_list=model.trainable_weights)
        # Beside the step: an evaluation head on other inputs, summaries.
        x_eval = tf.random.uniform([batch, size, size, 3], seed=seed + 1)
        tf.compat.v1.summary.scalar(
            "eval_max_logit", tf.reduce_max(model(x_eval, training=False)))
        tf.compat.v1.summary.scalar("loss", loss)
        tf.compat.v1.summary.merge_all()
    return graph, train_op, loss


def _small_functional_cnn(keras, size):
    """A functional Keras CNN with batch norm and a residual add, built on
    its own `Input` as Keras applications are (their pattern, at a size
    that trains in seconds)."""
    layers = keras.layers
    inp = keras.Input((size, size, 3))
    h = inp
    for i in range(6):
        shortcut = h
        h = layers.Conv2D(8, 3, padding="same", use_bias=False,
                          kernel_initializer=keras.initializers.GlorotUniform(
                              seed=i))(h)
        h = layers.BatchNormalization()(h)
        h = layers.ReLU()(h)
        if i % 2 and shortcut.shape[-1] == 8:
            h = layers.Add()([h, shortcut])
    h = layers.GlobalAveragePooling2D()(h)
    out = layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(
        seed=9))(h)
    return keras.Model(inp, out)


def _added(result):
    rewrite = result.rewrite
    return (set(rewrite.swapout_ops) | set(rewrite.swapin_ops)
            | set(rewrite.recompute_ops))


def _rewrite_and_check(graph, train_op, lms):
    """Run `lms` on `graph`; check that the step after the rewrite is the
    step before plus the ops LMS added, each of which is in it."""
    loss = graph.get_collection(tf.compat.v1.GraphKeys.LOSSES)[0]
    before = set(reader.fan_in([train_op, loss.op]))
    result = lms.run(graph)
    assert result.rewritten
    added = _added(result)
    after = set(reader.fan_in([train_op, loss.op]))
    assert after - before == added
    assert before <= after
    return result


def _budget_gib(graph, fraction):
    """A budget `fraction` of the way from the resident bytes (variables,
    slots) to the simulated peak without LMS, batch 1."""
    index = reader.build_index(graph)
    settings = Settings(batch_size=1)
    roles = pipeline.classify(index, settings)
    without = pipeline.simulate_without(index, roles, settings)
    resident = 2 * analysis.learning_parameter_bytes(index)  # + Momentum
    return (resident + fraction * (without.peak_device_bytes - resident)) \
        / _GIB


# ---- finding the step -------------------------------------------------------
def test_index_holds_the_fan_in_of_the_train_op_only():
    graph, train_op, loss = keras_app_graph(size=64)
    index = reader.build_index(graph)
    in_step = reader.fan_in([train_op, loss.op])
    assert {op.name for op in index.ops} == set(in_step)
    assert index.graph_num_ops == len(graph.get_operations())
    # Keras's own forward pass on its Input, the evaluation head and the
    # summaries are outside.
    assert index.num_ops < index.graph_num_ops / 2
    assert "input_1" not in index.id_of
    assert not any(t == "MergeSummary" for t in index.types)
    # The loss is fetched with the train op; the gradients do not read it.
    assert [index.names[f] for f in index.fetches] == [loss.op.name,
                                                       train_op.name]
    assert index.step_rule == ("the graph's train_op collection and its "
                               "losses collection (2 ops)")
    # Ids follow graph order.
    order = {op.name: k for k, op in enumerate(graph.get_operations())}
    assert [order[op.name] for op in index.ops] == sorted(
        order[op.name] for op in index.ops)


def test_literal_index_of_fetches():
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [64]}), ("dead", "Relu"),
         ("a", "Relu", {"outputs": [64]}), ("train", "NoOp"),
         ("c", "Const")],
        edges=[("x", "dead"), ("x", "a")], control_edges=[("a", "train"),
                                                          ("c", "train")],
        fetches=["train"])
    assert index.names == ("x", "a", "train", "c")
    assert index.fetches == (2,) and index.graph_num_ops == 5
    assert index.inputs[1] == ((0, 0),)
    assert index.control_inputs[2] == (1, 3)
    assert index.consumers[0] == (((1, 0),),)
    with pytest.raises(ValueError, match=r"^fetches\[0\]: no op named 'z'"):
        gi.from_edges([("x", "Placeholder")], fetches=["z"])


# ---- every planning stage stays inside the step -----------------------------
def test_ordering_stays_inside_the_step():
    graph, train_op, _ = keras_app_graph()
    lms = LMS()
    lms.batch_size = 1
    lms.autotune_gpu_mem = _budget_gib(graph, 0.35)
    result = _rewrite_and_check(graph, train_op, lms)
    assert result.planned.ordering_edges  # the stage engaged


def test_serialization_and_fixed_swaps_stay_inside_the_step():
    graph, train_op, _ = keras_app_graph(size=96)
    lms = LMS(swapout_threshold=40, swapin_ahead=5, swapin_groupby=3,
              serialization=["20:40"])
    lms.batch_size = 1
    result = _rewrite_and_check(graph, train_op, lms)
    assert result.planned.record(records.Serialized).levels
    assert result.plan.swaps


def test_recompute_stays_inside_the_step():
    graph, train_op, _ = keras_app_graph(size=128)
    lms = LMS(swapout_threshold=40, swapin_ahead=5, swapin_groupby=3,
              recompute=True)
    lms.batch_size = 1
    result = _rewrite_and_check(graph, train_op, lms)
    assert result.plan.recomputes


def test_fewer_waits_stays_inside_the_step():
    graph, train_op, _ = keras_app_graph()
    lms = LMS(sync_mode=1)
    lms.batch_size = 1
    lms.autotune_gpu_mem = _budget_gib(graph, 0.6)
    result = _rewrite_and_check(graph, train_op, lms)
    assert result.planned.unwaited


def test_prefetch_stays_inside_the_step_and_its_swaps_run():
    # Keras' ResNet50 application with an evaluation head and summaries
    # beside the step, tuned for 0.45 of its activations over PCIe 4.0:
    # the prefetch stage starts swap-ins earlier (two, oneDNN off or on;
    # at half of them it started one with oneDNN off, none on oneDNN's
    # CPU kernels, where the stem's pool output stays for its gradient).
    # Their triggers are ops of the step, and every swap op runs in a
    # traced step.
    from _graphs import assert_swaps_ran, trace_options
    graph, train_op, loss = keras_app_graph()
    # Swaps only: the swap-in prefetched is one of the tuner's swaps.
    lms = LMS.from_settings(Settings(interconnect="pcie4", recompute=False))
    lms.batch_size = 1
    lms.autotune_gpu_mem = _budget_gib(graph, 0.45)
    result = _rewrite_and_check(graph, train_op, lms)
    assert len(result.planned.record(records.Prefetched).swap_ins) == 2
    metadata = tf.compat.v1.RunMetadata()
    with graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        value, _ = sess.run([loss, train_op], options=trace_options(),
                            run_metadata=metadata)
    assert np.isfinite(value)
    assert_swaps_ran(graph, result, metadata)


def test_baseline_is_the_same_whatever_the_budget():
    graph, _, _ = keras_app_graph()
    index = reader.build_index(graph)
    peaks = set()
    ordered = 0
    for fraction in (0.35, 0.6):
        settings = Settings(batch_size=1,
                            autotune_gpu_mem=_budget_gib(graph, fraction))
        planned = pipeline.plan(index, settings)
        ordered += bool(planned.ordering_edges)
        peaks.add(planned.without_lms.peak_device_bytes)
    assert ordered == 1  # one budget needed ordering edges, one did not
    roles = pipeline.classify(index, Settings(batch_size=1))
    plain = pipeline.simulate_without(index, roles, Settings(batch_size=1))
    assert peaks == {plain.peak_device_bytes}


# ---- the rewriter's check ---------------------------------------------------
def test_rewriter_refuses_an_index_that_is_not_the_step():
    graph, train_op, _ = keras_app_graph(size=64)
    index = reader.build_index(graph)
    roles = analysis.classify_ops(index)
    from tflms import planner
    plan = planner.make_plan(index, roles, planner.SwapParams(30, 5, 3, 0),
                             batch_size=1)
    assert plan.swaps
    # The step changes after indexing without a new op: the train op now
    # also waits for Keras's own forward pass on its Input.
    dead = graph.get_operation_by_name("input_1")
    train_op._add_control_inputs([dead])
    ops_before = len(graph.get_operations())
    with pytest.raises(ValueError, match=(
            r"^the training step \(the fan-in of .*\) is not the set of ops "
            r"that was indexed: 1 ops would enter the step \(input_1\)\. "
            r"Index the graph again before applying a plan; nothing was "
            r"edited$")):
        rewriter.apply_plan(graph, index, plan, "/cpu:0")
    assert len(graph.get_operations()) == ops_before
    assert not rewriter.is_rewritten(graph)


def test_rewriter_refuses_a_plan_of_another_index():
    graph, _, _ = tiny_step()
    index = reader.build_index(graph)
    big = reader.build_index(keras_app_graph(size=32)[0])
    from tflms import planner
    plan = planner.make_plan(big, analysis.classify_ops(big),
                             planner.SwapParams(30, 5, 3, 0), batch_size=1)
    with pytest.raises(ValueError, match=r"^the plan refers to op id \d+, "
                       r"but the index has %d ops: apply a plan to the "
                       r"index it was made from$" % index.num_ops):
        rewriter.apply_plan(graph, index, plan, "/cpu:0")


# ---- training: the same numbers, every swap op runs -------------------------
@pytest.mark.numerics
def test_keras_model_on_tensors_trains_the_same_and_every_swap_runs():
    def load():
        return keras_app_graph(size=32, batch=2, app="small")[0]

    report = _verify_every_swap_runs(load)
    assert np.isfinite(report.losses_with).all()


def _verify_every_swap_runs(load):
    """`verify` with fixed parameters, batch 2, two steps: more than 20 swap
    ops, each of which ran; nothing entered the step or stopped running;
    the same numbers (`_assert_same_numbers`). Returns the report."""
    lms = LMS(swapout_threshold=4, swapin_ahead=2, swapin_groupby=1)
    lms.batch_size = 2
    report = verify(load, lms, steps=2)
    assert report.swap_ops > 20
    assert report.swap_ops_ran == report.swap_ops
    assert not report.swap_ops_removed and not report.swap_ops_not_run
    assert not report.ops_entering_step and not report.ops_not_run
    _assert_same_numbers(report)
    return report


def _assert_same_numbers(report):
    """Bit-identical where TensorFlow ran the same kernels; within float
    rounding where oneDNN fused differently around a swap op (a swapped
    tensor read by a second op is not fused away)."""
    if report.kernels_differ:
        assert report.max_abs_difference < 1e-5, report
        np.testing.assert_allclose(report.losses_with,
                                   report.losses_without, rtol=1e-6)
    else:
        assert report.ok, report
        assert report.losses_with == report.losses_without
        assert report.max_abs_difference == 0.0


# ---- ops the graph optimizer reduces to an identity -------------------------
def test_aliases_are_not_swap_sources_and_count_once():
    ops = [("x", "Placeholder", {"outputs": [1000]}),
           ("a", "Relu", {"outputs": [1000]}),
           ("one", "Const"),
           ("alias", "Mul", {"outputs": [1000], "forwards_input": 0}),
           ("stop", "StopGradient", {"outputs": [1000]}),
           ("far", "AddN", {"outputs": [1000]})]
    edges = [("x", "a"), ("a", "alias"), ("one", "alias"), ("a", "stop"),
             ("alias", "far"), ("stop", "far")]
    index = gi.from_edges(ops, edges)
    assert index.forwards_input == (None, None, None, 0, 0, None)
    roles = analysis.classify_ops(index)
    assert {index.names[i] for i in roles.sources} == {"a", "far"}
    from tflms import simulator
    peak = simulator.SimulationModel(index, roles).replay(None)
    # x, a (with its two aliases) and far: never more than two at once.
    assert peak.peak_device_bytes == 2000
    with pytest.raises(ValueError, match=r"^ops\[1\] \('a'\): forwards_input "
                       r"must be None or an input slot below 1; got 1$"):
        gi.from_edges([("x", "Placeholder"), ("a", "Mul",
                                              {"forwards_input": 1})],
                      [("x", "a")])


def swish_cnn_graph(layers=8, size=24, batch=2, seed=3):
    """A CNN with batch norm and swish activations (`tf.nn.swish`, as in
    EfficientNet): its custom gradient multiplies the batch norm's output
    by a constant 1.0, which the graph optimizer reduces to the output
    itself. Beside the train op, an evaluation head."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        x = tf.random.uniform([batch, size, size, 3], seed=seed)
        h = x
        for i in range(layers):
            kernel = tf.compat.v1.get_variable(
                "k%d" % i, [3, 3, h.shape[-1], 8],
                initializer=tf.compat.v1.glorot_uniform_initializer(seed=i))
            h = tf.nn.conv2d(h, kernel, 1, "SAME")
            h, _, _ = tf.compat.v1.nn.fused_batch_norm(
                h, tf.ones([8]), tf.zeros([8]), is_training=True)
            h = tf.nn.swish(h)
        loss = tf.reduce_mean(tf.square(h))
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOSSES, loss)
        tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
        tf.reduce_max(h, name="eval_head")
    return graph


def test_swish_gradient_constant_multiply_is_an_alias():
    graph = swish_cnn_graph()
    index = reader.build_index(graph)
    roles = analysis.classify_ops(index)
    aliases = [i for i in range(index.num_ops)
               if index.types[i] == "Mul" and index.forwards_input[i]
               is not None]
    assert len(aliases) >= 8  # one x * 1.0 per swish, forward and backward
    assert not set(aliases) & roles.sources


@pytest.mark.numerics
def test_swish_gradient_every_swap_op_runs():
    """Swapping both the batch norm's output and its product with 1.0 made
    two swap-outs equal after the graph optimizer, and TensorFlow merged
    them: 49 of 664 swap ops never ran on a Keras EfficientNetB0 (issue
    22). Now the product is an alias, never swapped, and every swap op
    runs, training exactly as without LMS."""
    _verify_every_swap_runs(swish_cnn_graph)


# ---- the log ----------------------------------------------------------------
def test_a_rewrite_logs_one_warning_line_and_the_step(caplog):
    import logging
    logger = logging.getLogger("tensorflow")
    logger.propagate = True
    caplog.set_level(logging.WARNING, logger="tensorflow")
    graph, _, _ = tiny_step()
    LMS(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0).run(graph)
    lines = [r.getMessage() for r in caplog.records
             if "[LMS]" in r.getMessage()]
    assert len(lines) == 1, lines
    assert re.match(
        r"^\[LMS\]\[0\] Large Model Support rewrote the training step "
        r"\(\d+ of the graph's \d+ operations\) in [\d.]+ s: \d+ tensors "
        r"\([\d.]+ MiB\) go to host memory and back each step; \d+ "
        r"operations added; lms.last_run has the plan$", lines[0]), lines[0]
    caplog.clear()
    caplog.set_level(logging.INFO, logger="tensorflow")
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    graph, train_op, _ = tiny_step()
    in_step = len(reader.fan_in([train_op]))
    total = len(graph.get_operations())
    LMS(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0).run(graph)
    step_lines = [r.getMessage() for r in caplog.records
                  if "The training step is" in r.getMessage()]
    assert step_lines == [
        "[LMS][0] The training step is the fan-in of the graph's train_op "
        "collection (1 op): %d of the graph's %d operations; LMS leaves "
        "the %d others alone" % (in_step, total, total - in_step)]
    assert total - in_step >= 5  # initializers and the eval head


def test_every_swap_op_names_itself():
    graph, _, _ = keras_app_graph(size=32)
    result = LMS(swapout_threshold=30, swapin_ahead=5, swapin_groupby=3).run(
        graph)
    names = list(result.swapout_ops) + list(result.swapin_ops)
    assert len(names) > 20 and len(set(names)) == len(names)
    # Some tensors have more than one swap-in: names the graph made unique.
    assert any(name.endswith("_1") for name in result.swapin_ops)
    for name in names:
        op = graph.get_operation_by_name(name)
        assert op.get_attr(rewriter.UNIQUE_ATTR) == name.encode()


# ---- an Estimator whose model_fn builds a Keras model -----------------------
class _StepRecorder(tf.compat.v1.train.SessionRunHook):
    """Placed before LMS in `hooks`: records the step's fan-in as the
    Estimator built it (begin() runs in hook order), and the run metadata of
    one traced step."""

    def __init__(self, trace_step=2):
        self.before = None
        self.train_ops = None
        self.metadata = None
        self._step = 0
        self._trace_step = trace_step

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        self.train_ops = graph.get_collection(
            tf.compat.v1.GraphKeys.TRAIN_OP)
        self.before = set(reader.fan_in(self.train_ops))

    def before_run(self, run_context):
        self._step += 1
        if self._step == self._trace_step:
            return tf.compat.v1.train.SessionRunArgs(
                fetches=None, options=tf.compat.v1.RunOptions(
                    trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                    output_partition_graphs=True))
        return None

    def after_run(self, run_context, run_values):
        if self._step == self._trace_step:
            self.metadata = run_values.run_metadata


class _LossRecorder(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        loss = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[0]
        return tf.compat.v1.train.SessionRunArgs(loss)

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def _keras_model_fn(features, labels, mode):
    """A functional Keras CNN with batch norm, built inside the model_fn
    (Keras layers on the Estimator's tensors), with an eval metric and a
    summary beside the train op: ops the training step does not run."""
    keras = tf.keras
    # Keras layers take no seed from the Estimator's tf_random_seed: each
    # initializer gets its own, so both runs start from the same weights.
    seeded = keras.initializers.GlorotUniform
    h = features
    for k, filters in enumerate((8, 8, 16, 16)):
        h = keras.layers.Conv2D(filters, 3, padding="same",
                                kernel_initializer=seeded(seed=k))(h)
        h = keras.layers.BatchNormalization()(
            h, training=mode == tf.estimator.ModeKeys.TRAIN)
        h = keras.layers.ReLU()(h)
    logits = keras.layers.Dense(4, kernel_initializer=seeded(seed=9))(
        keras.layers.GlobalAveragePooling2D()(h))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    accuracy = tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1))
    tf.compat.v1.summary.scalar("accuracy", accuracy[1])
    train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      eval_metric_ops={"accuracy": accuracy})


def _input_fn():
    rng = np.random.RandomState(0)
    images = rng.rand(16, 24, 24, 3).astype(np.float32)
    labels = rng.randint(0, 4, 16).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((images, labels))
    return data.batch(4, drop_remainder=True).repeat()


def _train_estimator(tmp_path, name, hooks):
    config = tf.estimator.RunConfig(model_dir=str(tmp_path / name),
                                    tf_random_seed=7,
                                    save_summary_steps=1)
    estimator = tf.estimator.Estimator(_keras_model_fn, config=config)
    losses = _LossRecorder()
    estimator.train(_input_fn, steps=4, hooks=hooks + [losses])
    return losses.losses


@pytest.mark.numerics
@pytest.mark.skipif(compat.TF_VERSION >= (2, 16, 0),
                    reason="tf.estimator was removed in TensorFlow 2.16")
def test_estimator_model_fn_building_keras_trains_the_same(tmp_path):
    """The Estimator pattern of issue 22: a model_fn that builds a Keras
    model, with an eval metric and a summary beside the train op. LMS as a
    hook plans the train op's fan-in only, the step after the rewrite is
    the step before plus LMS's ops, every swap op runs, and the losses are
    the ones without LMS, bit for bit."""
    base = _train_estimator(tmp_path, "base", [])
    recorder = _StepRecorder()
    lms = LMS(swapout_threshold=3, swapin_ahead=1, swapin_groupby=0)
    with_lms = _train_estimator(tmp_path, "lms", [recorder, lms])
    result = lms.last_run
    assert result.rewritten and result.swapout_ops
    # The step LMS planned is the Estimator's train op's fan-in, and after
    # the rewrite it holds the same ops plus LMS's own.
    added = _added(result)
    after = set(reader.fan_in(recorder.train_ops))
    assert after - recorder.before == added
    assert recorder.before <= after
    # Every swap op ran in the traced step.
    executed = {n.node_name for d in recorder.metadata.step_stats.dev_stats
                for n in d.node_stats}
    assert set(result.swapout_ops) | set(result.swapin_ops) <= executed
    np.testing.assert_array_equal(np.asarray(with_lms), np.asarray(base))
