"""The lines `LMS.run` logs about a step and its plan: the step, the
graph's facts, the parameters, the plan's details, and the one-line
summary shown at TensorFlow's default log level."""

from tflms import analysis
from tflms import floor
from tflms import initializers
from tflms.stages.records import Prefetched

__all__ = ["log_step", "log_graph_facts", "log_parameters",
           "log_plan_details", "summary_line", "size_text"]

_GIB = float(1 << 30)
_MIB = float(1 << 20)


def log_step(log, index):
    """Which ops the training step is, and how it was found."""
    if not index.fetches:
        log.info("The training step is %s. If the graph holds more than "
                 "one step runs (evaluation heads, summaries, a second "
                 "model), pass what the step runs: lms.run(graph, "
                 "fetches=train_op)" % index.step_rule)
        return
    outside = index.graph_num_ops - index.num_ops
    log.info("The training step is the fan-in of %s: %d of the graph's "
             "%d operations%s" % (
                 index.step_rule, index.num_ops, index.graph_num_ops,
                 "; LMS leaves the %d others alone" % outside
                 if outside else ""))

def log_graph_facts(log, index, roles, settings):
    """What the step holds: size, parameters, largest op, levels, loops,
    oneDNN fusion partners; and a warning for a training plan of a step
    without training ops."""
    log.info("The graph has %d vertices and %d edges."
             % (index.num_ops, index.num_edges))
    log.info("The graph has %.2f MiB of learning parameters"
             % (analysis.learning_parameter_bytes(index) / _MIB))
    # Ops that hand a buffer on (Keras' optimizers pass every gradient
    # through one IdentityN) allocate nothing: not the largest operation.
    passing = {i for i in roles.device_ops if floor.forwards_only(index, i)}
    op, nbytes = analysis.largest_device_op(
        index, roles.device_ops, settings.batch_size,
        excluded=initializers.initializer_only_ops(index) | passing)
    if op is not None:
        log.info("The largest operation is %s consuming %.2f GiB"
                 % (index.names[op], nbytes / _GIB))
    log.info("Original categorized topological sort has %d levels"
             % index.num_levels)
    if log.enabled(1):
        for lvl, ops in enumerate(index.ops_by_level):
            log.info("[%d]: %s" % (lvl, ", ".join(
                "%s (%s)" % (index.names[o], index.types[o])
                for o in ops)), 1)
    if settings.is_training and not analysis.has_training_ops(
            index):
        log.warning(
            "The graph has no training operations (no gradients, no "
            "optimizer updates), but LMS plans for a training step "
            "(is_training=True). For an inference-only graph, set "
            "lms.is_training = False.")
    if roles.has_loops:
        log.info("The graph has loops: LMS leaves tensors inside loops "
                 "alone. For RNNs, also pass swap_memory=True to "
                 "tf.compat.v1.nn.dynamic_rnn / tf.while_loop so "
                 "TensorFlow swaps loop tensors itself.")
    if roles.fused_with:
        pairs = sorted({tuple(sorted((index.types[a], index.types[b])))
                        for a, partners in roles.fused_with.items()
                        for b in partners})
        log.info("%d operations may be merged in pairs by TensorFlow at "
                 "run time when oneDNN is on (%s): LMS never starts a "
                 "swap-in from one of a pair for the other, which would "
                 "make the merged operation wait for itself." % (
                     len(roles.fused_with),
                     ", ".join("+".join(p) for p in pairs)))

def log_parameters(log, planned):
    """The swap parameters of `planned` (a `pipeline.Planned` with a
    plan), in a form to paste into the constructor, and the swaps that
    stages after the tuner changed."""
    p = planned.params
    autotuned, only_tensors = planned.autotuned, planned.only_tensors
    unwaited = planned.unwaited
    prefetched = planned.record(Prefetched).swap_ins
    hand_set = ("LMS(swapout_threshold=%d, swapin_ahead=%d, "
                "swapin_groupby=%d, sync_mode=%d)"
                % (p.swapout_threshold, p.swapin_ahead, p.swapin_groupby,
                   p.sync_mode))
    if autotuned and only_tensors is not None:
        log.info("LMS will swap %d tensors chosen by the simulator with "
                 "the parameters below. Set by hand, %s would swap "
                 "every tensor past the threshold instead (more bytes "
                 "moved; that plan was not simulated): only auto-tuning "
                 "reproduces this selection."
                 % (len(only_tensors), hand_set))
    elif autotuned:
        log.info("LMS will use the parameters found by the simulator; to "
                 "skip tuning next time, pass: %s" % hand_set)
    else:
        log.info("LMS will use the following parameter set:")
    ignored = " (ignored: sync_mode %d)" % p.sync_mode if p.sync_swapin \
        else ""
    log.info("sync_mode: %d (%s)" % (p.sync_mode, p.sync_mode.text),
             indent=2)
    if unwaited:
        log.info("except for %d swap-outs, whose waits the plan does "
                 "not need to fit (docs/autotuning.md, step 9)"
                 % len(unwaited), indent=2)
    log.info("swapout_threshold: %d" % p.swapout_threshold, indent=2)
    log.info("swapin_ahead: %d%s" % (p.swapin_ahead, ignored), indent=2)
    if prefetched:
        log.info("except for %d swap-ins started earlier, where memory "
                 "allows and the step gets shorter (docs/autotuning.md, "
                 "step 10)" % len(prefetched), indent=2)
    log.info("swapin_groupby: %d%s" % (p.swapin_groupby, ignored),
             indent=2)

def log_plan_details(log, index, plan):
    """Every swap and recompute of `plan` (debug level 1 and 2)."""
    if not log.enabled(1):
        return
    lv = index.levels
    for swap in plan.swaps:
        name = "%s:%d" % (index.names[swap.producer], swap.output)
        log.info("Swap-out: %s (level %d, %s bytes)"
                 % (name, lv[swap.producer], swap.nbytes), 1, 2)
        for sin in swap.swap_ins:
            kind = "sync on" if sin.synchronous else "triggered by"
            log.info("Swap-in for %s %s %s" % (
                ", ".join("%s (level %d)" % (index.names[c], lv[c])
                          for c, _ in sin.consumers), kind,
                ", ".join("%s (level %d)" % (index.names[t], lv[t])
                          for t in sin.triggers)), 1, 4)
        if swap.waiters:
            log.info("Waiting for the swap-out: %s" % ", ".join(
                index.names[w] for w in swap.waiters), 2, 4)
    for rec in plan.recomputes:
        name = "%s:%d" % (index.names[rec.producer], rec.output)
        log.info("Recompute: %s (level %d, %s bytes) from %s" % (
            name, lv[rec.producer], rec.nbytes, ", ".join(
                "%s (%s)" % (index.names[o], index.types[o])
                for o in rec.ops)), 1, 2)
        shared = sorted({"%s:%d" % (index.names[src[1]], src[2])
                         for src in rec.sources("recompute")})
        if shared:
            log.info("Recompute of %s reads clones the recomputes of %s "
                     "make (not cloned again)" % (name, ", ".join(shared)),
                     1, 4)
        log.info("Recompute for %s triggered by %s (level %d)" % (
            ", ".join("%s (level %d)" % (index.names[c], lv[c])
                      for c, _ in rec.consumers),
            index.names[rec.trigger], lv[rec.trigger]), 1, 4)


def summary_line(planned, rewrite, seconds):
    """The one line LMS logs at WARNING level when it rewrites a graph, so
    that it shows at TensorFlow's default log level (docs/usage.md, "What
    LMS logs", says how to silence it)."""
    plan = planned.plan
    parts = ["Large Model Support rewrote the training step (%d of the "
             "graph's %d operations) in %.2f s: %d tensors (%s) go to "
             "host memory and back each step" % (
                 planned.index.num_ops, planned.index.graph_num_ops,
                 seconds, len(plan.swaps), size_text(plan.swapout_bytes()))]
    if plan.recomputes:
        parts.append("%d are recomputed instead (%s)" % (
            len(plan.recomputes), size_text(plan.recompute_bytes())))
    if planned.with_lms is not None and planned.without_lms is not None:
        parts.append("predicted device peak %s, %s without LMS"
                     % (size_text(planned.with_lms.peak_device_bytes),
                        size_text(planned.without_lms.peak_device_bytes)))
    parts.append("%d operations added; lms.last_run has the plan"
                 % (len(rewrite.swapout_ops) + len(rewrite.swapin_ops)
                    + len(rewrite.recompute_ops)))
    return "; ".join(parts)


def size_text(nbytes):
    """``'1.23 GiB'`` from 0.1 GiB up, else ``'45.6 MiB'``."""
    if nbytes >= 0.1 * _GIB:
        return "%.2f GiB" % (nbytes / _GIB)
    return "%.1f MiB" % (nbytes / _MIB)
