"""A KerasHub transformer's ``fit`` step against its floor: how close the
smallest plan comes to the device memory no plan goes below (issue 47;
TensorFlow 2.16+ with Keras 3 and KerasHub).

    env -u TF_USE_LEGACY_KERAS python benchmarks/transformer_plans.py \
        1024 2048 [--family gpt2|llama|gemma|bert] [--batch 8] \
        [--gpu-mem 16] [--layers 12 --hidden 768 --heads 12 \
        --intermediate N] [--top 12] [--refine 0] [--no-oracle]

The step is ``--family``'s KerasHub model (GPT-2 by default) built from a
config with random weights by `keras_hub_models` (GPT-2 small's published
config: ``GPT2Backbone`` of the given size, ``GPT2CausalLM(backbone,
preprocessor=None)``; Llama, Gemma and BERT's masked LM at the same depth
and width, each with its own vocabulary, intermediate width and key-value
heads: `keras_hub_models.FAMILIES`), AdamW, sparse cross-entropy from
logits, ``model.train_step`` traced by ``tf.function`` for one batch of
``--batch`` sequences, planned as ``lms.function`` plans it for a GPU
(`rewrite.rewrite_function_graph` on
``graph_step.step_target(settings, here=False)``).

For each sequence length it prints the step's floor (`tflms.floor`), then
plans twice: for ``--gpu-mem`` GiB (does the step train on that GPU?), and
for the smallest budget the search can meet: a first search at the floor
(which fails unless the floor itself is met) names its smallest plan, and a
second one, at that plan's peak, makes it (the planning budget is
``TF_LMS_SIMULATOR_MEM_RATIO`` of a budget, 0.9 by default, so budgets are
given as peak / ratio); the search is not monotone in the budget (a plan
checked with its copies timed can miss a budget a smaller plan meets), so
``--refine N`` bisects up to N budgets more between the last that found no
plan and the first that did, and keeps the lowest plan. Each plan's peak
is counted by the simulator (copies instant) and, unless ``--no-oracle``,
by the oracle's runtime replay of the rewritten graph. The table:
sequence, floor, the smallest plan (simulator, oracle), its ratio to the
floor, the ``--gpu-mem`` plan (or why none), predicted step times and
planning seconds; ``--top`` lists the buffers the simulator holds at the
smallest plan's peak.

Nothing runs the model (shapes are static); the oracle's replay of GPT-2
small at sequence 2048 takes about a minute and a few GiB of host memory.
"""

import argparse
import os
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import common  # noqa: E402
from benchmarks import keras_hub_models  # noqa: E402

_MIB = float(1 << 20)
# GPT-2 small (the published config); the other families at its depth and
# width, each with its own vocabulary and intermediate width unless given
# (`keras_hub_models.FAMILIES`).
GPT2_SMALL = dict(layers=12, heads=12, hidden=768, intermediate=3072)
VOCAB = keras_hub_models.FAMILIES["gpt2"]["vocab"]


def gpt2_step(seq, batch=8, layers=12, heads=12, hidden=768,
              intermediate=3072, vocab=VOCAB, seed=0):
    """``(concrete function, model)`` of KerasHub GPT-2's ``train_step``
    traced for `batch` sequences of `seq` tokens (eager mode, Keras 3)."""
    return keras_hub_models.step("gpt2", seq, batch, keras_hub_models
                                 .config_of("gpt2", layers, heads, hidden,
                                            intermediate, vocab), seed)


def family_step(seq, args):
    """``(concrete function, model)`` of ``--family``'s ``train_step`` at
    the size `args` give, traced for ``--batch`` sequences of `seq`."""
    config = keras_hub_models.config_of(
        args.family, args.layers, args.heads, args.hidden,
        args.intermediate)
    return keras_hub_models.step(args.family, seq, args.batch, config)


def _lms(gpu_mem, batch, interconnect):
    from tflms import LMS
    lms = LMS()
    lms.autotune_gpu_mem = gpu_mem
    lms.autotune_host_mem = common.SERVER_HOST_MEM_GIB
    lms.batch_size = batch
    if interconnect:
        lms.interconnect = interconnect
    return lms


def _plan(graph, gpu_mem, args):
    """``(RunResult or None, AutotuneError or None, seconds)`` of planning
    `graph` for `gpu_mem` GiB (the graph is rewritten when it fits)."""
    from tflms import autotune
    from tflms.tf.adapters import graph_step, rewrite
    lms = _lms(gpu_mem, args.batch, args.interconnect)
    start = time.perf_counter()
    try:
        result = rewrite.rewrite_function_graph(
            graph, lms.settings,
            target=graph_step.step_target(lms.settings, here=False))
    except autotune.AutotuneError as err:
        return None, err, time.perf_counter() - start
    return result, None, time.perf_counter() - start


def _oracle_peak(graph):
    """The oracle's runtime GPU peak of `graph`'s step and its result."""
    import tensorflow as tf
    from benchmarks import measure
    from tflms.tf import oracle
    from tflms.tf.adapters import tf_function
    fetches = tf_function.step_fetches(graph)
    with graph.as_default():
        train_op = tf.group(*fetches.ops, name="tflms_bench_step_%d"
                            % len(graph.get_operations()))
    fetch = train_op.name
    graph_def, _ = measure.forward_identities(oracle.place_on_gpu(graph),
                                              keep={fetch})
    judged = oracle.peak_memory(graph_def, fetch, place=False)
    return judged.runtime_gpu_peak_bytes, judged


def _sim(result):
    from tflms import pipeline
    planned = pipeline.simulate_plan(result.planned)
    return planned, planned.with_lms


def _step_ms(planned, args):
    from tflms import steptime
    lms = _lms(args.gpu_mem, args.batch, args.interconnect)
    step = planned.step_time or steptime.predict_planned(
        planned, gpu=lms.gpu, interconnect=lms.interconnect)
    return step.with_lms_s * 1e3, step.without_lms_s * 1e3


def measure_seq(seq, args):
    """One row of the table (a dict), printing details as it goes."""
    from tflms import pipeline
    ratio = float(os.environ.get("TF_LMS_SIMULATOR_MEM_RATIO", "0.9"))
    row = {"seq": seq}
    # The --gpu-mem plan.
    concrete, model = family_step(seq, args)
    result, err, secs = _plan(concrete.graph, args.gpu_mem, args)
    row["plan_s"] = secs
    row["ops"] = len(concrete.graph.get_operations())
    if err is not None:
        row["floor"] = err.floor.floor_bytes if err.floor else None
        row["gpu_mem_plan"] = "no plan: smallest %s" % common.fmt_bytes(
            err.smallest_peak_bytes)
    elif result.planned is None:
        row["gpu_mem_plan"] = "fits without LMS"
    else:
        planned, sim = _sim(result)
        lowest = pipeline.step_floor(planned)
        row["floor"] = lowest.floor_bytes
        row["floor_op"] = lowest.describe()
        row["gpu_mem_plan"] = "fits: %s, %d swapped" % (
            common.fmt_bytes(sim.peak_device_bytes),
            len(result.swapout_ops))
        row["gpu_mem_step_ms"], row["no_lms_step_ms"] = _step_ms(planned,
                                                                 args)
    print("%d: %d ops; %g GiB: %s (%.1f s)" % (
        seq, row["ops"], args.gpu_mem, row["gpu_mem_plan"], secs),
        flush=True)
    del concrete, model, result
    # The smallest plan: a search at the floor names it, a second makes it.
    # The search is not monotone in the budget (a plan checked with its
    # copies timed may miss a budget a smaller one meets), so with
    # --refine the budgets between the last that failed and the first that
    # fitted are bisected, and the lowest plan found is the row's.
    budgets, failed, fitted = [], None, None
    if row.get("floor"):
        budgets.append(row["floor"] / ratio / common.GIB)
    for attempt in range(3 + args.refine):
        if not budgets:
            break
        budget = budgets.pop(0)
        concrete, model = family_step(seq, args)
        result, err, secs = _plan(concrete.graph, budget, args)
        row["smallest_plan_s"] = row.get("smallest_plan_s", 0.0) + secs
        if err is not None:
            print("  %.2f GiB: no plan, smallest %s (%.1f s)" % (
                budget, common.fmt_bytes(err.smallest_peak_bytes), secs),
                flush=True)
            failed = max(failed or 0.0, budget)
            if fitted is not None:
                budgets.extend(_between(failed, fitted))
            elif err.smallest_peak_bytes and attempt < 2:
                # A little above it: the search's own smallest plan.
                budgets.append(err.smallest_peak_bytes * 1.01 / ratio
                               / common.GIB)
            if "smallest_swaps" not in row:
                row["smallest_sim"] = err.smallest_peak_bytes
            continue
        fitted = budget if fitted is None else min(fitted, budget)
        if args.refine and failed is not None:
            budgets.extend(_between(failed, fitted))
        planned, sim = _sim(result)
        print("  %.2f GiB: plan %s, %d swapped, %d ordering edges "
              "(%.1f s)" % (budget, common.fmt_bytes(sim.peak_device_bytes),
                            len(result.swapout_ops),
                            len(planned.ordering_edges), secs), flush=True)
        if ("smallest_swaps" in row
                and sim.peak_device_bytes >= row["smallest_sim"]):
            continue
        row["smallest_sim"] = sim.peak_device_bytes
        row["smallest_swaps"] = len(result.swapout_ops)
        row["smallest_step_ms"], _ = _step_ms(planned, args)
        for name, nbytes in sorted(sim.live_at_peak, key=lambda x: -x[1])[
                :args.top]:
            print("    simulator %10.1f MiB  %s" % (nbytes / _MIB, name))
        if not args.no_oracle:
            peak, judged = _oracle_peak(concrete.graph)
            row["smallest_oracle"] = peak
            print("  oracle runtime peak %s" % common.fmt_bytes(peak),
                  flush=True)
            for t in [t for t in judged.runtime_live_at_peak
                      if not t.variable][:args.top]:
                print("    oracle    %10.1f MiB  %s%s" % (
                    t.nbytes / _MIB, t.name,
                    " (copied in)" if t.transferred else ""))
        if not budgets:
            break
    best = row.get("smallest_oracle") or row.get("smallest_sim")
    if best and row.get("floor"):
        row["ratio"] = best / float(row["floor"])
    return row


def _between(failed, fitted):
    """The next budget to try (a list of one, GiB) between one that
    `failed` and one that `fitted`, or none once they are within 2%."""
    if fitted - failed <= 0.02 * fitted:
        return []
    return [(failed + fitted) / 2.0]


def table(rows, args):
    """The markdown table of `rows`."""
    lines = [
        "| sequence | floor | smallest plan: simulator | oracle | ratio | "
        "%g GiB plan | predicted step (smallest plan) | without LMS | "
        "planning s (%g GiB) |" % (args.gpu_mem, args.gpu_mem),
        "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %.1f |" % (
            r["seq"], common.fmt_bytes(r.get("floor")),
            common.fmt_bytes(r.get("smallest_sim")),
            common.fmt_bytes(r.get("smallest_oracle")),
            "%.2fx" % r["ratio"] if r.get("ratio") else "-",
            r["gpu_mem_plan"],
            "%.0f ms" % r["smallest_step_ms"]
            if r.get("smallest_step_ms") else "-",
            "%.0f ms" % r["no_lms_step_ms"]
            if r.get("no_lms_step_ms") else "-",
            r["plan_s"]))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("seq", type=int, nargs="+", help="sequence lengths")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gpu-mem", type=float, default=16.0,
                        help="GPU memory, GiB (autotune_gpu_mem)")
    parser.add_argument("--interconnect", default=None,
                        help="LMS interconnect (default: LMS's, PCIe 4.0)")
    parser.add_argument("--family", choices=sorted(
        keras_hub_models.FAMILIES), default="gpt2",
        help="the KerasHub model (default gpt2)")
    for name in ("layers", "heads", "hidden"):
        parser.add_argument("--" + name, type=int, default=GPT2_SMALL[name],
                            help="model size (default: GPT-2 small's %d)"
                            % GPT2_SMALL[name])
    parser.add_argument(
        "--intermediate", type=int, default=None,
        help="intermediate width (default: the family's at GPT-2 small's "
        "width: %s)" % ", ".join("%s %d" % (f, c["intermediate"]) for f, c
                                 in keras_hub_models.FAMILIES.items()))
    parser.add_argument("--top", type=int, default=12,
                        help="buffers live at the smallest plan's peak")
    parser.add_argument("--refine", type=int, default=0,
                        help="budgets bisected between the last that found "
                        "no plan and the first that did (default 0)")
    parser.add_argument("--no-oracle", action="store_true",
                        help="plan only; skip the oracle's replay")
    args = parser.parse_args(argv)
    common.setup_tensorflow("eager")
    rows = [measure_seq(seq, args) for seq in args.seq]
    print(table(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
