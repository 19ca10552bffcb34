"""LMS in data-parallel jobs: Horovod and tf.distribute.

The job tests start real processes that talk over 127.0.0.1 only: 2-rank
Horovod jobs (``horovodrun -np 2 -H localhost:2 --gloo``) through the
Session, Keras and Estimator APIs, an Estimator over two MirroredStrategy
towers, and a 2-worker MultiWorkerMirroredStrategy Estimator job. The job
scripts are in tests/dist_jobs/. Each job trains the same small model
without LMS and with the most aggressive parameters (threshold 1, ahead 1)
and the tests check: no hang (every subprocess is bounded by a timeout and
a watchdog inside the job), identical final weights on every rank, equal to
the job without LMS, and swap ops executed on every rank.

Horovod must be importable on TensorFlow 2.15: the README's test command
builds it (tools/install_test_deps.sh). Without it these tests fail with the
command that installs it; they are not skipped. On the TensorFlow 2.16+ stack
Horovod 0.28.1 does not build, and the Horovod tests skip with a reason
naming the stack (tests/_stack.py); so do the Estimator jobs there.
"""

import itertools
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from tflms.tf import reader
from tflms import LMS
from tflms import analysis
from tflms.tf import distributed

from _graphs import rewritten_mlp
from _stack import HOROVOD_REASON, NEW_STACK, needs_estimator
from _workers import REPO, finish, job_env, run_workers, spawn

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, "dist_jobs")
JOB_TIMEOUT = 240  # seconds for a whole multi-process job
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def _horovod():
    if NEW_STACK:
        pytest.skip(HOROVOD_REASON)
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        pytest.fail(distributed.HOROVOD_INSTALL_HINT)
    return hvd


def _horovodrun(job_args, timeout=JOB_TIMEOUT):
    _horovod()
    cmd = [sys.executable, "-c",
           "from horovod.runner.launch import run_commandline; "
           "run_commandline()",
           "-np", "2", "-H", "localhost:2", "--gloo",
           "--gloo-timeout-seconds", "60", "--start-timeout", "60",
           sys.executable, os.path.join(JOBS, "hvd_job.py")] + job_args
    return finish(spawn(cmd, job_env()), timeout, "horovodrun " +
                   " ".join(job_args))


def _load(out_dir, stem):
    weights = dict(np.load(os.path.join(out_dir, stem + ".npz")))
    with open(os.path.join(out_dir, stem + ".json"), encoding="utf-8") as f:
        return weights, json.load(f)


def _assert_same_weights(a, b, what):
    assert sorted(a) == sorted(b), what
    for name in a:
        np.testing.assert_array_equal(a[name], b[name],
                                      err_msg="%s: %s" % (what, name))


# ---- Horovod jobs -----------------------------------------------------------
HOROVOD_VARIANTS = {
    "session": "none;1,1,0;1,1,0,3",
    "keras": "none;1,1,0",
    "estimator": "none;1,1,0",
}


@pytest.mark.parametrize("api", sorted(HOROVOD_VARIANTS))
def test_horovod_job_with_lms_matches_job_without(api, tmp_path):
    variants = HOROVOD_VARIANTS[api].split(";")
    code, out = _horovodrun(["--api", api, "--variants", ";".join(variants),
                             "--out", str(tmp_path)])
    assert code == 0, out[-4000:]
    stems = {v: v.replace(",", "_") for v in variants}
    base = {r: _load(tmp_path, "none.rank%d" % r) for r in (0, 1)}
    # Different initial weights and data per rank: equal results show both
    # the broadcast and the gradient averaging happened.
    _assert_same_weights(base[0][0], base[1][0], "ranks without LMS")
    for variant in variants[1:]:
        for rank in (0, 1):
            weights, info = _load(tmp_path, "%s.rank%d" % (stems[variant],
                                                           rank))
            what = "%s rank %d with LMS %s" % (api, rank, variant)
            _assert_same_weights(base[rank][0], weights, what)
            assert info["swapout_ops"] and info["swapin_ops"], what
            executed = set(info["executed"])
            missing = set(info["swapout_ops"] + info["swapin_ops"]) - executed
            assert not missing, "%s: swap ops not executed: %s" % (
                what, sorted(missing)[:5])
            assert info["collectives"] > 0, what
            assert info["collective_contacts"] == [], what
            assert info["rank_info"][:4] == [rank, 2, rank, 2], what
        fingerprints = {_load(tmp_path, "%s.rank%d" % (stems[variant], r))[1][
            "fingerprint"] for r in (0, 1)}
        assert len(fingerprints) == 1, "ranks rewrote differently"


def test_ranks_that_rewrite_differently_stop_with_an_error(tmp_path):
    """Rank 1 with another swapin_ahead: without the check this job hangs
    at its first step (Horovod waits for allreduce names that only one rank
    has); check_same_rewrite makes both ranks fail fast instead."""
    code, out = _horovodrun(["--api", "session", "--variants", "1,1,0",
                             "--rank1-ahead", "5", "--out", str(tmp_path),
                             "--watchdog", "120"], timeout=180)
    assert code != 0
    for rank in (0, 1):
        assert ("RANK_MISMATCH rank %d: LMS rewrote the graph differently on "
                "ranks [1] than on rank 0" % rank) in out, out[-4000:]
    assert "set lms.autotune_gpu_mem to the same GiB on every rank" in out
    assert "Timeout" not in out  # the watchdog did not have to fire


def test_ranks_that_take_different_paths_stop_with_an_error(tmp_path):
    """Rank 0's graph already has LMS's swap ops, rank 1's does not: LMS.run
    returns early on rank 0 and rewrites on rank 1. The job runs no check
    of its own. Were LMS.run to check only after a rewrite, rank 1's check
    would meet rank 0's first training collective instead: a hang, or (as
    seen here over Gloo) a Horovod shutdown whose message names neither the
    ranks nor the cause. Checking on every path names both."""
    code, out = _horovodrun(["--api", "session", "--variants", "1,1,0",
                             "--rank0-prerewritten", "--out", str(tmp_path),
                             "--watchdog", "120"], timeout=180)
    assert code != 0
    for rank in (0, 1):
        assert ("RANK_MISMATCH rank %d: LMS took different paths on the "
                "ranks of this job: rank 0 left the graph alone because it "
                "already had LMS swap operations; rank 1 rewrote the graph. "
                % rank) in out, out[-4000:]
    assert ("Give every rank the same model (all built fresh, or all "
            "restored from the same rewritten meta graph)") in out
    assert "Timeout" not in out  # the watchdog did not have to fire


def test_horovod_keras_callback_needs_the_shim():
    """Why `distributed.BroadcastGlobalVariablesCallback` exists: Horovod's
    own callback calls keras.backend.get_session(), gone in Keras 2.15."""
    _horovod()
    script = (
        "import numpy as np, tensorflow as tf\n"
        "tf.compat.v1.disable_eager_execution()\n"
        "import horovod.tensorflow.keras as hk\n"
        "hk.init()\n"
        "m = tf.keras.Sequential([tf.keras.Input((3,)), "
        "tf.keras.layers.Dense(2)])\n"
        "m.compile(hk.DistributedOptimizer(tf.keras.optimizers.legacy."
        "SGD(0.1)), 'mse')\n"
        "try:\n"
        "    m.fit(np.zeros((4, 3)), np.zeros((4, 2)), verbose=0, callbacks="
        "[hk.callbacks.BroadcastGlobalVariablesCallback(0)])\n"
        "    print('HOROVOD CALLBACK OK')\n"
        "except AttributeError as e:\n"
        "    print('HOROVOD CALLBACK FAILED:', e)\n"
        "from tflms.tf.distributed import BroadcastGlobalVariablesCallback\n"
        "m.fit(np.zeros((4, 3)), np.zeros((4, 2)), verbose=0, callbacks="
        "[BroadcastGlobalVariablesCallback(0)])\n"
        "print('SHIM OK')\n")
    code, out = finish(spawn([sys.executable, "-c", script], job_env()), 180,
                        "Keras callback script")
    assert code == 0, out[-3000:]
    assert ("HOROVOD CALLBACK FAILED: module 'keras.backend' has no "
            "attribute 'get_session'") in out
    assert "SHIM OK" in out


# ---- tf.distribute ----------------------------------------------------------
TOWERS = ("/replica:0/task:0/device:CPU:1", "/replica:0/task:0/device:CPU:2")


def _assert_swaps_stay_in_their_tower(info, mode):
    """Both towers swap the same number of tensors; each swap's consumers
    and triggers are in the tower of the swapped tensor, its swap ops on
    the host, and they ran."""
    swaps = info["swaps"]
    by_tower = {t: [s for s in swaps if s["source_device"] == t]
                for t in TOWERS}
    assert all(by_tower.values()), "%s: a tower has no swaps" % mode
    assert len(by_tower[TOWERS[0]]) == len(by_tower[TOWERS[1]])
    executed = set(info["executed"])
    for s in swaps:
        tower = s["source_device"]
        assert tower in TOWERS, s
        assert set(s["consumer_devices"]) == {tower}, s
        assert set(s["trigger_devices"]) <= {tower}, s
        assert s["swap_devices"] == ["/device:CPU:0"] * 2, s
        assert s["swapin"] in executed and s["swapout"] in executed, s


@needs_estimator
def test_mirrored_strategy_swaps_stay_in_their_tower(tmp_path):
    modes = ("none", "one", "per_device")
    code, out = finish(spawn(
        [sys.executable, os.path.join(JOBS, "mirrored_job.py"),
         str(tmp_path), ",".join(modes)], job_env()), JOB_TIMEOUT,
        "MirroredStrategy job")
    assert code == 0, out[-4000:]
    results = {mode: _load(tmp_path, mode) for mode in modes}
    base = results["none"][0]
    for mode in ("one", "per_device"):
        weights, info = results[mode]
        assert info["replicas"] == 2
        _assert_same_weights(base, weights, mode)
        _assert_swaps_stay_in_their_tower(info, mode)


def test_mirrored_strategy_session_swaps_stay_in_their_tower(tmp_path):
    """MirroredStrategy without an Estimator (a Session loop over
    call_for_each_replica): runs on every supported TensorFlow."""
    modes = ("none", "one", "per_device")
    code, out = finish(spawn(
        [sys.executable, os.path.join(JOBS, "mirrored_session_job.py"),
         str(tmp_path), ",".join(modes)], job_env()), JOB_TIMEOUT,
        "MirroredStrategy Session job")
    assert code == 0, out[-4000:]
    results = {mode: _load(tmp_path, "session_" + mode) for mode in modes}
    base, base_info = results["none"]
    for mode in ("one", "per_device"):
        weights, info = results[mode]
        assert info["replicas"] == 2
        assert info["losses"] == base_info["losses"], mode
        _assert_same_weights(base, weights, mode)
        _assert_swaps_stay_in_their_tower(info, mode)


def test_mirrored_strategy_custom_loop_with_lms_function(tmp_path):
    """A TF2 custom loop: the user's `tf.function` runs `strategy.run` on
    two towers and reduces the loss, and `LMS.function` rewrites it. The
    same losses and weights as without LMS, each tower's swaps in its
    tower, and every swap op in the partition graphs TensorFlow ran."""
    dump = tmp_path / "dump"
    dump.mkdir()
    modes = ("none", "one")
    code, out = finish(spawn(
        [sys.executable, os.path.join(JOBS, "mirrored_function_job.py"),
         str(tmp_path), ",".join(modes)],
        job_env(TF_DUMP_GRAPH_PREFIX=str(dump),
             TF_DUMP_GRAPH_NAME_FILTER="_tflms_")), JOB_TIMEOUT,
        "MirroredStrategy custom-loop job")
    assert code == 0, out[-4000:]
    (base, base_info), (weights, info) = (
        _load(tmp_path, "function_" + mode) for mode in modes)
    assert info["replicas"] == 2
    assert info["losses"] == base_info["losses"]
    _assert_same_weights(base, weights, "one")
    _assert_swaps_stay_in_their_tower(info, "one")


@needs_estimator
def test_multi_worker_mirrored_estimator_with_lms(tmp_path):
    for mode in ("none", "lms"):
        for code, out in run_workers(
                [sys.executable, os.path.join(JOBS, "mwms_job.py"),
                 str(tmp_path), mode], JOB_TIMEOUT):
            assert code == 0, out[-4000:]
    base = {w: _load(tmp_path, "none.worker%d" % w)[0] for w in (0, 1)}
    _assert_same_weights(base[0], base[1], "workers without LMS")
    for w in (0, 1):
        weights, info = _load(tmp_path, "lms.worker%d" % w)
        what = "worker %d with LMS" % w
        assert info["replicas"] == 2, what
        _assert_same_weights(base[w], weights, what)
        assert info["swapout_ops"] and info["swapin_ops"], what
        missing = set(info["swapout_ops"] + info["swapin_ops"]) - set(
            info["executed"])
        assert not missing, "%s: not executed: %s" % (what, sorted(missing))
        assert info["collectives"] > 0, what
        assert info["collective_contacts"] == [], what


def _run_workers(job, args, tmp_path, timeout=JOB_TIMEOUT):
    """Run `job` as the two workers of a cluster, each dumping its
    partition graphs into its own folder."""
    def dump_of(i):
        dump = tmp_path / ("dump%d" % i)
        dump.mkdir(exist_ok=True)
        return dict(TF_DUMP_GRAPH_PREFIX=str(dump),
                    TF_DUMP_GRAPH_NAME_FILTER="_tflms_")
    return run_workers([sys.executable, os.path.join(JOBS, job)] + list(args),
                       timeout, env_of=dump_of)


def test_multi_worker_custom_loop_with_lms_function(tmp_path):
    """Two CPU-only workers (TF_CONFIG on 127.0.0.1, CPU collectives), a
    custom loop whose tf.function calls strategy.run, given to
    LMS.function with fixed parameters and auto-tuned: LMS plans for each
    worker's CPU (its replica device),
    puts the swap ops on the worker's own host, and every swap op runs
    there; the losses and weights are those of the workers without LMS,
    the same on both workers (each reads its own data)."""
    modes = "none,lms,tuned" + (",keras3_fit" if NEW_STACK else "")
    for worker, (code, out) in enumerate(_run_workers(
            "mwms_function_job.py", [str(tmp_path), modes], tmp_path)):
        assert code == 0, "worker %d:\n%s" % (worker, out[-4000:])
    base = {w: _load(tmp_path, "none.worker%d" % w) for w in (0, 1)}
    _assert_same_weights(base[0][0], base[1][0], "workers without LMS")
    assert base[0][1]["losses"] == base[1][1]["losses"]
    # Fixed parameters, and auto-tuned for a budget (autotune_gpu_mem) the
    # step does not fit in.
    for mode, w in itertools.product(("lms", "tuned"), (0, 1)):
        weights, info = _load(tmp_path, "%s.worker%d" % (mode, w))
        what = "worker %d with LMS (%s)" % (w, mode)
        host = "/job:worker/replica:0/task:%d/device:CPU:0" % w
        assert info["replicas"] == 2, what
        assert info["worker_devices"] == [host], what
        assert info["losses"] == base[w][1]["losses"], what
        _assert_same_weights(base[w][0], weights, what)
        added = info["swapout_ops"] + info["swapin_ops"]
        assert info["swapout_ops"] and info["swapin_ops"], what
        missing = set(added) - set(info["executed"])
        assert not missing, "%s: not run: %s" % (what, sorted(missing))
        assert {info["executed"][n] for n in added} == {host}, what
        assert info["swap_devices"] == [host], what  # named in full
    for mode in ("lms", "tuned"):
        assert (_load(tmp_path, "%s.worker0" % mode)[1]["swapin_ops"]
                == _load(tmp_path, "%s.worker1" % mode)[1]["swapin_ops"])
    if NEW_STACK:
        # Why the example and the docs use a custom loop: Keras 3's own fit
        # does not train under this strategy, LMS or not (with arrays here;
        # docs/distributed.md lists the inputs tried). When a Keras release
        # fixes it, this fails: cover fit then, and update the docs.
        for w in (0, 1):
            info = _load(tmp_path, "keras3_fit.worker%d" % w)[1]
            assert (info["fit_error"] or "").startswith(
                "ValueError: Attempt to convert a value (PerReplica:"), info


def test_multi_worker_workers_that_rewrite_differently_stop(tmp_path):
    """Worker 1 with another swapin_ahead: both workers stop at the first
    call of the step with an error naming the worker and both plans."""
    results = _run_workers("mwms_function_job.py",
                           [str(tmp_path), "lms_ahead3_on_worker1"], tmp_path,
                           timeout=180)
    for worker, (code, out) in enumerate(results):
        assert code != 0, "worker %d finished:\n%s" % (worker, out[-3000:])
        assert ("RankMismatchError: LMS rewrote the training step "
                "differently on /job:worker/replica:0/task:1 than on "
                "/job:worker/replica:0/task:0 (2 workers of a "
                "MultiWorkerMirroredStrategy): /job:worker/replica:0/task:0:"
                " rewritten: ") in out, out[-4000:]
        assert "swapin_ahead 1," in out and "swapin_ahead 3," in out
        assert "Timeout" not in out  # the watchdog did not have to fire


# ---- collectives in the analysis --------------------------------------------
def _horovod_mlp_graph(hvd):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [8], name="y")
        h = x
        for i in range(8):
            h = tf.compat.v1.layers.dense(h, 16, activation=tf.nn.relu,
                                          name="dense%d" % i)
        logits = tf.compat.v1.layers.dense(h, 4, name="logits")
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits)
        opt = hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1))
        opt.minimize(loss)
        hvd.broadcast_global_variables(0)
    return graph


def _assert_no_role(graph, expect_types):
    index = reader.build_index(graph)
    collectives = analysis.collective_ops(index)
    kinds = {index.types[i] for i in collectives}
    assert expect_types <= kinds, kinds
    roles = analysis.classify_ops(index)
    for role in ("sources", "sinks", "triggers", "waiters"):
        assert not collectives & getattr(roles, role), role
    return len(collectives)


@pytest.mark.parametrize("control_flow", ["v2", "v1"])
def test_horovod_collectives_get_no_role(control_flow, request):
    hvd = _horovod()
    hvd.init()  # a 1-process job: the graph is the same as with 2 ranks
    if control_flow == "v1":
        request.getfixturevalue("v1_control_flow")
    graph = _horovod_mlp_graph(hvd)
    # v2: each allreduce is inside a StatelessIf that must count as one.
    wrapped = {"v2": {"StatelessIf"}, "v1": {"HorovodAllreduce"}}[
        control_flow]
    count = _assert_no_role(graph, wrapped)
    # 18 allreduces (9 layers x 2); the 18 broadcasts of the initial
    # weights run in a Session.run of their own, outside the training step.
    assert count == 18
    assert any(op.type == "HorovodBroadcast"
               for op in graph.get_operations())
    assert "HorovodBroadcast" not in reader.build_index(graph).types
    result = LMS(**FIXED).run(graph)
    assert result.swapin_ops
    index = reader.build_index(graph)
    collective_names = {index.names[i]
                        for i in analysis.collective_ops(index)}
    for name in result.swapout_ops + result.swapin_ops:
        op = graph.get_operation_by_name(name)
        touched = ({t.op.name for t in op.inputs}
                   | {c.name for c in op.control_inputs}
                   | {c.name for t in op.outputs for c in t.consumers()})
        assert not touched & collective_names, name


def test_collective_in_the_forward_pass_is_left_alone():
    """A collective feeding the rest of the model (as in synchronized batch
    norm): LMS swaps around it but never through it."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        h = x
        for i in range(6):
            h = tf.compat.v1.layers.dense(h, 16, activation=tf.nn.relu,
                                          name="dense%d" % i)
            if i == 2:
                # Batch statistics summed over the workers, as a
                # synchronized batch norm does (no gradient through them).
                sync = tf.raw_ops.CollectiveReduceV2(
                    input=tf.reduce_mean(h, axis=0, keepdims=True),
                    group_size=tf.constant(1), group_key=tf.constant(1),
                    instance_key=tf.constant(1), ordering_token=[],
                    merge_op="Add", final_op="Id", name="sync")
                h = h - tf.stop_gradient(sync)
        # Read again at the end, far from where it is made (Greater has no
        # gradient, so none flows into the collective).
        loss = tf.reduce_mean(tf.square(h)) + tf.reduce_sum(
            tf.cast(tf.greater(sync, tf.reduce_mean(h)), tf.float32))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    _assert_no_role(graph, {"CollectiveReduceV2"})
    sync = graph.get_operation_by_name("sync")
    inputs_before = [t.name for t in sync.inputs]
    consumers_before = sorted(c.name for c in sync.outputs[0].consumers())
    result = LMS(**FIXED).run(graph)
    assert result.swapout_ops
    assert [t.name for t in sync.inputs] == inputs_before
    assert sorted(c.name for c in sync.outputs[0].consumers()) == \
        consumers_before
    assert not sync.control_inputs
    for name in result.swapin_ops:
        assert sync not in graph.get_operation_by_name(name).control_inputs


# ---- same rewrite on every rank ---------------------------------------------
def test_check_same_rewrite_compares_every_rank():
    g1, r1 = rewritten_mlp(**FIXED)
    g2, r2 = rewritten_mlp(**FIXED)
    g3, r3 = rewritten_mlp(swapout_threshold=1, swapin_ahead=3,
                           swapin_groupby=0)
    f1 = distributed.rewrite_fingerprint(g1, r1)
    assert f1 == distributed.rewrite_fingerprint(g2, r2)  # deterministic
    f3 = distributed.rewrite_fingerprint(g3, r3)
    assert f3 != f1
    assert distributed.rewrite_fingerprint(g1, None) != f1
    f2 = distributed.rewrite_fingerprint(g2, r2)
    assert distributed.check_same_rewrite(
        g1, r1, allgather=lambda f: [f, f2]) == f1
    with pytest.raises(distributed.RankMismatchError,
                       match=r"differently on ranks \[2\] than on rank 0 "
                       r"\(2 distinct rewrites among 3 ranks\)"):
        distributed.check_same_rewrite(g1, r1,
                                       allgather=lambda f: [f, f, f3])


def test_check_ranks_agree_compares_outcome_and_rewrite():
    graph, result = rewritten_mlp(**FIXED)
    other, other_result = rewritten_mlp(swapout_threshold=1, swapin_ahead=3,
                                        swapin_groupby=0)
    check = distributed.check_ranks_agree
    # Not a multi-rank job: nothing to compare with, Horovod untouched.
    for env in ({}, {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"},
                {"TF_CONFIG": json.dumps({
                    "cluster": {"worker": ["a:1", "b:2"]},
                    "task": {"type": "worker", "index": 0}})}):
        assert check(graph, distributed.REWRITTEN, result, env=env) is None
    gathered = []

    def record(mine):
        gathered.append(mine)
        return [mine, mine]
    mine = check(graph, distributed.REWRITTEN, result, allgather=record)
    fingerprint = distributed.rewrite_fingerprint(graph, result)
    assert gathered == [mine] and mine.endswith(fingerprint)
    # A later run on the rewritten graph digests the swap ops it finds.
    again = check(graph, distributed.ALREADY_REWRITTEN, allgather=record)
    assert again.endswith(fingerprint) and len(again) == len(mine)
    not_needed = check(graph, distributed.NOT_NEEDED, allgather=record)
    assert len(not_needed) == len(mine)

    with pytest.raises(distributed.RankMismatchError) as info:
        check(graph, distributed.REWRITTEN, result,
              allgather=lambda m: [m, not_needed, not_needed])
    assert str(info.value).startswith(
        "LMS took different paths on the ranks of this job: rank 0 rewrote "
        "the graph; ranks 1, 2 left the graph alone because the step fits "
        "without LMS. Horovod matches collectives by op name")
    theirs = check(other, distributed.REWRITTEN, other_result,
                   allgather=lambda m: [m])
    with pytest.raises(distributed.RankMismatchError,
                       match=r"differently on ranks \[1\] than on rank 0 "
                       r"\(2 distinct rewrites among 2 ranks\)"):
        check(graph, distributed.REWRITTEN, result,
              allgather=lambda m: [m, theirs])
    with pytest.raises(ValueError, match="outcome must be one of "
                       "'rewritten', 'not needed', 'already rewritten'; "
                       "got 'done'"):
        check(graph, "done", result, allgather=record)


def test_broadcast_callback_validates_root_rank():
    with pytest.raises(ValueError, match="root_rank must be a rank number "
                       ">= 0; got -1"):
        distributed.BroadcastGlobalVariablesCallback(-1)


def test_horovod_example_help():
    examples = os.path.join(REPO, "examples")
    code, out = finish(spawn(
        [sys.executable, os.path.join(examples, "horovod_resnet50_lms.py"),
         "--help"], job_env()), 120, "horovod_resnet50_lms.py --help")
    assert code == 0, out
    for flag in ("horovodrun", "--image_size", "--lms", "--autotune-gpu-mem",
                 "--swapout-threshold"):
        assert flag in out, flag


@pytest.mark.skipif(not NEW_STACK, reason="the TensorFlow 2.16+ message; "
                    "this is TensorFlow %s" % tf.__version__)
def test_missing_horovod_on_the_new_stack_names_the_tensorflow_it_needs():
    try:
        import horovod.tensorflow  # noqa: F401
        pytest.skip("Horovod is importable here")
    except ImportError:
        pass
    with pytest.raises(ImportError) as info:
        distributed._horovod()
    message = str(info.value)
    assert ("Horovod is not installed, and Horovod 0.28.1 does not build "
            "against TensorFlow %s" % tf.__version__) in message
    assert "Run Horovod jobs on TensorFlow 2.15: pip install 'tflms[tf215]'" \
        in message
    assert distributed.HOROVOD_INSTALL_HINT in message


# Trains with and without LMS: run with oneDNN off and on (tools/run_tests.sh).
pytestmark = pytest.mark.numerics
