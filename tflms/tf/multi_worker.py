"""LMS for a TensorFlow 2 step that runs under
`tf.distribute.MultiWorkerMirroredStrategy`: one process per worker, each
tracing the same `tf.function` (``strategy.run`` inside it) given to
``lms.function``.

Each worker's function graph holds its own replicas' ops, placed by the
strategy on the worker's replica devices by full name
(``/job:worker/replica:0/task:N/device:...``). `worker_of` finds the
strategy from the distributed variables the graph reads and returns this
worker's `worker_devices.WorkerDevices`: what LMS manages (on a worker
without an accelerator, its CPU, as LMS manages unplaced ops on a machine
without a GPU) and the worker's own host CPU, where the swap ops go.

Every worker must make the same rewrite: they train one model in lock-step
through the strategy's all-reduces, and a worker that planned otherwise
(other settings, another budget) runs another step, with its own memory
peak and timing, while the rest wait for it in the gradient all-reduce.
`check_workers_agree` gathers what each worker did (outcome, counts,
parameters, a digest of the swap ops) through the strategy's own
collectives and raises `distributed.RankMismatchError` naming the workers
and what differs.
"""

import tensorflow as tf

from tflms.tf import distributed
from tflms import worker_devices

__all__ = ["strategy_of", "is_multi_worker", "worker_of",
           "worker_record", "check_workers_agree"]

# Fixed widths of the gathered record: every worker's row must have the
# same length for the all-gather.
_TASK_WIDTH = 48
_SUMMARY_WIDTH = 160


def strategy_of(graph):
    """The `tf.distribute.Strategy` of the distributed variables the
    function graph `graph` reads, or None."""
    for variable in getattr(graph, "variables", ()):
        strategy = getattr(variable, "_distribute_strategy", None)
        if strategy is not None:
            return strategy
    return None


def is_multi_worker(strategy):
    """True for a `MultiWorkerMirroredStrategy` (TF2 or compat.v1)."""
    return isinstance(strategy, (
        tf.distribute.MultiWorkerMirroredStrategy,
        tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy))


def worker_of(graph, cpu_device):
    """``(strategy, WorkerDevices)`` of the function graph `graph` when it
    runs under a `MultiWorkerMirroredStrategy`, else None.

    Args:
      graph: the traced step's function graph.
      cpu_device: the ``cpu_device`` setting (its type and index name the
        host CPU; the worker's task completes it).
    """
    strategy = strategy_of(graph)
    if strategy is None or not is_multi_worker(strategy):
        return None
    return strategy, worker_devices.for_worker(
        strategy.extended.worker_devices, cpu_device)


def _workers(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, len(spec.get("chief", ())) + len(spec.get("worker", ())))


def worker_record(graph, result):
    """What this worker did with its step, as `check_workers_agree`
    compares it: ``(summary, digest)``, the summary readable (outcome,
    swap and recompute counts, parameters), the digest
    `distributed.rewrite_fingerprint` of its swap ops."""
    outcome = result.outcome.value
    plan = result.plan
    if plan is None:
        summary = outcome
    else:
        summary = "%s: %d swap-outs, %d swap-ins, %d recomputes (%s)" % (
            outcome, len(result.swapout_ops), len(result.swapin_ops),
            len(plan.recomputes), plan.params.describe())
    return summary, distributed.rewrite_fingerprint(graph, result.rewrite)


def _allgather_text(strategy, text):
    """Every replica's `text` (same length everywhere), gathered through
    the strategy's collectives, one per worker in replica order."""
    with tf.init_scope():  # eager, also while an outer function is traced
        codes = tf.constant([[ord(c) for c in text]], dtype=tf.int32)
        value = strategy.experimental_distribute_values_from_function(
            lambda _: codes)
        rows = strategy.gather(value, axis=0).numpy()
    local = max(1, len(strategy.extended.worker_devices))
    return ["".join(chr(c) for c in row) for row in rows[::local]]


def check_workers_agree(strategy, worker, graph, result, allgather=None):
    """Raise unless every worker of the strategy made the same rewrite.

    Called by `tflms.tf.lms_function` on each worker right after LMS planned
    (or left alone) the traced step, before it first runs: one all-gather of a
    short record per worker. Every worker traces the step at the same call,
    so each reaches this collective once per traced signature.

    Args:
      strategy: the `MultiWorkerMirroredStrategy`.
      worker: this worker's `worker_devices.WorkerDevices`.
      graph: the function graph LMS was given.
      result: the `tflms.RunResult` of its rewrite.
      allgather: callable(str) -> every worker's str (for tests); default:
        the strategy's own all-gather.

    Returns:
      The list of every worker's record, or None with one worker.

    Raises:
      distributed.RankMismatchError: naming the workers whose rewrite
        differs and what each did.
    """
    if allgather is None:
        if _workers(strategy) < 2:
            return None

        def allgather(text):
            return _allgather_text(strategy, text)
    summary, digest = worker_record(graph, result)
    mine = (worker.task.ljust(_TASK_WIDTH)[:_TASK_WIDTH]
            + summary.ljust(_SUMMARY_WIDTH)[:_SUMMARY_WIDTH] + digest)
    everyone = list(allgather(mine))
    records = [(r[:_TASK_WIDTH].rstrip(),
                r[_TASK_WIDTH:_TASK_WIDTH + _SUMMARY_WIDTH].rstrip(),
                r[_TASK_WIDTH + _SUMMARY_WIDTH:]) for r in everyone]
    if len({rec[1:] for rec in records}) == 1:
        return records
    first = records[0]
    differing = [rec[0] for rec in records if rec[1:] != first[1:]]
    lines = ["%s: %s%s" % (task, text, "" if text != first[1] or
                           digest == first[2] else
                           " (the same counts, other swap operations)")
             for task, text, digest in records]
    raise distributed.RankMismatchError(
        "LMS rewrote the training step differently on %s than on %s (%d "
        "workers of a MultiWorkerMirroredStrategy): %s. Every worker runs "
        "the same step in lock-step with the others (the gradient "
        "all-reduce waits for all of them), so a worker with another plan "
        "has another memory peak and step time, and one that runs out of "
        "memory leaves the others waiting. Give every worker the same "
        "model and the same LMS parameters and, with auto-tuning, the same "
        "budget: set lms.autotune_gpu_mem to the same GiB on every worker, "
        "or pass swapout_threshold, swapin_ahead and swapin_groupby "
        "explicitly."
        % (", ".join(differing), first[0], len(records), "; ".join(lines)))
