"""Time LMS auto-tuning and rewriting on Keras ResNet50 training graphs.

Prints a markdown table: graph, ops, index time, tune time, rewrite time,
total (LMS only; building the Keras model is not timed), and the bytes moved
to the host by the chosen tensors versus the threshold search alone.

Usage::

    python benchmarks/bench_autotune.py [--sizes 1024 512] [--gpu-mem 1]
"""

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_GIB = float(1 << 30)


def _one(size, batch, gpu_mem):
    """Build one graph in this process and time LMS on it; returns a row."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    from tflms import analysis, autotune, planner, rewriter  # pylint: disable=import-outside-toplevel
    from tflms import graph_index as gi  # pylint: disable=import-outside-toplevel
    from tflms._logging import Logger  # pylint: disable=import-outside-toplevel

    model = tf.keras.applications.ResNet50(
        weights=None, input_shape=(size, size, 3), classes=10)
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    model._make_train_function()  # pylint: disable=protected-access
    graph = tf.compat.v1.get_default_graph()

    t0 = time.perf_counter()
    index = gi.build_index(graph)
    roles = analysis.classify_ops(index)
    t1 = time.perf_counter()
    outcome = autotune.tune(index, roles, planner.SwapParams(-1, -1, -1, 0),
                            batch_size=batch, gpu_mem_gib=gpu_mem,
                            log=Logger())
    t2 = time.perf_counter()
    if outcome.params is not None:
        plan = planner.make_plan(index, roles, outcome.params,
                                 batch_size=batch,
                                 only_tensors=outcome.only_tensors)
        rewriter.apply_plan(graph, index, plan, "/cpu:0")
    t3 = time.perf_counter()

    # One replay, timed on its own.
    from tflms import simulator  # pylint: disable=import-outside-toplevel
    sim = simulator.SimulationModel(index, roles, batch)
    start = time.perf_counter()
    for _ in range(10):
        sim.replay(None)
    replay_ms = (time.perf_counter() - start) * 100

    chosen = outcome.with_lms.swapout_bytes if outcome.with_lms else 0
    alone = (outcome.threshold_only.swapout_bytes
             if outcome.threshold_only else chosen)
    return ("| ResNet50 %dx%d b%d, %.1f GiB | %d | %.0f ms | %.0f ms | %.0f ms "
            "| %.0f ms | %.2f ms | %d | %.3f GiB | %.3f GiB |" % (
                size, size, batch, gpu_mem, index.num_ops, (t1 - t0) * 1e3,
                (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3, replay_ms,
                outcome.simulations, chosen / _GIB, alone / _GIB))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 768])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--gpu-mem", type=float, nargs="+", default=[1.0])
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(_one(int(args.one[0]), int(args.one[1]), float(args.one[2])))
        return
    print("| graph | ops | index | tune | rewrite | total | replay "
          "| simulations | swapped (selection) | swapped (threshold only) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        for mem in args.gpu_mem:
            # A fresh process per graph: Keras graphs share the default graph.
            out = subprocess.run(
                [sys.executable, __file__, "--one", str(size),
                 str(args.batch), str(mem)],
                capture_output=True, text=True, check=False)
            rows = [l for l in out.stdout.splitlines() if l.startswith("| ")]
            print(rows[-1] if rows else "| ResNet50 %d, %.1f GiB | failed: %s |"
                  % (size, mem, out.stderr.strip().splitlines()[-1:]))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
