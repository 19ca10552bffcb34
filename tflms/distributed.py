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
rewrite); `check_same_rewrite` proves it across the ranks of a Horovod job
and turns a mismatch into an error instead of a hang.

This module also provides what Horovod's Keras integration lacks on Keras
2.15 in graph mode (`BroadcastGlobalVariablesCallback`), and reads rank
facts from the environment that launchers set (`rank_info`).

Horovod is imported lazily, only by the functions that need it.
"""

import collections
import dataclasses
import hashlib
import json
import os
import sys

import tensorflow as tf

from tflms import _compat
from tflms import autotune

__all__ = [
    "HOROVOD_INSTALL_HINT",
    "RankInfo",
    "RankMismatchError",
    "rank_info",
    "rewrite_fingerprint",
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

_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_SIZE_VARS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


class RankMismatchError(RuntimeError):
    """The ranks of a distributed job rewrote their graphs differently."""


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """Where this process stands in a distributed job.

    Attributes:
      rank: global rank (0 when not distributed).
      size: number of processes in the job (1 when not distributed).
      local_rank: rank on this node (0 when not distributed); under Horovod
        this is the GPU index the process should use.
      local_size: processes on this node; the host memory LMS plans with is
        divided by it.
      launcher: 'horovod', 'mpi', 'tf_config' or None.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    launcher: object = None


def _int(env, names):
    for name in names:
        text = env.get(name)
        if text not in (None, ""):
            try:
                return int(text)
            except ValueError:
                raise ValueError(
                    "%s=%r must be an integer (it is set by the job launcher;"
                    " unset it when not running under one)" % (name, text))
    return None


def rank_info(env=None):
    """The `RankInfo` of this process, from the launcher's environment.

    Reads Horovod's (``HOROVOD_RANK``...), Open MPI's
    (``OMPI_COMM_WORLD_RANK``...) and PMI's variables, then tf.distribute's
    ``TF_CONFIG`` (rank = index among the chief and workers). No
    distributed package is imported.

    Raises:
      ValueError: if one of those variables is not an integer, or TF_CONFIG
        is not JSON.
    """
    env = os.environ if env is None else env
    rank = _int(env, _RANK_VARS)
    if rank is not None:
        launcher = "horovod" if env.get("HOROVOD_RANK") not in (
            None, "") else "mpi"
        size = _int(env, _SIZE_VARS)
        return RankInfo(rank=rank, size=size if size is not None else rank + 1,
                        local_rank=autotune.local_rank(env) or 0,
                        local_size=autotune.local_size(env),
                        launcher=launcher)
    text = env.get("TF_CONFIG")
    if text:
        try:
            config = json.loads(text)
        except ValueError:
            raise ValueError("TF_CONFIG=%r is not JSON; see the "
                             "tf.distribute documentation for its format"
                             % (text,))
        cluster = config.get("cluster", {})
        task = config.get("task", {})
        members = list(cluster.get("chief", [])) + list(
            cluster.get("worker", []))
        kind, index = task.get("type"), int(task.get("index", 0))
        rank = index + (len(cluster.get("chief", []))
                        if kind == "worker" else 0)
        return RankInfo(rank=rank, size=max(1, len(members)), local_rank=0,
                        local_size=autotune.local_size(env),
                        launcher="tf_config")
    return RankInfo()


def _tensor_label(tensor):
    return "%s:%d" % (tensor.op.name, tensor.value_index)


def rewrite_fingerprint(graph, result):
    """A digest of the swap ops LMS added to `graph` and how they are wired.

    Covers each swap op's name, device, input, control inputs and
    consumers (name and input slot), in a canonical order, so two ranks
    whose digests agree made the same rewrite.

    Args:
      graph: the rewritten `tf.Graph`.
      result: the `rewriter.RewriteResult` of `LMS.run` (``lms.last_result``),
        or None when LMS changed nothing.

    Returns:
      A hex string.
    """
    digest = hashlib.sha256()
    names = () if result is None else (
        tuple(result.swapout_ops) + tuple(result.swapin_ops))
    for name in sorted(names):
        op = graph.get_operation_by_name(name)
        consumers = sorted(
            (c.name, i) for t in op.outputs for c in t.consumers()
            for i, x in enumerate(c.inputs) if x is t)
        record = [op.name, op.device, [_tensor_label(t) for t in op.inputs],
                  sorted(c.name for c in op.control_inputs), consumers]
        digest.update(json.dumps(record).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _horovod():
    try:
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        if _compat.TF_VERSION >= (2, 16, 0):
            raise ImportError(
                "Horovod is not installed, and Horovod 0.28.1 does not build "
                "against %s (its build includes TensorFlow headers that need "
                "highwayhash, which the TensorFlow wheel does not ship). Run "
                "Horovod jobs on TensorFlow 2.15: pip install 'tflms[tf215]', "
                "then build Horovod as follows. %s"
                % (_compat.tf_version_text(), HOROVOD_INSTALL_HINT)) from e
        raise ImportError(HOROVOD_INSTALL_HINT) from e
    return hvd


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
      result: ``lms.last_result`` (None if LMS changed nothing).
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
    groups = collections.OrderedDict()
    for rank, value in enumerate(everyone):
        groups.setdefault(value, []).append(rank)
    if len(groups) > 1:
        differing = [r for r, v in enumerate(everyone) if v != everyone[0]]
        raise RankMismatchError(
            "LMS rewrote the graph differently on ranks %s than on rank 0 "
            "(%d distinct rewrites among %d ranks). Horovod matches "
            "collectives by op name, and different graphs can name them "
            "differently, which hangs the job at its first step. Give every "
            "rank the same model, the same LMS parameters and, with "
            "auto-tuning, the same budget: set lms.autotune_gpu_mem to the "
            "same GiB on every rank, or pass swapout_threshold, swapin_ahead "
            "and swapin_groupby explicitly."
            % (differing, len(groups), len(everyone)))
    return fingerprint


def check_ranks_agree(graph, run_result):
    """After `LMS.run`, in a Horovod job of two or more ranks, raise unless
    every rank made the same rewrite (`check_same_rewrite`)."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None or not hvd.is_initialized() or hvd.size() < 2:
        return
    check_same_rewrite(graph, run_result.rewrite)


class BroadcastGlobalVariablesCallback(_compat.CallbackBase):
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
        if _compat.is_keras3_model(self.model):
            raise _compat.UnsupportedStackError(
                _compat.keras3_model_message(self.model))
        hvd = _horovod()
        session = _compat.keras_backend_for(self.model).get_session()
        graph = session.graph
        if self._done_for is graph:
            return
        if self.lms is not None:
            check_same_rewrite(
                graph, self.lms.last_run.rewrite if self.lms.last_run else None)
        with graph.as_default(), tf.device(self.device):
            broadcast = hvd.broadcast_global_variables(self.root_rank)
        session.run(broadcast)
        self._done_for = graph
