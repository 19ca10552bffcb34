"""``offload_optimizer`` on Session graphs (`tflms.tf.offload_rewrite`):
real training with tf.compat.v1.train optimizers, with and without
offload, compared bit for bit.

The "device" is a logical CPU: each Session splits the machine's CPU in
two (``device_count={"CPU": 2}``), the model is built on ``/cpu:1`` and
``cpu_device`` is ``/cpu:0``, the host. By the public rule every device
but the host that the step computes on is managed (`target.Target.
manages`), so nothing of LMS is patched.
"""

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS, Outcome, offload
from tflms.budget import mem_ratio
from tflms.devices import same_device
from tflms.tf import compat
from tflms.tf import grappler_check
from tflms.tf import rewriter
from tflms.tf.adapters import rewrite

from _stack import needs_estimator
from dist_jobs._common import TraceHook

pytestmark = pytest.mark.numerics

DEVICE = "/cpu:1"
HOST = "/cpu:0"
STEPS = 3
OPTIMIZERS = {
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    "rmsprop": lambda: tf.compat.v1.train.RMSPropOptimizer(0.01,
                                                           momentum=0.5),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
}


def _config():
    return tf.compat.v1.ConfigProto(
        device_count={"CPU": 2}, inter_op_parallelism_threads=1,
        intra_op_parallelism_threads=1)


def _mlp(optimizer, use_resource=True):
    """A 2-layer MLP on ``/cpu:1`` with seeded weights and data:
    ``(graph, loss, train_op)``."""
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    with graph.as_default(), tf.device(DEVICE):
        x = tf.constant(rng.rand(16, 12).astype(np.float32))
        y = tf.constant(rng.rand(16, 3).astype(np.float32))
        h = x
        for i, width in enumerate((24, 3)):
            with tf.compat.v1.variable_scope("dense%d" % i):
                w = tf.compat.v1.get_variable(
                    "kernel", [h.shape[1], width], use_resource=use_resource,
                    initializer=tf.compat.v1.glorot_uniform_initializer(
                        seed=i + 1))
                b = tf.compat.v1.get_variable(
                    "bias", [width], use_resource=use_resource,
                    initializer=tf.compat.v1.constant_initializer(0.1))
            h = tf.matmul(h, w) + b
            if i == 0:
                h = tf.nn.relu(h)
        loss = tf.reduce_mean(tf.square(h - y))
        step = tf.compat.v1.train.get_or_create_global_step()
        train = OPTIMIZERS[optimizer]().minimize(loss, global_step=step)
    return graph, loss, train


def _lms(**kwargs):
    lms = LMS(cpu_device=HOST, **kwargs)
    lms.autotune_gpu_mem = 1  # far above the step: no swap needed
    return lms


def _train(graph, loss, train, steps=STEPS, restore=None, save=None):
    """Train; the losses, every global variable by name, and the last
    step's RunMetadata."""
    with graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
        variables = tf.compat.v1.global_variables()
        saver = tf.compat.v1.train.Saver()
    options = tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
        output_partition_graphs=True)
    with tf.compat.v1.Session(graph=graph, config=_config()) as sess:
        sess.run(init)
        if restore:
            saver.restore(sess, restore)
        losses = []
        metadata = tf.compat.v1.RunMetadata()
        for _ in range(steps):
            losses.append(sess.run([loss, train], options=options,
                                   run_metadata=metadata)[0])
        if save:
            saver.save(sess, save)
        values = dict(zip([v.op.name for v in variables],
                          sess.run(variables)))
    return losses, values, metadata


def _ran_on(metadata):
    """Op name -> the device that ran it."""
    return {node.node_name: dev.device
            for dev in metadata.step_stats.dev_stats
            for node in dev.node_stats}


def _assert_same(a, b):
    assert a[0] == b[0]  # losses, exactly
    assert sorted(a[1]) == sorted(b[1])
    for name in a[1]:
        np.testing.assert_array_equal(a[1][name], b[1][name], err_msg=name)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_offloaded_training_is_bit_identical(optimizer):
    base = _train(*_mlp(optimizer))
    graph, loss, train = _mlp(optimizer)
    result = _lms(offload_optimizer=True).run(graph)
    assert result.outcome is Outcome.REWRITTEN
    found = result.offload
    assert len(found.updates) == 4 and not found.left
    off = _train(graph, loss, train)
    _assert_same(base, off)
    assert off[0][-1] < off[0][0]  # it trains

    ops = result.planned.index.ops
    ran = _ran_on(off[2])
    for u in found.updates:
        apply_op = ops[u.apply]
        # Placed on the host, colocation with the variable cleared; run
        # there, and the write-back ran on the device.
        assert same_device(apply_op.device, HOST)
        assert "_class" not in apply_op.node_def.attr
        assert ran[apply_op.name].endswith("CPU:0"), apply_op.name
        for s in u.slots:
            assert same_device(ops[s].device, HOST)
            assert "_class" not in ops[s].node_def.attr
        assert same_device(ops[u.variable].device, DEVICE)
        scope = "lms/offload/%s/" % ops[u.variable].name
        assert ran[scope + "write_back"].endswith("CPU:1")
        assert ran[scope + "gradient"].endswith("CPU:0")
        assert ran[scope + "fill"].endswith("CPU:0")
    # Every op the offload added ran.
    assert set(result.rewrite.offload_ops) <= set(ran)


class _ElementwiseMomentum:
    """Momentum written out in ops, as code without a fused kernel does:
    ``m = 0.9 * m + g; w -= 0.05 * m`` per variable, the velocity a
    resource variable of no collection the Saver misses (trainable=False,
    made beside the variable)."""

    def minimize(self, loss, global_step=None):
        variables = tf.compat.v1.trainable_variables()
        grads = tf.gradients(loss, variables)
        updates = []
        for v, g in zip(variables, grads):
            m = tf.compat.v1.get_variable(
                v.op.name + "/velocity", v.shape, trainable=False,
                initializer=tf.compat.v1.zeros_initializer())
            write_m = m.assign(m.read_value() * 0.9 + g)
            with tf.control_dependencies([write_m]):
                updates.append(v.assign_sub(m.read_value() * 0.05))
        with tf.control_dependencies(updates):
            return global_step.assign_add(1)


def test_session_graph_elementwise_updates_move_bit_for_bit():
    # No fused kernel: the element-wise update found on the Session graph
    # (tflms.offload_elementwise), its velocity's handle placed on the
    # host with its reads and writes, the arithmetic there too.
    OPTIMIZERS["elementwise"] = _ElementwiseMomentum
    try:
        base = _train(*_mlp("elementwise"))
        graph, loss, train = _mlp("elementwise")
        # No optimizer LMS recognises: the step is named.
        result = _lms(offload_optimizer=True).run(graph,
                                                  fetches=[loss, train])
        off = _train(graph, loss, train)
    finally:
        del OPTIMIZERS["elementwise"]
    assert result.outcome is Outcome.REWRITTEN
    found = result.offload
    assert len(found.updates) == 4 and not found.left
    assert all(u.host_ops for u in found.updates)
    _assert_same(base, off)
    ops = result.planned.index.ops
    ran = _ran_on(off[2])
    for u in found.updates:
        for s in u.slots:
            assert same_device(ops[s].device, HOST)
        # Every host op that ran (Grappler removes the identities) ran on
        # the host, the velocity's write among them.
        names = [ops[op].name for op in u.host_ops]
        assert all(ran[n].endswith("CPU:0") for n in names if n in ran)
        assert any(ops[op].type == "AssignVariableOp"
                   and ran[ops[op].name].endswith("CPU:0")
                   for op in u.host_ops)
        # The variable and its write stay on the device.
        assert ran[ops[u.apply].name].endswith("CPU:1")


def _estimator_model_fn(features, labels, mode):
    """A 2-layer MLP on ``/cpu:1`` trained with Adam (the Estimator makes
    the global step and the session)."""
    with tf.device(DEVICE):
        h = features["x"]
        for i, width in enumerate((24, 3)):
            h = tf.compat.v1.layers.dense(
                h, width, activation=tf.nn.relu if i == 0 else None,
                name="dense%d" % i,
                kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
                    seed=i + 1))
        loss = tf.reduce_mean(tf.square(h - labels))
        train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def _estimator_input_fn():
    rng = np.random.RandomState(0)
    x = rng.rand(32, 12).astype(np.float32)
    y = rng.rand(32, 3).astype(np.float32)
    return tf.compat.v1.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(
        8, drop_remainder=True).repeat()


def _train_estimator(model_dir, hooks):
    est = tf.compat.v1.estimator.Estimator(
        _estimator_model_fn, model_dir=str(model_dir),
        config=tf.compat.v1.estimator.RunConfig(
            tf_random_seed=1, session_config=_config()))
    est.train(_estimator_input_fn, steps=STEPS, hooks=hooks)
    return {n: est.get_variable_value(n) for n in est.get_variable_names()}


@needs_estimator
def test_the_estimator_hook_offloads_bit_for_bit(tmp_path):
    """``hooks=[lms]`` with offload_optimizer=True: the updates run on the
    host and the weights, slots and step counters the Estimator saves are
    bit for bit those of training without LMS (the host copies are in no
    checkpoint)."""
    base = _train_estimator(tmp_path / "plain", [])
    lms = _lms(offload_optimizer=True)
    trace = TraceHook()
    got = _train_estimator(tmp_path / "lms", [lms, trace])
    result = lms.last_run
    assert result.outcome is Outcome.REWRITTEN
    assert len(result.offload.updates) == 4
    assert result.offload.slot_bytes == 2 * result.offload.weight_bytes
    # Every op the offload added ran, the write-backs among them.
    assert set(result.rewrite.offload_ops) <= trace.executed
    assert sum(name.endswith("/write_back")
               for name in result.rewrite.offload_ops) == 4
    assert base.keys() == got.keys()
    assert any(name.endswith("/Adam_1") for name in base)
    for name in base:
        np.testing.assert_array_equal(base[name], got[name], err_msg=name)


def _resident(result):
    sim = result.planned.without_lms
    return sim.resident_device_bytes, sim.resident_host_bytes


@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_slots_are_planned_in_host_memory(optimizer):
    graph, _, _ = _mlp(optimizer)
    base = _lms().run(graph)
    assert base.outcome is Outcome.NOT_NEEDED and base.offload is None
    graph, _, _ = _mlp(optimizer)
    result = _lms(offload_optimizer=True).run(graph)
    found = result.offload
    weights = (12 * 24 + 24 + 24 * 3 + 3) * 4
    slots_per_variable = {"adam": 2, "momentum": 1}[optimizer]
    assert found.weight_bytes == weights
    assert found.slot_bytes == slots_per_variable * weights
    assert found.gradient_bytes == weights
    assert found.moved_bytes() == 3 * weights
    device, host = _resident(base)
    off_device, off_host = _resident(result)
    # The slots leave the device; the host holds them and the copies of
    # the weights the updates work on.
    assert off_device == device - found.slot_bytes
    assert off_host == host + found.slot_bytes + found.weight_bytes
    # The peak drops by the slots, less at most one variable's new
    # weights landing on the device before their write-back (the
    # largest: the first layer's kernel).
    landed = max(b for _, b, _ in offload.write_back_buffers(
        found, result.planned.index))
    assert landed == 12 * 24 * 4
    assert (result.planned.without_lms.peak_device_bytes
            <= base.planned.without_lms.peak_device_bytes
            - found.slot_bytes + landed)
    # The device ops are those of /cpu:1 (the host rule) and the unplaced
    # reads TensorFlow puts with their variables there; none on the host.
    placed = result.planned.index.devices
    roles = result.planned.context.roles
    assert any(same_device(placed[i], DEVICE) for i in roles.device_ops)
    assert all(placed[i] == "" or same_device(placed[i], DEVICE)
               for i in roles.device_ops)


def test_checkpoints_restore_across_offload(tmp_path):
    with_path = str(tmp_path / "with")
    without_path = str(tmp_path / "without")
    # Written with offload (Saver made after the rewrite), restored
    # without it: the same values, and training goes on the same.
    graph, loss, train = _mlp("adam")
    _lms(offload_optimizer=True).run(graph)
    written = _train(graph, loss, train, steps=2, save=with_path)
    plain = _train(*_mlp("adam"), steps=1, restore=with_path)
    graph, loss, train = _mlp("adam")
    _lms(offload_optimizer=True).run(graph)
    offloaded = _train(graph, loss, train, steps=1, restore=with_path)
    _assert_same(plain, offloaded)
    assert plain[1]["global_step"] == written[1]["global_step"] + 1

    # Written without offload, restored by a Saver made before the
    # rewrite (its restore ops take the slots' handles, and move with
    # them).
    _train(*_mlp("adam"), steps=2, save=without_path)
    graph, loss, train = _mlp("adam")
    with graph.as_default():
        tf.compat.v1.train.Saver()
    _lms(offload_optimizer=True).run(graph)
    restored = _train(graph, loss, train, steps=1, restore=without_path)
    _assert_same(_train(*_mlp("adam"), steps=1, restore=without_path),
                 restored)


def test_a_second_run_finds_the_graph_rewritten():
    graph, _, _ = _mlp("adam")
    lms = _lms(offload_optimizer=True)
    assert lms.run(graph).outcome is Outcome.REWRITTEN
    count = len(graph.get_operations())
    again = _lms(offload_optimizer=True).run(graph)
    assert again.outcome is Outcome.ALREADY_REWRITTEN
    assert len(graph.get_operations()) == count


def test_grappler_optimizes_the_offloaded_step_as_without():
    """With grappler_check on, the ops offload adds (named by the rewriter,
    `rewriter.offload_op_name`) are LMS's own, and the host copy an update
    runs on stands for its variable: Grappler's optimized step is the same
    as without LMS."""
    graph, _, _ = _mlp("adam")
    lms = _lms(offload_optimizer=True)
    lms.grappler_check = True
    result = lms.run(graph)
    assert result.outcome is Outcome.REWRITTEN
    assert len(result.offload.updates) == 4
    assert result.grappler is not None
    assert result.grappler.same, "\n".join(result.grappler.lines())
    assert all(grappler_check.is_lms_name(name)
               for name in result.rewrite.offload_ops)
    assert {rewriter.offloaded_variable(name)
            for name in result.rewrite.offload_ops
            if name.endswith("/host")} == {
        "dense0/kernel", "dense0/bias", "dense1/kernel", "dense1/bias"}


def test_reference_variables_are_refused_before_any_edit():
    graph, _, _ = _mlp("adam", use_resource=False)
    count = len(graph.get_operations())
    with pytest.raises(offload.OffloadUnsupportedError,
                       match=r"offload_optimizer=True cannot move the "
                             r"update '.*ApplyAdam' \(ApplyAdam\): it "
                             r"updates a reference variable"):
        _lms(offload_optimizer=True).run(graph)
    assert len(graph.get_operations()) == count


def test_function_steps_leave_fused_updates_on_the_device():
    # A tf.compat.v1.train optimizer inside a tf.function updates through
    # a fused kernel on captured handles: LMS cannot give it a host copy
    # there, so it stays on the device, named, and the rest is planned.
    variable = tf.Variable(tf.ones([4, 4]))
    optimizer = tf.compat.v1.train.AdamOptimizer(0.1)

    def step():
        loss = tf.reduce_sum(tf.matmul(variable, variable))
        with tf.control_dependencies(
                [optimizer.minimize(loss, var_list=[variable])]):
            return tf.identity(loss)

    graph = tf.function(step).get_concrete_function().graph
    result = rewrite.rewrite_function_graph(
        graph, _lms(offload_optimizer=True).settings)
    assert result.offload.updates == ()
    (left,) = result.offload.left
    assert "ResourceApplyAdam" in left
    assert not any(op.device for op in graph.get_operations()
                   if op.type == "ResourceApplyAdam")


def _wide(optimizer="adam", width=512, depth=3):
    """An MLP whose weights and Adam moments outweigh its activations:
    ``(graph, loss, train_op)`` on ``/cpu:1``."""
    graph = tf.Graph()
    rng = np.random.RandomState(1)
    with graph.as_default(), tf.device(DEVICE):
        h = tf.constant(rng.rand(8, width).astype(np.float32))
        for i in range(depth):
            w = tf.compat.v1.get_variable(
                "w%d" % i, [width, width],
                initializer=tf.compat.v1.glorot_uniform_initializer(
                    seed=i + 1))
            h = tf.nn.relu(tf.matmul(h, w))
        loss = tf.reduce_mean(tf.square(h))
        train = OPTIMIZERS[optimizer]().minimize(loss)
    return graph, loss, train


def _floor(result):
    from tflms import pipeline
    return pipeline.step_floor(result.planned)


def test_offload_fits_where_no_plan_does_without_it():
    from tflms import autotune
    # The floors, measured on the step with a budget far above it.
    graph, _, _ = _wide()
    without = _floor(_lms().run(graph))
    graph, _, _ = _wide()
    offloaded = _lms(offload_optimizer=True).run(graph)
    floor = _floor(offloaded)
    slots = offloaded.offload.slot_bytes
    assert without.resident_bytes - floor.resident_bytes == slots
    assert floor.floor_bytes < without.floor_bytes
    # A budget between the two floors: nothing fits without offload;
    # with it the step fits, and trains as it does without LMS.
    budget = (floor.floor_bytes + without.floor_bytes) / 2
    gib = budget / mem_ratio() / (1 << 30)
    graph, _, _ = _wide()
    lms = _lms()
    lms.autotune_gpu_mem = gib
    with pytest.raises(autotune.AutotuneError):
        lms.run(graph)
    base = _train(*_wide(), steps=2)
    for setting in (True, "auto"):
        graph, loss, train = _wide()
        lms = _lms(offload_optimizer=setting)
        lms.autotune_gpu_mem = gib
        result = lms.run(graph)
        assert result.outcome is Outcome.REWRITTEN
        assert len(result.offload.updates) == 3
        peak = result.planned.with_lms or result.planned.without_lms
        assert peak.peak_device_bytes <= budget
        _assert_same(base, _train(graph, loss, train, steps=2))


def test_auto_offloads_only_when_nothing_fits_without():
    graph, _, _ = _wide()
    count = len(graph.get_operations())
    result = _lms(offload_optimizer="auto").run(graph)
    assert result.outcome is Outcome.NOT_NEEDED and result.offload is None
    assert len(graph.get_operations()) == count


def _keras2_fit(callbacks):
    """A Keras 2 model on ``/cpu:1`` fitted for two epochs in graph mode:
    ``(losses, weights, the update ops' devices)``."""
    keras = compat.keras2()
    tf.compat.v1.reset_default_graph()
    compat.keras2_backend().set_session(
        tf.compat.v1.Session(config=_config()))
    with tf.device(DEVICE):
        model = keras.Sequential([
            keras.layers.Dense(
                16, activation="relu", input_shape=(8,),
                kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
            keras.layers.Dense(
                2, kernel_initializer=keras.initializers.GlorotUniform(
                    seed=2))])
        model.compile(optimizer=keras.optimizers.legacy.Adam(0.01),
                      loss="mse")
    rng = np.random.RandomState(0)
    x = rng.rand(32, 8).astype(np.float32)
    y = rng.rand(32, 2).astype(np.float32)
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False,
                        verbose=0, callbacks=callbacks)
    graph = tf.compat.v1.get_default_graph()
    applies = [op.device for op in graph.get_operations()
               if op.type == "ResourceApplyAdam"]
    return history.history["loss"], model.get_weights(), applies


def test_keras2_fit_offloads_through_the_session_path():
    base_losses, base_weights, base_devices = _keras2_fit([])
    lms = _lms(offload_optimizer=True)
    losses, weights, applied = _keras2_fit([lms])
    assert lms.last_run.outcome is Outcome.REWRITTEN
    assert len(lms.last_run.offload.updates) == 4
    assert all(same_device(d, DEVICE) for d in base_devices)
    assert applied and all(same_device(d, HOST) for d in applied)
    assert losses == base_losses
    for a, b in zip(base_weights, weights):
        np.testing.assert_array_equal(a, b)


def test_tflms_plan_reports_the_offload(tmp_path, capsys):
    import json

    from tflms import cli
    graph, _, train = _wide()
    path = str(tmp_path / "wide.meta")
    with graph.as_default():
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP,
                                       train)
        tf.compat.v1.train.export_meta_graph(filename=path)
    common = [path, "--cpu-device", HOST, "--autotune-gpu-mem", "1",
              "--no-plots"]
    assert cli.main(["plan"] + common + ["--offload-optimizer",
                                         "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    moved = report["offload"]
    weights = 3 * 512 * 512 * 4
    assert sorted(moved["variables"]) == ["w0", "w1", "w2"]
    assert (moved["slot_bytes"], moved["weight_bytes"],
            moved["moved_bytes"]) == (2 * weights, weights, 3 * weights)
    # The predicted step with offload counts its copies and host updates,
    # even where no swap is planned.
    step = report["step_time"]
    assert step["with_lms_ms"] > step["without_lms_ms"] > 0
    assert cli.main(["plan"] + common + ["--offload-optimizer"]) == 0
    assert ("Optimizer offload: 3 variables' updates and their slots "
            "(6.0 MiB) on /cpu:0; 9.0 MiB copied per step (every peak "
            "below counts them there)" in capsys.readouterr().out)
    assert cli.main(["plan"] + common + ["--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["offload"] is None
    assert plain["step_time"]["with_lms_ms"] is None
    assert plain["step_time"]["without_lms_ms"] == step["without_lms_ms"]


def _embedding_model():
    """An embedding read by tf.gather (a sparse update) and a dense layer,
    trained with Adagrad on ``/cpu:1``."""
    graph = tf.Graph()
    with graph.as_default(), tf.device(DEVICE):
        ids = tf.constant([[1, 3], [0, 3], [2, 2]])
        table = tf.compat.v1.get_variable(
            "table", [5, 6],
            initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
        w = tf.compat.v1.get_variable(
            "w", [6, 2],
            initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
        h = tf.reduce_sum(tf.gather(table, ids), axis=1)
        loss = tf.reduce_mean(tf.square(tf.matmul(h, w) - 1.0))
        train = OPTIMIZERS["adagrad"]().minimize(loss)
    return graph, loss, train


def test_sparse_updates_stay_on_the_device_and_are_named():
    base = _train(*_embedding_model())
    graph, loss, train = _embedding_model()
    result = _lms(offload_optimizer=True).run(graph)
    ops = result.planned.index.ops
    assert [ops[u.variable].name for u in result.offload.updates] == ["w"]
    (left,) = result.offload.left
    assert left.endswith("ResourceSparseApplyAdagrad")
    assert "1 updates stay on the device" in result.offload.describe()
    _assert_same(base, _train(graph, loss, train))


def test_capacity_with_offload_finds_a_larger_batch():
    from tflms import capacity
    from tflms.settings import Settings
    from tflms.tf import live_capacity
    width = 256
    graph = tf.Graph()
    with graph.as_default(), tf.device(DEVICE):
        h = tf.compat.v1.placeholder(tf.float32, [None, width])
        for i in range(3):
            w = tf.compat.v1.get_variable(
                "w%d" % i, [width, width],
                initializer=tf.compat.v1.glorot_uniform_initializer(
                    seed=i + 1))
            h = tf.nn.relu(tf.matmul(h, w))
        tf.compat.v1.train.AdamOptimizer(0.01).minimize(
            tf.reduce_mean(tf.square(h)))
    weights = 3 * width * width * 4
    # A budget of the weights, their two moments and as much again: the
    # moments on the host leave room for a larger batch.
    gib = 4 * weights / mem_ratio() / (1 << 30)
    found = {}
    for offloaded in (False, True):
        settings = Settings(autotune_gpu_mem=gib, cpu_device=HOST,
                            offload_optimizer=offloaded)
        plan_at = live_capacity.graph_plan_at(graph, settings)
        found[offloaded] = capacity.search(
            plan_at, 4 * weights, limit=1 << 16).largest_with_lms
    assert found[False] is not None
    assert found[True] > found[False]
