"""One size of Keras 3 ResNet50's ``fit`` step: does tflms find a plan, what
the oracle's runtime replay says of it, and which buffers are live at the
peak (TensorFlow 2.16+ with Keras 3).

    env -u TF_USE_LEGACY_KERAS python benchmarks/keras3_peak.py 7712 \
        [--gpu-mem 16] [--interconnect pcie4] [--top 10] [--no-oracle]

The step is `benchmarks.models.keras3_app` (``train_step`` traced as a
`tf.function`, batch 1), planned as ``lms.function`` plans it
(`rewrite.rewrite_function_graph`) with auto-tuning to ``--gpu-mem`` GiB
(the planning budget is `TF_LMS_SIMULATOR_MEM_RATIO` of it, 0.9 by
default), and judged, as in the capacity benchmark (`benchmarks.capacity`),
by the oracle's runtime peak of the rewritten graph against the whole
``--gpu-mem``. Without a plan it prints the tuner's error, which names the
smallest plan found. One size takes about a minute on two CPU cores; the
planning and the replay cost the same at every image size (the graph does
not grow), so the largest size is found by trying a few (docs/benchmarks.md,
"Keras 3's `fit` step: the batch-norm gradient ordered").
"""

import argparse
import os
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import common  # noqa: E402

_MIB = float(1 << 20)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("size", type=int, help="image height and width")
    parser.add_argument("--gpu-mem", type=float, default=16.0,
                        help="GPU memory, GiB (autotune_gpu_mem)")
    parser.add_argument("--interconnect", default=None,
                        help="LMS interconnect (default: LMS's, PCIe 4.0)")
    parser.add_argument("--top", type=int, default=10,
                        help="buffers live at the peak to list")
    parser.add_argument("--no-oracle", action="store_true",
                        help="plan only; skip the oracle's replay")
    args = parser.parse_args(argv)
    common.setup_tensorflow("eager")
    from benchmarks import measure, models
    from tflms import LMS, autotune, pipeline, steptime
    from tflms.tf import oracle
    from tflms.tf.adapters import graph_step, rewrite
    start = time.perf_counter()
    built = models.build("keras3_app", app="ResNet50", image=args.size,
                         batch=1)
    lms = LMS()
    lms.autotune_gpu_mem = args.gpu_mem
    lms.autotune_host_mem = common.SERVER_HOST_MEM_GIB
    lms.batch_size = 1
    if args.interconnect:
        lms.interconnect = args.interconnect
    try:
        # Planned for a GPU, where oneDNN's CPU passes merge nothing.
        result = rewrite.rewrite_function_graph(
            built.graph, lms.settings,
            target=graph_step.step_target(lms.settings, here=False))
    except autotune.AutotuneError as err:
        print("%d: no plan: %s" % (args.size, err))
        return 1
    planned = pipeline.simulate_plan(result.planned)
    p = planned.params
    sim = planned.with_lms
    print("%d: plan (%d, %d, %d, %d), %d swapped, simulator %.2f GiB "
          "(%.1f MiB) at %s (planned in %.0f s)" % (
              args.size, p.swapout_threshold, p.swapin_ahead,
              p.swapin_groupby, p.sync_mode, len(result.swapout_ops),
              sim.peak_device_bytes / common.GIB,
              sim.peak_device_bytes / _MIB, sim.peak_op,
              time.perf_counter() - start))
    step = planned.step_time or steptime.predict_planned(
        planned, gpu=lms.gpu, interconnect=lms.interconnect)
    print("  predicted step %.2f ms, %.2f ms without LMS (%s, %s)" % (
        step.with_lms_s * 1e3, step.without_lms_s * 1e3, step.gpu,
        step.interconnect))
    for name, nbytes in sorted(sim.live_at_peak, key=lambda x: -x[1])[
            :args.top]:
        print("  simulator %10.1f MiB  %s" % (nbytes / _MIB, name))
    if args.no_oracle:
        return 0
    fetch = built.train_op.name
    graph_def, _ = measure.forward_identities(
        oracle.place_on_gpu(built.graph), keep={fetch})
    judged = oracle.peak_memory(graph_def, fetch, place=False)
    peak = judged.runtime_gpu_peak_bytes
    fits = peak <= args.gpu_mem * common.GIB
    print("%d: oracle runtime peak %.2f GiB (%.1f MiB) of %.2f: %s" % (
        args.size, peak / common.GIB, peak / _MIB, args.gpu_mem,
        "fits" if fits else "does not fit"))
    live = [t for t in judged.runtime_live_at_peak if not t.variable]
    resident = sum(t.nbytes for t in judged.runtime_live_at_peak
                   if t.variable)
    print("  oracle     %10.1f MiB  resident variables" % (resident / _MIB))
    for t in live[:args.top]:
        print("  oracle     %10.1f MiB  %s%s" % (
            t.nbytes / _MIB, t.name, " (copied in)" if t.transferred
            else ""))
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
