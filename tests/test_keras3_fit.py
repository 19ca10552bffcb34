"""The LMS callback with Keras 3: ``model.fit(..., callbacks=[LMS()])``.

Keras 3 exists on TensorFlow 2.16+ only: on 2.15 ``keras`` is Keras 2,
whose callback rewrites graph-mode graphs (test_keras2_session.py,
test_models.py), and this file skips.

Keras 3 needs ``TF_USE_LEGACY_KERAS`` unset and eager execution on, and
this test process has eager execution off (conftest.py), so each case runs
this file as a script in a subprocess (``python tests/test_keras3_fit.py
CASE DUMP_DIR``) with ``TF_ENABLE_ONEDNN_OPTS`` set explicitly (to the
value the suite runs with, "0" when unset), which prints one JSON line
the test checks.

The witness that the swap ops ran is the one of test_lms_function.py: with
``TF_DUMP_GRAPH_PREFIX`` set, TensorFlow writes the graphs of Keras' train
function (``multi_step_on_iterator``; the rewritten step is inlined there,
with ``steps_per_execution`` > 1 in its lowered loop) up to the
per-device partition graphs its executors run. Every swap op must be in
them, on the CPU.
"""

import json
import os
import sys

import pytest

from _keras3 import error_of, onednn, result_of, swaps_not_run

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

SEED = 1
# Only Keras' train function's graphs are dumped (the step is inlined in
# it).
DUMP_FILTER = "multi_step_on_iterator"
FIXED = dict(swapout_threshold=3, swapin_ahead=1, swapin_groupby=0)


# ---- the script (runs in the subprocess) -------------------------------

def _cnn(keras):
    """A small CNN with batch norm."""
    layers = [keras.Input((16, 16, 3))]
    for width in (8, 8, 16):
        layers.append(keras.layers.Conv2D(width, 3, padding="same"))
        layers.append(keras.layers.BatchNormalization())
        layers.append(keras.layers.ReLU())
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)]
    return keras.Sequential(layers), (16, 16, 3), 4


def _resnet(keras):
    """A small ResNet: residual blocks with batch norm and projection
    shortcuts, as in Keras' ResNet50 (which is too chaotic to compare: see
    test_fit_with_the_callback_trains_the_same_with_swaps_that_run)."""
    layers = keras.layers
    x = inputs = keras.Input((16, 16, 3))
    x = layers.ReLU()(layers.BatchNormalization()(
        layers.Conv2D(8, 3, padding="same")(x)))
    for filters, stride in ((8, 1), (16, 2), (16, 1)):
        y = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(
            filters, 3, strides=stride, padding="same")(x)))
        y = layers.BatchNormalization()(layers.Conv2D(
            filters, 3, padding="same")(y))
        if stride != 1 or x.shape[-1] != filters:
            x = layers.BatchNormalization()(layers.Conv2D(
                filters, 1, strides=stride)(x))
        x = layers.ReLU()(layers.Add()([x, y]))
    y = layers.Dense(4)(layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, y), (16, 16, 3), 4


def _rnn(keras):
    """Two LSTMs: while loops in the step."""
    return keras.Sequential([
        keras.Input((12, 8)), keras.layers.LSTM(16, return_sequences=True),
        keras.layers.LSTM(16), keras.layers.Dense(4)]), (12, 8), 4


def _mha(keras):
    """Self-attention over 6 positions (Keras' MultiHeadAttention): its
    gradient computes broadcast reduction axes (BroadcastGradientArgs, of
    shape (?)) even with every shape static, and its means are over 6
    positions, whose factor 1/6 TensorFlow's gradient applies one way when
    the batch dimension is known and another when it is not."""
    x = inputs = keras.Input((6, 16))
    x = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
    y = keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(inputs, y), (6, 16), 4


_MODELS = {"cnn": _cnn, "resnet": _resnet, "rnn": _rnn, "mha": _mha}


def _data(shape, batch, batches=3):
    import numpy as np
    rng = np.random.RandomState(0)
    n = batch * batches
    return (rng.rand(n, *shape).astype("float32"),
            rng.randint(0, 4, n).astype("int32"))


def _model(keras, model_name, steps_per_execution=1, jit_compile=False,
           **compile_args):
    keras.utils.set_random_seed(SEED)
    model, shape, batch = _MODELS[model_name](keras)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True),
                  steps_per_execution=steps_per_execution,
                  jit_compile=jit_compile, **compile_args)
    return model, shape, batch


def _fit(keras, model_name, lms=None, epochs=2, **compile_args):
    """The model after `epochs` epochs of 3 batches, the losses, the
    weights, and a function that fits it again without `lms`."""
    model, shape, batch = _model(keras, model_name, **compile_args)
    x, y = _data(shape, batch)
    history = model.fit(x, y, batch_size=batch, epochs=epochs,
                        shuffle=False, verbose=0,
                        callbacks=[lms] if lms is not None else [])

    def again(lms=None):
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False,
                  verbose=0, callbacks=[lms] if lms is not None else [])
    return (model, history.history["loss"],
            [v.numpy() for v in model.weights], again)


def _case_fit(keras, tf, dump_dir, model_name="cnn", steps_per_execution=1,
              jit_compile=False):
    """fit with the LMS callback against fit without it, from the same
    seed; the witness; the model after the fit."""
    import numpy as np
    from tflms import LMS
    from tflms.tf import swaps_ran
    compile_args = dict(steps_per_execution=steps_per_execution,
                        jit_compile=jit_compile)
    # The reference runs the kernels LMS's fit runs: without XLA.
    _, base_losses, base_weights, _ = _fit(
        keras, model_name, steps_per_execution=steps_per_execution)
    lms = LMS(**FIXED)
    model, losses, weights, again = _fit(keras, model_name, lms,
                                         **compile_args)
    result = lms.last_run
    graphs = swaps_ran.partition_graph_files(dump_dir)
    swap_ops = list(result.swapout_ops) + list(result.swapin_ops)
    ran = swaps_ran.swap_ops_in_partition_graphs(graphs, swap_ops)
    after = dict(own_step="train_step" not in vars(model),
                 jit_compile=model.jit_compile,
                 keras_train_function=model.train_function is not None
                 and not getattr(model.train_function, "tflms_guarded",
                                 False))
    # The same model fit again without the callback: its own step, no swap.
    again()
    later_graphs = swaps_ran.partition_graph_files(dump_dir) - graphs
    later = swaps_ran.swap_ops_in_partition_graphs(later_graphs)
    # And again with the callback: Keras kept its train function, so the
    # callback runs its own again (the one whose partition graphs above
    # held every swap op), traced and planned once.
    changes = lms._fit.changes
    function = changes.train_function
    again(lms)
    reused_graphs = (swaps_ran.partition_graph_files(dump_dir) - graphs
                     - later_graphs)
    return dict(
        outcome=result.outcome.value, swapouts=len(result.swapout_ops),
        swapins=len(result.swapin_ops),
        base_losses=base_losses, losses=losses,
        num_weights=len(weights),
        weights_equal=all(np.array_equal(a, b)
                          for a, b in zip(base_weights, weights)),
        weights_close=all(np.allclose(a, b, rtol=1e-4, atol=1e-6)
                          for a, b in zip(base_weights, weights)),
        partition_graphs=bool(graphs),
        missing=[n for n in swap_ops if n not in ran],
        off_cpu=[n for n in swap_ops
                 if n in ran and "CPU" not in ran[n].upper()],
        after=after, later_swaps=len(later), later_graphs=bool(later_graphs),
        reused_plan=lms.last_run is result,
        reused_function=(lms._fit.changes
                         .train_function is function),
        reused_graphs=len(reused_graphs))


def _case_autotune(keras, tf, dump_dir):
    """LMS() auto-tuned in a fit: the batch dimension Keras traces with is
    known when the data is a whole number of batches (no batch_size to
    set); with a last, smaller batch it is not, and the error says to set
    lms.batch_size, which then works."""
    from tflms import LMS, autotune
    _, base_losses, _, _ = _fit(keras, "cnn")
    roomy = LMS()
    roomy.autotune_gpu_mem = 16.0
    _, roomy_losses, _, _ = _fit(keras, "cnn", roomy)
    peak = roomy.last_run.planned.without_lms.peak_device_bytes
    gib = 0.7 * peak / autotune.mem_ratio() / (1 << 30)
    tight = LMS()
    tight.autotune_gpu_mem = gib
    _, tight_losses, _, _ = _fit(keras, "cnn", tight)
    tuned = tight.last_run

    def ragged(lms):
        model, shape, batch = _model(keras, "cnn")
        x, y = _data(shape, batch)
        try:
            model.fit(x[:-1], y[:-1], batch_size=batch, epochs=1,
                      shuffle=False, verbose=0, callbacks=[lms])
        except Exception as e:
            return [type(e).__name__, str(e),
                    "train_step" not in vars(model)]
        return lms.last_run.outcome.value
    unknown = LMS()
    unknown.autotune_gpu_mem = gib
    told = LMS()
    told.autotune_gpu_mem = gib
    told.batch_size = 4
    return dict(
        base_losses=base_losses, roomy_losses=roomy_losses,
        roomy_outcome=roomy.last_run.outcome.value,
        tight_losses=tight_losses, tight_outcome=tuned.outcome.value,
        autotuned=bool(tuned.planned.autotuned),
        swapouts=len(tuned.swapout_ops),
        fits=tuned.planned.with_lms.peak_device_bytes
        <= tuned.planned.budget_bytes,
        unknown_batch=ragged(unknown), batch_size_set=ragged(told))


def _weights_equal(a, b):
    import numpy as np
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def _case_mha_autotune(keras, tf, dump_dir):
    """LMS() auto-tuned on the attention model with whole batches and no
    batch size: its shape vectors of unknown length are not batch-sized."""
    from tflms import LMS, autotune
    from tflms.tf import swaps_ran
    _, base_losses, base_weights, _ = _fit(keras, "mha")
    roomy = LMS()
    roomy.autotune_gpu_mem = 16.0
    _fit(keras, "mha", roomy)
    peak = roomy.last_run.planned.without_lms.peak_device_bytes
    tight = LMS()
    tight.autotune_gpu_mem = 0.7 * peak / autotune.mem_ratio() / (1 << 30)
    graphs = swaps_ran.partition_graph_files(dump_dir)
    _, losses, weights, _ = _fit(keras, "mha", tight)
    result = tight.last_run
    missing, off_cpu = swaps_not_run(result, dump_dir, graphs)
    return dict(
        roomy_outcome=roomy.last_run.outcome.value,
        outcome=result.outcome.value, autotuned=bool(result.planned.autotuned),
        swapouts=len(result.swapout_ops), swapins=len(result.swapin_ops),
        fits=result.planned.with_lms.peak_device_bytes
        <= result.planned.budget_bytes,
        base_losses=base_losses, losses=losses,
        weights_equal=_weights_equal(base_weights, weights),
        missing=missing, off_cpu=off_cpu)


def _case_refit(keras, tf, dump_dir):
    """Two fits of the attention model with the same callback, at batch 3
    then 5, against the same fits without it: Keras traces its train
    function again at the second with the batch dimension unknown
    (reduce_retracing), and LMS's step must be traced so too."""
    from tflms import LMS
    from tflms.tf import swaps_ran

    def fits(lms=None):
        model, shape, _ = _model(keras, "mha")
        losses, runs, missing, off_cpu = [], [], [], []
        for batch in (3, 5):
            graphs = swaps_ran.partition_graph_files(dump_dir)
            x, y = _data(shape, batch)
            history = model.fit(x, y, batch_size=batch, epochs=1,
                                shuffle=False, verbose=0,
                                callbacks=[lms] if lms is not None else [])
            losses += history.history["loss"]
            if lms is not None:
                runs.append(lms.last_run)
                gone, off = swaps_not_run(lms.last_run, dump_dir, graphs)
                missing += gone
                off_cpu += off
        return losses, [v.numpy() for v in model.weights], runs, missing, \
            off_cpu

    base_losses, base_weights, _, _, _ = fits()
    lms = LMS(**FIXED)
    losses, weights, runs, missing, off_cpu = fits(lms)
    step = lms._fit.changes.step
    return dict(
        outcomes=[r.outcome.value for r in runs],
        swapouts=[len(r.swapout_ops) for r in runs],
        two_plans=runs[0] is not runs[1],
        traced_batches=sorted(
            (f.graph.inputs[0].shape[0] for f in
             step.concrete_functions.values()),
            key=lambda b: -1 if b is None else b),
        base_losses=base_losses, losses=losses,
        weights_equal=_weights_equal(base_weights, weights),
        missing=missing, off_cpu=off_cpu)


def _case_errors(keras, tf, dump_dir):
    """Where the callback cannot work: the error, raised before the model
    is changed or trained."""
    from tflms import LMS
    out = {}

    def unchanged(model, weights):
        return ("train_step" not in vars(model) and all(
            (a == v.numpy()).all() for a, v in zip(weights, model.weights)))

    model, shape, batch = _model(keras, "cnn", run_eagerly=True)
    weights = [v.numpy() for v in model.weights]
    x, y = _data(shape, batch)
    out["run_eagerly"] = error_of(lambda: model.fit(
        x, y, batch_size=batch, verbose=0, callbacks=[LMS(**FIXED)]))
    out["run_eagerly_unchanged"] = unchanged(model, weights)

    # MirroredStrategy works (test_keras3_distributed.py); a strategy
    # whose step LMS does not plan raises.
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        ["/cpu:0"])
    with strategy.scope():
        model, _, _ = _model(keras, "cnn")
    weights = [v.numpy() for v in model.weights]
    out["strategy"] = error_of(lambda: model.fit(
        x, y, batch_size=batch, verbose=0, callbacks=[LMS(**FIXED)]))
    out["strategy_unchanged"] = unchanged(model, weights)

    # Not an error: a model class of the user's own, with its own
    # train_step, is a Keras 3 model too.
    class Custom(keras.Sequential):
        calls = 0

        def train_step(self, data):
            Custom.calls += 1
            return super().train_step(data)
    keras.utils.set_random_seed(SEED)
    custom = Custom([keras.Input((16, 16, 3)), keras.layers.Conv2D(
        8, 3, padding="same"), keras.layers.ReLU(), keras.layers.Conv2D(
            8, 3, padding="same"), keras.layers.GlobalAveragePooling2D(),
                     keras.layers.Dense(4)])
    custom.compile(optimizer="sgd", loss=keras.losses.
                   SparseCategoricalCrossentropy(from_logits=True))
    lms = LMS(**FIXED)
    custom.fit(x, y, batch_size=batch, verbose=0, callbacks=[lms])
    out["custom"] = [lms.last_run.outcome.value, Custom.calls,
                     "train_step" not in vars(custom)]
    return out


_CASES = {"fit": _case_fit, "autotune": _case_autotune,
          "mha_autotune": _case_mha_autotune, "refit": _case_refit,
          "errors": _case_errors}


def _main(case, dump_dir):
    sys.path.insert(0, _ROOT)
    import tensorflow as tf
    import keras
    tf.get_logger().setLevel("INFO")  # LMS's [LMS][0] info lines too
    name, *args = case.split(":")
    kwargs = {}
    if name == "fit":
        kwargs = dict(model_name=args[0], steps_per_execution=int(args[1]),
                      jit_compile=args[2] == "xla")
    print("RESULT " + json.dumps(_CASES[name](keras, tf, dump_dir,
                                              **kwargs)))


# ---- the tests -----------------------------------------------------------

def _new_stack():
    from tflms.tf import compat
    return compat.TF_VERSION >= (2, 16, 0)


pytestmark = pytest.mark.skipif(
    not _new_stack(), reason="Keras 3 needs TensorFlow 2.16+; on 2.15 keras "
    "is Keras 2, whose callback rewrites graphs (test_keras2_session.py)")


def _run(case, tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    return result_of(os.path.abspath(__file__), case, dump,
                     TF_DUMP_GRAPH_PREFIX=str(dump),
                     TF_DUMP_GRAPH_NAME_FILTER=DUMP_FILTER)


def _check_same_training(r, losses="losses", base="base_losses",
                         exact=True):
    if onednn() == "1" or not exact:
        # A swapped tensor may keep oneDNN from fusing two ops, which
        # rounds differently.
        assert r[losses] == pytest.approx(r[base], rel=1e-5)
        if "weights_close" in r:
            assert r["weights_close"]
    else:
        assert r[losses] == r[base]
        if "weights_equal" in r:
            assert r["weights_equal"]


# Each case trains in one of CI's oneDNN modes (tools/run_tests.sh): those
# marked `onednn_off_pass` with it off (the Python 3.13 pass, where the
# comparisons are exact), the others with it on (to rounding).
_OFF = pytest.mark.onednn_off_pass


@pytest.mark.numerics
@pytest.mark.parametrize("case", [
    pytest.param("cnn:1:-", marks=_OFF),
    "rnn:1:-",
    "resnet:1:-",
    # The step in the loop of Keras' train function, and XLA asked for.
    pytest.param("cnn:3:xla", marks=_OFF),
])
def test_fit_with_the_callback_trains_the_same_with_swaps_that_run(
        case, tmp_path):
    """fit(callbacks=[LMS(...)]) against fit without it, same seed: the
    same losses and weights, every swap op in the partition graphs of
    Keras' train function, on the CPU; after the fit the model has its
    own step (and XLA setting) back, a fit without the callback adds no
    swap op, and a fit with it again runs the same rewrite, not planned
    again.

    The ResNet trains within float rounding of the original, not bit for
    bit: Grappler's arithmetic optimizer (AddOpsRewrite) regroups a
    residual Add with the additions of the batch norm before it into an
    AddN, and a swap-in between them makes it group them differently (it
    does not rewrite through the swap Identity). Keras' own ResNet50 on
    random images at batch 2 or 4 is too ill-conditioned to compare at
    all: its last batch norms normalize over 2-4 nearly equal values, so
    that rounding flips signs (the first step's outputs differed by 2.09
    with only 4 swaps, all 4 shortcut Adds; with Grappler's
    arithmetic_optimization off they were equal).
    """
    r, log = _run("fit:" + case, tmp_path)
    assert r["outcome"] == "rewritten"
    assert r["swapouts"] > 0 and r["swapins"] >= r["swapouts"]
    assert r["num_weights"] > 0
    _check_same_training(r, exact=not case.startswith("resnet"))
    assert r["partition_graphs"], "TensorFlow dumped no partition graph"
    assert r["missing"] == [] and r["off_cpu"] == []
    xla = case.endswith(":xla")
    assert r["after"] == dict(own_step=True, jit_compile=xla,
                              keras_train_function=True)
    assert r["later_graphs"] and r["later_swaps"] == 0
    # A later fit with the same callback runs the same rewritten step, in
    # the train function it ran in (traced once: no new graph).
    assert r["reused_plan"] and r["reused_function"]
    assert r["reused_graphs"] == 0
    assert ("Keras 3 fit: LMS rewrites the model's training step "
            "(model.train_step) when Keras traces its train function") in log
    assert "Large Model Support rewrote the training step" in log
    if case.startswith("cnn:3"):
        assert "(steps_per_execution=3: in its loop)" in log
    if xla:
        assert ("[LMS][0] The model's train function would be compiled "
                "with XLA (model.jit_compile is True") in log
        assert ("LMS turns XLA off for the train function of this fit "
                "(model.jit_compile = False; it is True again after the "
                "fit)") in log
    else:
        assert "compiled with XLA" not in log


@pytest.mark.numerics
@_OFF
def test_fit_auto_tuned(tmp_path):
    r, _ = _run("autotune", tmp_path)
    assert r["roomy_outcome"] == "not needed"
    assert r["roomy_losses"] == r["base_losses"]
    assert r["tight_outcome"] == "rewritten" and r["autotuned"]
    assert r["swapouts"] > 0 and r["fits"]
    # Within rounding: the tuned plan swaps a batch-norm tensor whose
    # swap-in changes how Grappler's arithmetic optimizer groups the
    # additions around it (the last bit of the second loss differed).
    _check_same_training(r, "tight_losses", exact=False)
    kind, message, own_step = r["unknown_batch"]
    assert kind == "BatchSizeError"
    assert "without the mini-batch size: set lms.batch_size" in message
    assert own_step  # the model has its own step back
    assert r["batch_size_set"] == "rewritten"


@pytest.mark.numerics
def test_attention_fit_auto_tuned_with_whole_batches(tmp_path):
    """Keras' MultiHeadAttention, LMS() auto-tuned, whole batches and no
    batch size: the step's broadcast reduction axes (shape (?)) are shape
    vectors, not batch-sized tensors, so planning needs no batch size
    (it raised BatchSizeError naming
    .../attention_output_1/MatMul/BroadcastGradientArgs:0). The same
    training bit for bit, oneDNN off and on, and every swap op ran."""
    r, _ = _run("mha_autotune", tmp_path)
    assert r["roomy_outcome"] == "not needed"
    assert r["outcome"] == "rewritten" and r["autotuned"] and r["fits"]
    assert r["swapouts"] > 0 and r["swapins"] >= r["swapouts"]
    assert r["losses"] == r["base_losses"]
    assert r["weights_equal"]
    assert r["missing"] == [] and r["off_cpu"] == []


@pytest.mark.numerics
@_OFF
def test_a_second_fit_at_another_batch_size_trains_the_same(tmp_path):
    """fit at batch 3, then at batch 5, with the same callback: Keras'
    train function is traced again at the second fit with the batch
    dimension unknown, and so is LMS's step (it was traced at batch 5, and
    the weights differed from Keras' by 3e-8). Both fits rewritten, every
    swap op of each ran, and the losses and weights are those of the same
    two fits without LMS, bit for bit."""
    r, _ = _run("refit", tmp_path)
    assert r["outcomes"] == ["rewritten", "rewritten"] and r["two_plans"]
    assert all(n > 0 for n in r["swapouts"])
    assert r["losses"] == r["base_losses"]
    assert r["weights_equal"]
    assert r["traced_batches"] == [None, 3]
    assert r["missing"] == [] and r["off_cpu"] == []


def test_unsupported_fits_raise_and_change_nothing(tmp_path):
    r, _ = _run("errors", tmp_path)
    kind, message = r["run_eagerly"]
    assert kind == "EagerModeError"
    assert message.startswith(
        "The model is compiled with run_eagerly=True: Keras 3 then runs "
        "model.train_step eagerly")
    assert r["run_eagerly_unchanged"]
    kind, message = r["strategy"]
    assert kind == "UnsupportedFunctionError"
    assert message.startswith(
        "The model trains under CentralStorageStrategy: LMS plans Keras 3 "
        "fit under MirroredStrategy, MultiWorkerMirroredStrategy and "
        "OneDeviceStrategy")
    assert r["strategy_unchanged"]
    # A subclass's own train_step runs (traced by LMS) and is rewritten.
    outcome, calls, own_step = r["custom"]
    assert outcome == "rewritten" and calls > 0 and own_step


def test_other_backends_get_a_clear_error(monkeypatch):
    """Keras 3 on JAX or PyTorch: LMS rewrites TensorFlow graphs."""
    from tflms import LMS, UnsupportedStackError
    from tflms.tf.adapters import keras3
    monkeypatch.setattr(keras3, "backend_name", lambda: "jax")
    with pytest.raises(UnsupportedStackError) as info:
        keras3.check_backend()
    assert str(info.value).startswith(
        "LMS was given a Keras 3 model of the 'jax' backend. LMS rewrites "
        "TensorFlow graphs, so it needs the TensorFlow backend: set the "
        "environment variable KERAS_BACKEND=tensorflow")
    del LMS


if __name__ == "__main__":
    _main(*sys.argv[1:])
