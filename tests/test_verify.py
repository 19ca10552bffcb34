"""`tflms verify`: training with and without LMS on the user's own graph.

The saved graph is the TF1 CNN of `models.cnn_bias` (convs with biases,
max pooling, SGD with a global step): the graph on which oneDNN's merge of
`Conv2DBackpropFilter` with `BiasAddGrad` once turned LMS's trigger edges
into a cycle, so that with oneDNN on the global step stopped advancing and
the first layers stopped learning (see `fusions.fusion_partners`). The
command runs in a subprocess with oneDNN set explicitly off and on.
"""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tflms import LMS, Outcome, RunResult
from tflms.tf import verify as verifying

from zoo import models

pytestmark = pytest.mark.numerics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build():
    graph = tf.Graph()
    with graph.as_default():
        model = models.cnn_bias(image=12, channels=4, depth=2, batch=4)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP,
                                       model.train_op)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOSSES,
                                       model.loss)
    return graph


# The swap ops LMS adds to `_build`'s step with every tensor swapped, by
# TF_ENABLE_ONEDNN_OPTS: with oneDNN on, the step runs on oneDNN's CPU
# kernels here, so LMS leaves the pools' outputs that their gradients read
# on the device (`Target.onednn_cpu`): five swaps fewer.
SWAP_OPS = {"0": 16, "1": 11}


@pytest.fixture(scope="module")
def meta_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("verify") / "cnn.meta")
    tf.compat.v1.train.export_meta_graph(path, graph=_build())
    return path


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_verify_passes_with_onednn_off_and_on(meta_path, onednn):
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn)
    proc = subprocess.run(
        [sys.executable, "-m", "tflms", "verify", meta_path,
         "--swapout-threshold", "1", "--swapin-ahead", "1",
         "--swapin-groupby", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        check=False)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert "oneDNN: %s" % ("on" if onednn == "1" else "off") in out
    assert "Global step advanced: 3 without LMS, 3 with LMS" in out
    swaps = SWAP_OPS[onednn]
    assert "Swap ops that ran: %d of the %d LMS added" % (swaps, swaps) in out
    # oneDNN's layout pass aside (kernels_differ), Grappler did the same.
    assert ("Grappler optimized the step the same with LMS's edits as "
            "without" in out)
    assert "VERDICT: PASS" in out


class _WrongLMS:
    """Stands in for an LMS whose rewrite changes the computation: it
    doubles the learning rate of one variable's update."""

    def run(self, graph, fetches=None):
        with graph.as_default():
            update = next(op for op in graph.get_operations()
                          if op.type == "ResourceApplyGradientDescent")
            doubled = update.inputs[1] * 2.0
        update._update_input(1, doubled)
        return RunResult(Outcome.REWRITTEN)


def test_verify_reports_a_different_computation():
    report = verifying.verify(_build, _WrongLMS())
    assert not report.ok
    assert report.different  # the doubled variable, then the losses
    assert report.global_step == (3, 3)


def test_verify_reports_ops_that_did_not_run():
    report = verifying.verify(_build, LMS(swapout_threshold=1,
                                          swapin_ahead=1, swapin_groupby=0))
    assert report.ok, report
    assert report.swap_ops == report.swap_ops_ran == SWAP_OPS[
        os.environ["TF_ENABLE_ONEDNN_OPTS"]]
    assert report.ops_not_run == [] and report.swap_ops_not_run == []


def _forward_only():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8])
        w = tf.compat.v1.get_variable("w", [8, 8], use_resource=True)
        tf.reduce_sum(tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, w)), w)))
    return graph


def test_verify_needs_a_train_op():
    with pytest.raises(verifying.VerifyError, match="--train-op NAME"):
        verifying.verify(_forward_only, LMS(swapout_threshold=1,
                                            swapin_ahead=1, swapin_groupby=0))


def test_verify_command_errors_name_the_fix(tmp_path):
    path = str(tmp_path / "nothing.meta")
    tf.compat.v1.train.export_meta_graph(path, graph=_forward_only())
    proc = subprocess.run(
        [sys.executable, "-m", "tflms", "verify", path,
         "--swapout-threshold", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    assert "name the op that runs one training step with --train-op NAME" \
        in proc.stderr


# ---- the hook stops a training loop whose global step stands still ------
def test_hook_trains_normally_with_its_global_step_guard():
    graph = tf.Graph()
    with graph.as_default():
        model = models.cnn_bias(image=8, channels=2, depth=2, batch=2)
        lms = LMS(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
        global_step = tf.compat.v1.train.get_global_step()
        with tf.compat.v1.train.MonitoredSession(hooks=[lms]) as sess:
            seen = [sess.run([model.train_op, global_step],
                             model.feed_dict)[1] for _ in range(6)]
            # One run that only reads: the guard sees at most two equal
            # values in a row, never the three that would raise.
            final = sess.run(global_step)
    assert lms.last_run.swapout_ops
    # A read in the same run as the increment is not ordered with it: step
    # i (from 0) sees i or i + 1, never anything else.
    assert all(value in (i, i + 1) for i, value in enumerate(seen)), seen
    assert final == 6


def test_hook_raises_when_the_global_step_stops_advancing():
    # A train op that does not run the global step's AssignAdd stands in for
    # a rewritten step whose AssignAdd never runs.
    graph = tf.Graph()
    with graph.as_default():
        model = models.cnn_bias(image=8, channels=2, depth=2, batch=2)
        step = tf.compat.v1.train.get_global_step()
        step.assign_add(1)  # in the graph, never run
        frozen = model.graph.get_operation_by_name(
            "cnn_bias/train/update_cnn_bias/dense/kernel/"
            "ResourceApplyGradientDescent")
    lms = LMS(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
    with pytest.raises(RuntimeError, match="global step stayed at 0 for 3"):
        with graph.as_default():
            with tf.compat.v1.train.MonitoredSession(hooks=[lms]) as sess:
                for _ in range(10):
                    sess.run(frozen, model.feed_dict)
