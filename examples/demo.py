"""What Large Model Support is for, in about a minute.

This demo trains one model twice from the same seed:

1. with LMS, on a device memory budget the model does not fit in. LMS's
   simulator predicts one training step's device memory, the auto-tuner
   picks which tensors to swap to host memory so the step fits the budget,
   the graph is rewritten, and the memory plots are written;
2. without LMS, as the reference.

Then it compares the losses of every step. LMS only moves tensors between
device and host memory (its swap ops are identities), so the numbers must
be the same: the verdict line says whether they are.

On TensorFlow 2.16+ without ``TF_USE_LEGACY_KERAS=1`` the model is Keras 3,
trained in eager mode: the LMS callback rewrites the model's training step
(``tf.function``) for the fit, and the swap ops that ran are read from the
per-device graphs TensorFlow writes with ``TF_DUMP_GRAPH_PREFIX``. Elsewhere
it is Keras 2 in graph mode (``tf.keras`` on 2.15, tf-keras on 2.16+).

The budget (``--autotune-gpu-mem``, in GiB) stands in for a small GPU, so
the demo shows the whole story on any machine, GPU or not. The model is not
pinned to a device: with a GPU, TensorFlow trains it there and LMS's swap ops
copy tensors between GPU and host memory; without one, everything runs on the
CPU and the swaps are host-to-host copies (correct, just not useful).

Run from the repository root::

    python examples/demo.py            # about a minute on 2 CPU cores
    python examples/demo.py --help     # sizes, budget, plot folder
"""

import argparse
import os
import sys
import tempfile
import time

# Quiet TensorFlow's C++ start-up banner; warnings and errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tflms import LMS  # noqa: E402
from tflms.tf import swaps_ran  # noqa: E402
from tflms import plots  # noqa: E402
from tflms._argparse_types import positive_float, positive_int  # noqa: E402

import _lms_flags  # noqa: E402  (examples/_lms_flags.py)

_GIB = float(1 << 30)
_MIB = float(1 << 20)
CLASSES = 4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Train a ResNet-style CNN with and without Large Model "
                    "Support on a device memory budget it does not fit in, "
                    "and compare the losses.")
    parser.add_argument("--image-size", type=positive_int, default=96,
                        help="height and width of the images (default 96)")
    parser.add_argument("--batch-size", type=positive_int, default=8,
                        help="mini-batch size (default 8)")
    parser.add_argument("--steps", type=positive_int, default=6,
                        help="training steps per run (default 6)")
    parser.add_argument("--autotune-gpu-mem", type=positive_float, default=0.1,
                        help="device memory budget in GiB that LMS plans "
                             "for (lms.autotune_gpu_mem; default 0.1, well "
                             "below the ~0.16 GiB one step needs at the "
                             "default sizes)")
    parser.add_argument("--plot-dir", default=".lms",
                        help="folder for the memory plots (lms.plot_dir; "
                             "default .lms)")
    parser.add_argument("--seed", type=int, default=7,
                        help="seed of the weights and data (default 7)")
    return parser.parse_args(argv)


def make_data(args):
    """Images whose class is a colour tint under noise: learnable at once."""
    rng = np.random.RandomState(args.seed)
    n = args.batch_size * args.steps
    labels = rng.randint(0, CLASSES, n)
    tints = rng.uniform(-1.0, 1.0, (CLASSES, 1, 1, 3)).astype(np.float32)
    shape = (n, args.image_size, args.image_size, 3)
    images = rng.normal(0.0, 1.0, shape).astype(np.float32) + tints[labels]
    return images, np.eye(CLASSES, dtype=np.float32)[labels]


def keras3():
    """Keras 3 when TensorFlow's default Keras is Keras 3 (TensorFlow 2.16+
    without TF_USE_LEGACY_KERAS=1), else None (the graph-mode Keras 2
    path)."""
    from tflms.tf import compat
    if compat.TF_VERSION < (2, 16, 0) or os.environ.get(
            "TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes"):
        return None
    try:
        import keras
    except ImportError:
        return None
    return keras if int(keras.__version__.split(".")[0]) >= 3 else None


def build_model(args, run_metadata=None, keras=None):
    """A small ResNet: a stem, four residual stages, global pooling.

    Every initializer has an explicit seed, so two builds start from the
    same weights. With `run_metadata`, every step is traced into it.
    `keras`: Keras 3 (eager mode), else the graph-mode Keras 2.
    """
    eager = keras is not None
    keras = keras or _lms_flags.keras2()
    layers = keras.layers
    seeds = iter(range(args.seed * 1000, args.seed * 1000 + 1000))

    def conv(x, filters, stride=1, kernel=3):
        return layers.Conv2D(
            filters, kernel, strides=stride, padding="same", use_bias=False,
            kernel_initializer=keras.initializers.HeNormal(
                seed=next(seeds)))(x)

    def block(x, filters, stride):
        shortcut = x
        y = layers.ReLU()(layers.BatchNormalization()(conv(x, filters,
                                                            stride)))
        y = layers.BatchNormalization()(conv(y, filters))
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = layers.BatchNormalization()(
                conv(shortcut, filters, stride, kernel=1))
        return layers.ReLU()(layers.Add()([y, shortcut]))

    inputs = keras.Input((args.image_size, args.image_size, 3))
    x = layers.ReLU()(layers.BatchNormalization()(conv(inputs, 32)))
    for filters, stride in ((32, 1), (64, 2), (96, 2), (128, 2)):
        x = block(x, filters, stride)
        x = block(x, filters, 1)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(
        CLASSES, activation="softmax",
        kernel_initializer=keras.initializers.GlorotUniform(
            seed=next(seeds)))(x)
    model = keras.Model(inputs, outputs, name="resnet_demo")
    if eager:
        model.compile(optimizer=keras.optimizers.SGD(
            learning_rate=0.01, momentum=0.9),
                      loss="categorical_crossentropy")
        return model
    trace = {}
    if run_metadata is not None:
        trace = dict(options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                     run_metadata=run_metadata)
    model.compile(optimizer=keras.optimizers.legacy.SGD(
        learning_rate=0.01, momentum=0.9),
                  loss="categorical_crossentropy", **trace)
    return model


def train(args, images, labels, lms=None, run_metadata=None, keras=None):
    """Fresh graph (Keras 2) or model (Keras 3), same seed, one epoch of
    `args.steps` steps; returns the per-step losses and the seconds spent
    in fit()."""
    if keras is not None:
        keras.utils.set_random_seed(args.seed)
        model = build_model(args, keras=keras)
        recorder = _lms_flags.batch_loss_recorder(tf, keras)
    else:
        _lms_flags.keras2().backend.clear_session()
        tf.compat.v1.set_random_seed(args.seed)
        model = build_model(args, run_metadata)
        recorder = _lms_flags.batch_loss_recorder(tf)
    callbacks = [recorder] if lms is None else [lms, recorder]
    start = time.perf_counter()
    model.fit(images, labels, batch_size=args.batch_size, epochs=1,
              shuffle=False, verbose=0, callbacks=callbacks)
    return recorder.losses, time.perf_counter() - start


def describe_device():
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return ("%d GPU(s) found: the model trains on %s, and LMS swaps "
                "between its memory and the host's" % (len(gpus),
                                                     gpus[0].name))
    return ("no GPU found: the model trains on the CPU (the swaps are "
            "host-to-host copies; the budget stands in for a GPU)")


def executed_swaps(lms, run_metadata):
    """(swap ops that ran, swap ops LMS added). Keras 2: those in the last
    traced step (`run_metadata`). Keras 3 (`run_metadata` is the folder of
    TF_DUMP_GRAPH_PREFIX): those in the last per-device partition graphs
    of Keras' train function, which its executors ran (TensorFlow 2.21
    returns no step stats for eager function calls)."""
    result = lms.last_run
    if result is None:
        return 0, 0
    added = set(result.swapout_ops) | set(result.swapin_ops)
    if isinstance(run_metadata, str):
        ran = set(swaps_ran.swap_ops_in_partition_graphs(
            swaps_ran.partition_graph_files(run_metadata), added))
    else:
        ran = {node.node_name for dev in run_metadata.step_stats.dev_stats
               for node in dev.node_stats}
    return len(added & ran), len(added)


def print_plan(lms, run_metadata):
    """The simulator's numbers behind the plan LMS applied."""
    # The callback's latest `RunResult`: its plan and the auto-tuning.
    run = lms.last_run
    tune = run.planned.tune if run.planned is not None else None
    plan = run.plan
    print()
    print("=== What LMS planned (one training step) ===")
    if tune is not None:
        without = tune.without_lms
        print("Device memory budget:        %7.1f MiB" % (
            tune.budget_bytes / _MIB))
        print("Expected peak without LMS:   %7.1f MiB  (%s)" % (
            without.peak_device_bytes / _MIB,
            "does NOT fit" if not without.fits(tune.budget_bytes)
            else "fits"))
        if tune.with_lms is not None:
            print("Expected peak with LMS:      %7.1f MiB  (%s)" % (
                tune.with_lms.peak_device_bytes / _MIB,
                "fits" if tune.with_lms.fits(tune.budget_bytes)
                else "does NOT fit"))
        if tune.params is not None:
            p = tune.params
            print("Tuned parameters:            swapout_threshold=%d, "
                  "swapin_ahead=%d, swapin_groupby=%d, sync_mode=%d%s"
                  % (p.swapout_threshold, p.swapin_ahead, p.swapin_groupby,
                     p.sync_mode, "" if tune.only_tensors is None else
                     " (swapping only tensors chosen by the simulator)"))
    if plan is not None:
        print("Tensors swapped to the host: %7d  (%.1f MiB out and %.1f MiB "
              "back in per step)" % (len(plan.swaps),
                                     plan.swapout_bytes() / _MIB,
                                     plan.swapin_bytes() / _MIB))
        if plan.recomputes:
            # Auto-tuning recomputes where that makes the step shorter.
            print("Recomputed instead of swapped: %5d  (%d cloned "
                  "operations)" % (len(plan.recomputes),
                                   len(lms.last_run.rewrite.recompute_ops)))
        ran, added = executed_swaps(lms, run_metadata)
        print("Swap ops that ran:           %7d of the %d LMS added (%s)"
              % (ran, added, "in the graphs TensorFlow ran"
                 if isinstance(run_metadata, str) else "traced last step"))
    pngs = plots.pictures_in(lms.plot_dir) if tune is not None else []
    if pngs:
        print("Memory plots (expected device memory over one step):")
        for path in pngs:
            print("  " + os.path.abspath(path))


def compare(with_lms, without_lms):
    """Print both loss series and return (verdict line, passed)."""
    print()
    print("=== Losses, same seed ===")
    print("step   with LMS      without LMS")
    for i, (a, b) in enumerate(zip(with_lms, without_lms)):
        print("%4d   %.8f   %.8f%s" % (i + 1, a, b, "" if a == b else "  *"))
    if len(with_lms) != len(without_lms) or not with_lms:
        return ("VERDICT: FAIL - the runs made %d and %d steps"
                % (len(with_lms), len(without_lms))), False
    a = np.asarray(with_lms, dtype=np.float64)
    b = np.asarray(without_lms, dtype=np.float64)
    diff = float(np.max(np.abs(a - b)))
    if diff == 0.0:
        same = ("training with LMS gave exactly the same loss at every step "
                "as training without it")
    elif diff <= 1e-6 * max(1.0, float(np.max(np.abs(b)))):
        same = ("losses with and without LMS agree to %.1e (float rounding)"
                % diff)
    else:
        return ("VERDICT: FAIL - losses with and without LMS differ by up to "
                "%.3g" % diff), False
    if not b[-1] < b[0]:
        return ("VERDICT: FAIL - %s, but the loss did not fall (%.4f -> "
                "%.4f), so the demo did not show training"
                % (same, b[0], b[-1])), False
    return ("VERDICT: PASS - %s; the loss fell from %.4f to %.4f"
            % (same, b[0], b[-1])), True


def main(argv=None):
    args = parse_args(argv)
    keras = keras3()
    if keras is None:
        tf.compat.v1.disable_eager_execution()  # Keras 2: LMS rewrites graphs
    else:
        # Keras 3 trains in eager mode; TensorFlow writes the graphs of
        # Keras' train function here, to show which swap ops ran.
        os.environ["TF_DUMP_GRAPH_PREFIX"] = tempfile.mkdtemp(
            prefix="tflms_demo_graphs_")
        os.environ["TF_DUMP_GRAPH_NAME_FILTER"] = "multi_step_on_iterator"
    # Deterministic kernels, so that any difference would come from LMS
    # (on a CPU they are deterministic anyway; on a GPU cuDNN may not be).
    tf.config.experimental.enable_op_determinism()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)

    print("LMS demo: a ResNet-style CNN, %dx%d images, batch %d, %d steps; "
          "device budget %.2f GiB" % (args.image_size, args.image_size,
                                      args.batch_size, args.steps,
                                      args.autotune_gpu_mem))
    print("Keras: " + ("Keras %s in eager mode: the LMS callback rewrites "
                       "the model's tf.function training step"
                       % keras.__version__ if keras is not None else
                       "Keras 2 in graph mode: the LMS callback rewrites "
                       "the training graph"))
    print("Device: " + describe_device())
    images, labels = make_data(args)

    print()
    print("=== 1. Training WITH LMS (auto-tuned for %.2f GiB) ===" %
          args.autotune_gpu_mem)
    sys.stdout.flush()
    lms = LMS()  # every swap parameter on auto
    lms.autotune_gpu_mem = args.autotune_gpu_mem
    lms.autotune_plot = True
    lms.plot_dir = args.plot_dir
    # fit() tells the callback its batch size; with a generator, set
    # lms.batch_size yourself.
    run_metadata = (tf.compat.v1.RunMetadata() if keras is None
                    else os.environ["TF_DUMP_GRAPH_PREFIX"])
    lms_losses, lms_seconds = train(args, images, labels, lms, run_metadata,
                                    keras=keras)
    sys.stderr.flush()
    print_plan(lms, run_metadata)
    if lms.last_run.plan is None:
        print("LMS was not needed: the model fits the budget. Lower "
              "--autotune-gpu-mem or raise --image-size to see it swap.")

    print()
    print("=== 2. Training WITHOUT LMS (the reference) ===")
    sys.stdout.flush()
    plain_losses, plain_seconds = train(args, images, labels, keras=keras)
    print("fit() took %.1f s with LMS (including LMS's planning and the "
          "tracing of every step) and %.1f s without." % (lms_seconds,
                                                          plain_seconds))

    verdict, ok = compare(lms_losses, plain_losses)
    if lms.last_run.plan is None:
        verdict, ok = ("VERDICT: NOT SHOWN - the model fits %.2f GiB without "
                       "LMS, so LMS swapped nothing; lower --autotune-gpu-mem"
                       % args.autotune_gpu_mem), False
    print()
    print(verdict)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
