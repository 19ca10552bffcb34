"""LMS in data-parallel jobs: Horovod and tf.distribute.

LMS rewrites each process's graph on its own, so in a job of several ranks
every rank must make *the same* rewrite. This is not only tidiness: under
TensorFlow 2 graph mode Horovod wraps every allreduce in a ``tf.cond``, the
runtime inlines those conds when the session starts, and the inlined
allreduce ops are named with a counter that follows the graph's
topological order (``.../cond_16/then/_104/HorovodAllreduce_...``).
Horovod matches collectives across ranks *by name*. Two ranks whose rewrites
differ (different swap-in triggers, say) can end up with differently
numbered allreduce ops, and then each rank waits forever for the others to
submit a tensor they never submit: the job hangs at its first step, with
no error. tflms plans deterministically (same graph, same parameters, same
rewrite); `check_ranks_agree`, which `LMS.run` calls on every rank before
each of its returns, proves it across the ranks of a Horovod job and turns
a mismatch into an error instead of a hang. `check_same_rewrite` is the
same check for callers that edit graphs themselves.

This module also provides what Horovod's Keras integration lacks on Keras
2.15 in graph mode (`BroadcastGlobalVariablesCallback`), and hands on
`rank_info` (`tflms.ranks`, the one reader of the environment that
launchers set; the auto-tuner's budgets and the log prefix use it).

Horovod is imported lazily, only by the functions that need it.
"""

import collections
import hashlib
import json

import tensorflow as tf

from tflms.errors import LMSError
from tflms.tf import compat
from tflms.tf import rewriter
from tflms.ranks import RankInfo, rank_info
from tflms.results import Outcome

__all__ = [
    "HOROVOD_INSTALL_HINT",
    "RankInfo",
    "RankMismatchError",
    "REWRITTEN",
    "NOT_NEEDED",
    "ALREADY_REWRITTEN",
    "rank_info",
    "rewrite_fingerprint",
    "check_ranks_agree",
    "check_same_rewrite",
    "BroadcastGlobalVariablesCallback",
]

HOROVOD_INSTALL_HINT = (
    "Horovod is not installed in this Python environment. Build it against "
    "the installed TensorFlow with: HOROVOD_WITH_TENSORFLOW=1 "
    "HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 "
    "HOROVOD_WITHOUT_MXNET=1 pip install --no-build-isolation "
    "--no-cache-dir horovod==0.28.1 (needs cmake and g++; "
    "tools/install_test_deps.sh does it for a checkout of tflms)")

# What `LMS.run` did with a graph; every rank must do the same.
REWRITTEN = Outcome.REWRITTEN.value
NOT_NEEDED = Outcome.NOT_NEEDED.value
ALREADY_REWRITTEN = Outcome.ALREADY_REWRITTEN.value
_OUTCOME_TEXT = {
    REWRITTEN: "rewrote the graph",
    NOT_NEEDED: "left the graph alone because the step fits without LMS",
    ALREADY_REWRITTEN: "left the graph alone because it already had LMS "
                       "swap operations",
}
_OUTCOME_WIDTH = max(len(k) for k in _OUTCOME_TEXT)


class RankMismatchError(LMSError, RuntimeError):
    """The ranks of a distributed job rewrote their graphs differently."""


def _tensor_label(tensor):
    return "%s:%d" % (tensor.op.name, tensor.value_index)


def rewrite_fingerprint(graph, result):
    """A digest of the swap ops LMS added to `graph` and how they are wired.

    Covers each swap op's name, device (without job, replica and task,
    which differ from worker to worker), input, control inputs and
    consumers (name and input slot), in a canonical order, so two ranks
    whose digests agree made the same rewrite.

    Args:
      graph: the rewritten `tf.Graph`.
      result: the `RunResult` of `LMS.run` (``lms.last_run``) or its
        `rewriter.RewriteResult`, or None when LMS changed nothing.

    Returns:
      A hex string.
    """
    names = () if result is None else (
        tuple(result.swapout_ops) + tuple(result.swapin_ops))
    return _fingerprint(graph, names)


def _device_within_task(device):
    """`device` without its job, replica and task: each worker of a
    multi-worker strategy places its swap ops on its own task's host, and
    the rewrites agree when the rest does."""
    spec = tf.DeviceSpec.from_string(device or "")
    return spec.replace(job=None, replica=None, task=None).to_string()


def _fingerprint(graph, names):
    digest = hashlib.sha256()
    for name in sorted(names):
        op = graph.get_operation_by_name(name)
        consumers = sorted(
            (c.name, i) for t in op.outputs for c in t.consumers()
            for i, x in enumerate(c.inputs) if x is t)
        record = [op.name, _device_within_task(op.device),
                  [_tensor_label(t) for t in op.inputs],
                  sorted(c.name for c in op.control_inputs), consumers]
        digest.update(json.dumps(record).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _horovod():
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        if compat.TF_VERSION >= (2, 16, 0):
            raise ImportError(
                "Horovod is not installed, and Horovod 0.28.1 does not build "
                "against %s (its build includes TensorFlow headers that need "
                "highwayhash, which the TensorFlow wheel does not ship). Run "
                "Horovod jobs on TensorFlow 2.15: pip install 'tflms[tf215]', "
                "then build Horovod as follows. %s"
                % (compat.tf_version_text(), HOROVOD_INSTALL_HINT)) from e
        raise ImportError(HOROVOD_INSTALL_HINT) from e
    return hvd


def _marked_op_names(graph):
    """Names of the ops an earlier LMS run added (they carry its marker)."""
    names = []
    for op in graph.get_operations():
        if "lms/" not in op.name:  # reading attributes of the rest is slow
            continue
        try:
            if op.get_attr(rewriter.SWAP_MARKER_ATTR):
                names.append(op.name)
        except ValueError:
            pass
    return names


def _horovod_allgather_strings(text):
    """Every rank's `text` (same length on all ranks), through Horovod."""
    hvd = _horovod()
    codes = [ord(ch) for ch in text]
    graph = tf.Graph()
    with graph.as_default(), tf.device("/cpu:0"):
        gathered = hvd.allgather(tf.constant([codes], dtype=tf.int32),
                                 name="tflms_rewrite_fingerprint")
    with tf.compat.v1.Session(graph=graph) as session:
        rows = session.run(gathered)
    return ["".join(chr(c) for c in row) for row in rows]


def check_same_rewrite(graph, result, allgather=None):
    """Raise unless every rank of the Horovod job made the same LMS rewrite.

    Call it on every rank after LMS has edited the graph and before the
    first training step (it runs one allgather of a 64-character digest in
    a separate session). Outside a Horovod job of two or more ranks it only
    returns the local fingerprint.

    Args:
      graph: the rewritten `tf.Graph`.
      result: ``lms.last_run`` (or None if LMS changed nothing).
      allgather: callable(str) -> list of every rank's str, for other
        engines or tests; default: Horovod's allgather.

    Returns:
      This rank's fingerprint.

    Raises:
      RankMismatchError: naming the ranks whose rewrite differs from rank
        0's, and what to make equal.
    """
    fingerprint = rewrite_fingerprint(graph, result)
    if allgather is None:
        hvd = _horovod()
        if not hvd.is_initialized() or hvd.size() < 2:
            return fingerprint
        allgather = _horovod_allgather_strings
    everyone = list(allgather(fingerprint))
    if len(set(everyone)) > 1:
        raise RankMismatchError(_rewrites_differ(everyone))
    return fingerprint


def _why_and_fix(same_model="the same model"):
    return (
        "Horovod matches collectives by op name, and different graphs can "
        "name them differently, which hangs the job at its first step. Give "
        "every rank %s, the same LMS parameters and, with auto-tuning, the "
        "same budget: set lms.autotune_gpu_mem to the same GiB on every "
        "rank, or pass swapout_threshold, swapin_ahead and swapin_groupby "
        "explicitly." % same_model)


def _rewrites_differ(fingerprints):
    differing = [r for r, v in enumerate(fingerprints)
                 if v != fingerprints[0]]
    return ("LMS rewrote the graph differently on ranks %s than on rank 0 "
            "(%d distinct rewrites among %d ranks). %s"
            % (differing, len(set(fingerprints)), len(fingerprints),
               _why_and_fix()))


def _horovod_peers(info):
    """An allgather over Horovod's ranks, or None when this process has no
    Horovod peers to wait for.

    Under horovodrun (HOROVOD_RANK set) Horovod is initialised if the
    caller has not done it yet: every rank runs the same program, and
    `hvd.init()` is idempotent. Under a plain MPI launcher Horovod is used
    only if the program imported and initialised it: an MPI job that does
    not use Horovod has no Horovod collectives to hang on.
    """
    if info.launcher == "horovod":
        hvd = _horovod()
        if not hvd.is_initialized():
            hvd.init()
    else:
        try:
            import horovod.tensorflow as hvd
        except ImportError:
            return None
        if not hvd.is_initialized():
            return None
    if hvd.size() < 2:
        return None
    return _horovod_allgather_strings


def check_ranks_agree(graph, outcome, result=None, env=None, allgather=None):
    """Raise unless every rank of the job did the same with its graph.

    `LMS.run` calls this on every rank before each of its returns: after
    rewriting (`REWRITTEN`), after finding LMS not needed (`NOT_NEEDED`)
    and after finding the graph already rewritten (`ALREADY_REWRITTEN`).
    In a Horovod job of two or more ranks, told by the launcher's
    environment (`rank_info`), it runs one allgather of the outcome and a
    digest of the swap ops in a separate graph and session, so a rank
    that took another path or made another rewrite stops every rank with
    an error naming the ranks, where otherwise the job would hang at its
    first step. Elsewhere it returns None at once.

    Every rank must call it the same number of times (one per `LMS.run`),
    which running the same program gives.

    Args:
      graph: the `tf.Graph` LMS.run was given.
      outcome: `REWRITTEN`, `NOT_NEEDED` or `ALREADY_REWRITTEN`.
      result: the `rewriter.RewriteResult` with `REWRITTEN`, else None.
        With `ALREADY_REWRITTEN` and None, the digest covers every op an
        earlier LMS run added to `graph`.
      env: environment mapping (default `os.environ`).
      allgather: callable(str) -> list of every rank's str, in rank order,
        for other engines or tests; given, the check runs whatever the
        environment says.

    Returns:
      The string this rank contributed (outcome and digest), or None when
      there was no one to compare with.

    Raises:
      ValueError: for an unknown `outcome`.
      RankMismatchError: naming the ranks and what each did.
    """
    if outcome not in _OUTCOME_TEXT:
        raise ValueError("outcome must be one of %s; got %r" % (
            ", ".join(repr(k) for k in _OUTCOME_TEXT), outcome))
    if allgather is None:
        info = rank_info(env)
        if info.size < 2 or info.launcher not in ("horovod", "mpi"):
            return None
        allgather = _horovod_peers(info)
        if allgather is None:
            return None
    if result is not None:
        fingerprint = rewrite_fingerprint(graph, result)
    elif outcome == ALREADY_REWRITTEN:
        fingerprint = _fingerprint(graph, _marked_op_names(graph))
    else:
        fingerprint = rewrite_fingerprint(graph, None)
    # Fixed width: Horovod's allgather stacks every rank's row.
    mine = outcome.ljust(_OUTCOME_WIDTH) + fingerprint
    everyone = list(allgather(mine))
    if len(set(everyone)) == 1:
        return mine
    outcomes = [v[:_OUTCOME_WIDTH].rstrip() for v in everyone]
    if len(set(outcomes)) == 1:
        raise RankMismatchError(_rewrites_differ(
            [v[_OUTCOME_WIDTH:] for v in everyone]))
    groups = collections.OrderedDict()
    for rank, kind in enumerate(outcomes):
        groups.setdefault(kind, []).append(rank)
    raise RankMismatchError(
        "LMS took different paths on the ranks of this job: %s. %s"
        % ("; ".join("rank%s %s %s" % ("s" if len(ranks) > 1 else "",
                                         ", ".join(map(str, ranks)),
                                         _OUTCOME_TEXT.get(kind, repr(kind)))
                     for kind, ranks in groups.items()),
           _why_and_fix("the same model (all built fresh, or all restored "
                        "from the same rewritten meta graph)")))


class BroadcastGlobalVariablesCallback(compat.CallbackBase):
    """Keras callback: broadcast all global variables from `root_rank`.

    A graph-mode replacement for
    ``horovod.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback``,
    whose graph-mode branch calls ``keras.backend.get_session()``, which
    Keras 2.15 no longer has. This one builds Horovod's
    ``broadcast_global_variables`` op in the model's graph and runs it in
    ``tf.compat.v1.keras.backend.get_session()``, the session Keras trains
    in (on TensorFlow 2.16+ the session of tf_keras, the Keras 2 that
    ``TF_USE_LEGACY_KERAS=1`` or ``import tf_keras`` gives), at the start of
    training: in graph mode Keras has made the train
    function, and with it the optimizer's slot variables, before callbacks
    start, and the LMS callback (in any position of the list) has already
    edited the graph and moved the variables to the session that sees the
    edit. Use it as
    ``callbacks=[lms, BroadcastGlobalVariablesCallback(0, lms=lms)]``.

    Args:
      root_rank: the rank whose values every rank receives.
      device: device of the broadcast ops ('' lets Horovod choose).
      lms: the job's `LMS` callback, or None. When given, every rank first
        checks that all ranks made the same rewrite (`check_same_rewrite`),
        so a mismatch is an error rather than a hang at the first step.
    """

    def __init__(self, root_rank=0, device="", lms=None):
        super().__init__()
        if not isinstance(root_rank, int) or isinstance(root_rank, bool) \
                or root_rank < 0:
            raise ValueError("root_rank must be a rank number >= 0; got %r"
                             % (root_rank,))
        self.root_rank = root_rank
        self.device = device
        self.lms = lms
        self._done_for = None

    def on_train_begin(self, logs=None):
        if tf.executing_eagerly():
            raise RuntimeError(
                "BroadcastGlobalVariablesCallback is for graph mode "
                "(tf.compat.v1.disable_eager_execution()); in eager mode use "
                "horovod.tensorflow.keras.callbacks."
                "BroadcastGlobalVariablesCallback")
        if compat.is_keras3_model(self.model):
            raise compat.UnsupportedStackError(
                compat.keras3_model_message(self.model))
        hvd = _horovod()
        session = compat.keras_backend_for(self.model).get_session()
        graph = session.graph
        if self._done_for is graph:
            return
        if self.lms is not None:
            check_same_rewrite(
                graph, self.lms.last_run)
        with graph.as_default(), tf.device(self.device):
            broadcast = hvd.broadcast_global_variables(self.root_rank)
        session.run(broadcast)
        self._done_for = graph
