"""Keras 3 ``fit`` of a Keras application with and without LMS at a tight
budget: the losses step by step, how many weights differ, whether every
swap op ran, and which AddNs Grappler's memory optimizer turned into
accumulations in each run (TensorFlow 2.16+ with Keras 3, on the CPU).

    env -u TF_USE_LEGACY_KERAS TF_ENABLE_ONEDNN_OPTS=0 \\
        python benchmarks/keras3_bitwise.py Xception 224 [--ratio 0.6] \\
        [--of peak|activations] \\
        [--steps 3] [--budget GIB] [--no-memory-scheduling] \\
        [--grappler-check] [--grappler-repair]

The application is built with ``weights=None``, 10 classes and seed 1,
compiled with ``SGD(0.01, momentum=0.9)`` and sparse cross-entropy, and fit
``--steps`` epochs of one batch of 2 random images (``shuffle=False``, one
inter-op thread, so the fit without LMS repeats itself exactly), once
without LMS and once with ``LMS()`` auto-tuned to ``--ratio`` of the peak
its simulator predicts without LMS (``--of activations``: of that peak's
part above the variables, slots and constants that stay on the device),
found by a first fit with a roomy budget (``--budget`` skips it);
``lms.batch_size = 2``. The graphs TensorFlow ran are dumped
(TF_DUMP_GRAPH_PREFIX) into a temporary folder: the swap ops are looked
up there, and so are the AddNs Grappler's memory optimizer rewrote (each
becomes a ``DestroyTemporaryVariable`` of a ``TemporaryVariable`` the
AddN's inputs are added to one by one, in the order they are ready:
docs/tf2.md, "Grappler's memory optimizer").

``--grappler-check`` turns LMS's ``grappler_check`` setting on and lists
the AddNs `tflms.tf.grappler_check` finds accumulated in the step with and
without LMS, next to those the runs accumulated.

``--grappler-repair`` turns LMS's ``grappler_repair`` setting on: the
plan is tried on a copy of the step and the swaps next to what Grappler
optimizes otherwise are dropped before the fit (docs/tf2.md).

``--no-memory-scheduling`` runs both fits with that optimizer off
(``RewriterConfig.memory_optimization = NO_MEM_OPT`` in the eager context's
function call options, a private API: the public
``tf.config.optimizer.set_experimental_options`` has no switch for it).
An application takes 5 to 20 minutes on two shared CPU cores.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT]

_FILTER = "multi_step_on_iterator"


def accumulated_addns(dump_dir):
    """Names of the AddNs Grappler's memory optimizer rewrote into
    accumulations in the partition graphs dumped into `dump_dir`, without
    the prefixes inlining gave them."""
    from tflms.tf import swaps_ran
    names = set()
    for path in swaps_ran.partition_graph_files(dump_dir):
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line.startswith('name: "') and line.endswith('/tmp_var"'):
                    name = line[len('name: "'):-len('/tmp_var"')]
                    names.add(name.rpartition("StatefulPartitionedCall/")[2])
    return sorted(names)


def _fit(keras, args, lms=None):
    import numpy as np
    keras.backend.clear_session()  # the same layer (and op) names each time
    keras.utils.set_random_seed(1)
    shape = (args.size, args.size, 3)
    model = getattr(keras.applications, args.app)(
        weights=None, input_shape=shape, classes=10)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    rng = np.random.RandomState(0)
    x = rng.rand(2, *shape).astype("float32")
    y = rng.randint(0, 10, 2).astype("int32")
    history = model.fit(x, y, batch_size=2, epochs=args.steps,
                        shuffle=False, verbose=0,
                        callbacks=[lms] if lms else [])
    return history.history["loss"], model.weights


def no_memory_scheduling():
    """Turns Grappler's memory optimizer off for the functions this thread
    calls from now on (their call options' ConfigProto)."""
    from tensorflow.core.protobuf import rewriter_config_pb2
    from tensorflow.python.eager import context
    ctx = context.context()
    config = ctx.config
    config.allow_soft_placement = True  # as the default call options
    config.graph_options.rewrite_options.memory_optimization = (
        rewriter_config_pb2.RewriterConfig.NO_MEM_OPT)
    ctx.function_call_options = context.FunctionCallOptions(
        config_proto=config)


def _dumped(folder, run):
    """Sets TensorFlow's dump folder to a new `folder`/`run`."""
    path = os.path.join(folder, run)
    os.makedirs(path)
    os.environ["TF_DUMP_GRAPH_PREFIX"] = path
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("app", help="a keras.applications name")
    parser.add_argument("size", type=int, help="image height and width")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ratio", type=float, default=0.6,
                        help="budget as a share of the predicted peak")
    parser.add_argument("--of", choices=("peak", "activations"),
                        default="peak",
                        help="what --ratio is a share of: the predicted "
                        "peak (default), or its part above the resident "
                        "variables, slots and constants")
    parser.add_argument("--budget", type=float, default=None,
                        help="autotune_gpu_mem, GiB (skips the roomy fit)")
    parser.add_argument("--grappler-check", action="store_true",
                        help="also list the AddNs tflms.tf.grappler_check "
                        "finds accumulated with and without LMS")
    parser.add_argument("--grappler-repair", action="store_true",
                        help="drop the swaps Grappler optimizes the step "
                        "otherwise with (grappler_repair)")
    parser.add_argument("--no-memory-scheduling", action="store_true",
                        help="both fits with Grappler's memory optimizer "
                        "off")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="keras3_bitwise_")
    try:
        return _compare(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _compare(args, folder):
    os.environ["TF_DUMP_GRAPH_NAME_FILTER"] = _FILTER
    _dumped(folder, "roomy")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    import keras
    from tflms import LMS, autotune
    from tflms.tf import swaps_ran
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if args.no_memory_scheduling:
        no_memory_scheduling()
    start = time.perf_counter()
    budget = args.budget
    if budget is None:
        roomy = LMS()
        roomy.autotune_gpu_mem = 64.0
        roomy.batch_size = 2
        _fit(keras, argparse.Namespace(**dict(vars(args), steps=1)), roomy)
        without = roomy.last_run.planned.without_lms
        peak = without.peak_device_bytes
        # --of activations: the ratio of what a plan can move, above what
        # stays on the device (variables, slots, constants), so that a
        # small input whose weights are most of its peak still leaves a
        # budget some plan meets.
        floor = (without.resident_device_bytes if args.of == "activations"
                 else 0)
        target = floor + args.ratio * (peak - floor)
        budget = target / autotune.mem_ratio() / (1 << 30)
        print("predicted peak without LMS %.1f MiB (%.1f MiB resident), "
              "budget %.3f GiB" % (peak / float(1 << 20),
                                   floor / float(1 << 20), budget))
    base_dir = _dumped(folder, "without")
    base_losses, base_weights = _fit(keras, args)
    base_weights = [v.numpy() for v in base_weights]
    lms_dir = _dumped(folder, "with")
    lms = LMS()
    lms.autotune_gpu_mem = budget
    lms.batch_size = 2
    lms.grappler_check = args.grappler_check
    lms.grappler_repair = args.grappler_repair
    losses, weights = _fit(keras, args, lms)
    result = lms.last_run
    swap_ops = list(result.swapout_ops) + list(result.swapin_ops)
    ran = swaps_ran.swap_ops_in_partition_graphs(
        swaps_ran.partition_graph_files(lms_dir), swap_ops)
    different = [(v.path, float(np.max(np.abs(a - v.numpy()))))
                 for a, v in zip(base_weights, weights)
                 if not np.array_equal(a, v.numpy())]
    print("%s %d, %d steps%s: %d tensors swapped, %d recomputes, "
          "%d of %d swap ops ran (%.0f s)" % (
              args.app, args.size, args.steps,
              ", memory optimizer off" if args.no_memory_scheduling else "",
              len(result.swapout_ops), len(result.rewrite.recompute_ops),
              len([n for n in swap_ops if n in ran]), len(swap_ops),
              time.perf_counter() - start))
    print("| run | losses | AddNs accumulated by the memory optimizer |")
    print("| --- | --- | --- |")
    for run, run_losses, run_dir in (("without LMS", base_losses, base_dir),
                                     ("with LMS", losses, lms_dir)):
        print("| %s | %s | %s |" % (
            run, ", ".join("%.7g" % l for l in run_losses),
            ", ".join(accumulated_addns(run_dir)) or "none"))
    if result.grappler is not None:
        for run, names in zip(("without LMS", "with LMS"),
                              result.grappler.accumulated):
            print("| %s, by grappler_check | | %s |" % (
                run, ", ".join(names) or "none"))
    print("weights different: %d of %d%s" % (
        len(different), len(weights), "".join(
            "\n  %s: %.3g" % d for d in sorted(
                different, key=lambda d: -d[1])[:5])))
    return 0 if not different and losses == base_losses else 1


if __name__ == "__main__":
    sys.exit(main())
