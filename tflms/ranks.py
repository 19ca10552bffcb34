"""Where this process stands in a distributed job, from the environment
that job launchers set (Horovod, Open MPI, PMI, tf.distribute's
``TF_CONFIG``).

The one place that reads those variables: `tflms.tf.distributed` (the
auto-tuner's budgets) and `tflms._logging` (the ``[rank 3]`` prefix of the
log lines) both ask `rank_info`. Standard library only: no distributed
package, no TensorFlow, and nothing of tflms, so the log can use it without
importing the distributed helpers (and through them the rewriter).
"""

import dataclasses
import json
import os

__all__ = ["RankInfo", "rank_info"]

# The variables job launchers set, by priority: Horovod's (horovodrun),
# Open MPI's (mpirun), then PMI's (Slurm, MPICH). Read only here.
_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_SIZE_VARS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_LOCAL_RANK_VARS = ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
_LOCAL_SIZE_VARS = ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """Where this process stands in a distributed job.

    Attributes:
      rank: global rank (0 when not distributed).
      size: number of processes in the job (1 when not distributed).
      local_rank: rank on this node (0 when not distributed); under Horovod
        this is the GPU index the process should use. With ``TF_CONFIG``:
        this task's place among the chief and workers on its host.
      local_size: processes on this node (with ``TF_CONFIG``: the chief
        and workers whose address names this task's host); the host
        memory LMS plans with is divided by it.
      launcher: 'horovod', 'mpi', 'tf_config' or None.
      task_type: the ``TF_CONFIG`` task type ('chief', 'worker', ...), or
        None.
      task_index: the ``TF_CONFIG`` task index, or None.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    launcher: object = None
    task_type: object = None
    task_index: object = None


def _int(env, names):
    for name in names:
        text = env.get(name)
        if text not in (None, ""):
            try:
                return int(text)
            except ValueError:
                raise ValueError(
                    "%s=%r must be an integer (it is set by the job launcher;"
                    " unset it when not running under one)"
                    % (name, text)) from None
    return None


# Names of this machine's loopback interface: members at any of them run
# on the same host.
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


def _host_of(address):
    """The host part of a ``TF_CONFIG`` member's ``host:port``, lower case;
    loopback names all read as 'localhost'. Names are compared as written
    (no DNS lookup): a job that names one machine in two ways counts it as
    two."""
    host = str(address).rsplit(":", 1)[0] if ":" in str(address) else str(
        address)
    host = host.strip("[]").lower()
    return "localhost" if host in _LOOPBACK or host.startswith(
        "127.") else host


def rank_info(env=None):
    """The `RankInfo` of this process, from the launcher's environment.

    Reads Horovod's (``HOROVOD_RANK``...), Open MPI's
    (``OMPI_COMM_WORLD_RANK``...) and PMI's variables, then tf.distribute's
    ``TF_CONFIG`` (rank = index among the chief and workers; local rank
    and size among the chief and workers whose address names the same host
    as this task's). Otherwise the local rank and size are read whenever a
    launcher set them. No distributed package is imported.

    Args:
      env: environment mapping (default `os.environ`).

    Raises:
      ValueError: if one of those variables is not an integer, or TF_CONFIG
        is not a JSON object.
    """
    env = os.environ if env is None else env
    local = dict(local_rank=_int(env, _LOCAL_RANK_VARS) or 0,
                 local_size=max(1, _int(env, _LOCAL_SIZE_VARS) or 1))
    rank = _int(env, _RANK_VARS)
    if rank is not None:
        launcher = "horovod" if env.get("HOROVOD_RANK") not in (
            None, "") else "mpi"
        size = _int(env, _SIZE_VARS)
        return RankInfo(rank=rank, size=size if size is not None else rank + 1,
                        launcher=launcher, **local)
    text = env.get("TF_CONFIG")
    if text:
        try:
            config = json.loads(text)
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise ValueError("TF_CONFIG=%r is not JSON of an object; see the "
                             "tf.distribute documentation for its format"
                             % (text,))
        cluster = config.get("cluster", {})
        task = config.get("task", {})
        members = list(cluster.get("chief", [])) + list(
            cluster.get("worker", []))
        kind, index = task.get("type"), int(task.get("index", 0))
        rank = index + (len(cluster.get("chief", []))
                        if kind == "worker" else 0)
        local_facts = dict(local_rank=0, local_size=local["local_size"])
        if kind in ("chief", "worker") and rank < len(members):
            # The members on this task's host share its memory (and its
            # GPUs): the chief and workers whose address names that host.
            here = _host_of(members[rank])
            on_host = [r for r, m in enumerate(members)
                       if _host_of(m) == here]
            local_facts = dict(local_rank=on_host.index(rank),
                               local_size=len(on_host))
        return RankInfo(rank=rank, size=max(1, len(members)),
                        launcher="tf_config", task_type=kind,
                        task_index=index if kind else None, **local_facts)
    return RankInfo(**local)
