"""A worker of a multi-worker strategy: what LMS manages there (the
analysis of its replica's ops), and the check that every worker made the
same rewrite (tflms.tf.multi_worker), with the all-gather replaced by a
list. tests/test_worker_devices.py tests the worker's devices (pure);
tests/test_distributed.py runs two real workers."""

import pytest
import tensorflow as tf

from tflms import analysis
from tflms.tf import distributed
from tflms import graph_index as gi
from tflms.tf import multi_worker
from tflms import worker_devices
from tflms.target import Target

from tests import _graphs

TASK1 = "/job:worker/replica:0/task:1"
CPU_WORKER = worker_devices.for_worker([TASK1 + "/device:CPU:0"], "/cpu:0")
GPU_WORKER = worker_devices.for_worker(
    [TASK1 + "/device:GPU:0", TASK1 + "/device:GPU:1"], "/cpu:0")
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def test_classify_ops_manages_a_cpu_only_workers_replica():
    cpu = TASK1 + "/device:CPU:0"
    f32 = {"outputs": [((4, 8), 4)], "device": cpu}
    index = gi.from_edges(
        [("x", "Placeholder", f32), ("a", "Relu", f32), ("b", "Relu", f32),
         ("c", "Relu", f32), ("d", "AddV2", f32),
         ("pinned", "Relu", {"outputs": [((4, 8), 4)],
                             "device": "/device:CPU:0"})],
        edges=[("x", "a"), ("a", "b"), ("b", "c"), ("c", "d"), ("a", "d"),
               ("d", "pinned")])
    ids = {n: i for i, n in enumerate(index.names)}
    assert analysis.classify_ops(index).device_ops == frozenset()
    roles = analysis.classify_ops(index, Target(worker=CPU_WORKER))
    assert roles.device_ops == frozenset(ids[n] for n in "xabcd")
    assert ids["a"] in roles.sources


def _record(worker, graph, result):
    """What this worker contributes to the all-gather."""
    rows = []
    multi_worker.check_workers_agree(
        None, worker, graph, result,
        allgather=lambda mine: rows.append(mine) or [mine])
    return rows[0]


def test_workers_that_agree_pass():
    graph, result = _graphs.rewritten_mlp(**FIXED)
    other_graph, other_result = _graphs.rewritten_mlp(**FIXED)
    worker0 = worker_devices.for_worker(
        ["/job:worker/replica:0/task:0/device:CPU:0"], "/cpu:0")
    theirs = _record(worker0, other_graph, other_result)
    records = multi_worker.check_workers_agree(
        None, CPU_WORKER, graph, result,
        allgather=lambda mine: [theirs, mine])
    assert [r[0] for r in records] == ["/job:worker/replica:0/task:0", TASK1]
    assert records[0][1] == (
        "rewritten: %d swap-outs, %d swap-ins, 0 recomputes (swapout_"
        "threshold 1, swapin_ahead 1, swapin_groupby 0, sync_mode 0)"
        % (len(result.swapout_ops), len(result.swapin_ops)))
    assert records[0][2] == distributed.rewrite_fingerprint(graph, result)


def test_workers_that_differ_stop_with_what_differs():
    graph, result = _graphs.rewritten_mlp(**FIXED)
    other_graph, other_result = _graphs.rewritten_mlp(
        swapout_threshold=1, swapin_ahead=3, swapin_groupby=0)
    worker0 = worker_devices.for_worker(
        ["/job:worker/replica:0/task:0/device:CPU:0"], "/cpu:0")
    theirs = _record(CPU_WORKER, other_graph, other_result)
    with pytest.raises(distributed.RankMismatchError) as info:
        multi_worker.check_workers_agree(
            None, worker0, graph, result,
            allgather=lambda mine: [mine, theirs])
    message = str(info.value)
    assert message.startswith(
        "LMS rewrote the training step differently on %s than on "
        "/job:worker/replica:0/task:0 (2 workers of a "
        "MultiWorkerMirroredStrategy): /job:worker/replica:0/task:0: "
        "rewritten: " % TASK1)
    assert "swapin_ahead 3" in message and "swapin_ahead 1" in message
    assert ("set lms.autotune_gpu_mem to the same GiB on every worker, or "
            "pass swapout_threshold, swapin_ahead and swapin_groupby "
            "explicitly") in message
    # The same counts and parameters, other swap ops: said so.
    mine = _record(worker0, graph, result)
    forged = mine[:-64] + "0" * 64
    with pytest.raises(distributed.RankMismatchError,
                       match=r"\(the same counts, other swap operations\)"):
        multi_worker.check_workers_agree(
            None, worker0, graph, result, allgather=lambda m: [m, forged])


def test_a_graph_without_a_strategy_is_no_worker():
    graph, _ = _graphs.rewritten_mlp(**FIXED)
    assert multi_worker.strategy_of(graph) is None
    assert multi_worker.worker_of(graph, "/cpu:0") is None
    assert not multi_worker.is_multi_worker(tf.distribute.get_strategy())
