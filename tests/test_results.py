"""`tflms.results`: RunResult, and one result for a step planned one
replica device at a time (`RunResult.of_replicas`)."""

from tflms.results import Outcome, RunResult
from tflms.tf.rewriter import RewriteResult


def _rewritten(tag, swaps, edges):
    return RunResult(Outcome.REWRITTEN, planned=tag, rewrite=RewriteResult(
        swapout_ops=tuple("%s/out%d" % (tag, i) for i in range(swaps)),
        swapin_ops=tuple("%s/in%d" % (tag, i) for i in range(swaps)),
        control_edges=edges, rerouted_inputs=2 * swaps,
        recompute_ops=("%s/clone" % tag,)))


def test_replicas_sum_their_ops_in_planning_order():
    by_device = [("/gpu:0", _rewritten("a", 2, 3)),
                 ("/gpu:1", RunResult(Outcome.NOT_NEEDED, planned="b")),
                 ("/gpu:2", _rewritten("c", 1, 4))]
    result = RunResult.of_replicas(by_device, 1.5)
    assert result.outcome is Outcome.REWRITTEN and result.rewritten
    assert result.planned == "a"  # the first rewritten replica's
    assert result.swapout_ops == ("a/out0", "a/out1", "c/out0")
    assert result.swapin_ops == ("a/in0", "a/in1", "c/in0")
    assert result.control_edges == 7
    assert result.rewrite.rerouted_inputs == 6
    assert result.rewrite.recompute_ops == ("a/clone", "c/clone")
    assert result.replicas == tuple(by_device) and result.seconds == 1.5


def test_replicas_none_rewritten():
    not_needed = RunResult.of_replicas(
        [("/gpu:0", RunResult(Outcome.NOT_NEEDED, planned="a")),
         ("/gpu:1", RunResult(Outcome.NOT_NEEDED, planned="b"))], 0.1)
    assert not_needed.outcome is Outcome.NOT_NEEDED
    assert not_needed.planned == "a" and not_needed.rewrite is None
    assert not_needed.swapin_ops == ()
    already = RunResult.of_replicas(
        [("/gpu:0", RunResult(Outcome.ALREADY_REWRITTEN)),
         ("/gpu:1", RunResult(Outcome.NOT_NEEDED))], 0.1)
    assert already.outcome is Outcome.ALREADY_REWRITTEN


def test_a_single_run_has_no_replicas():
    assert RunResult(Outcome.NOT_NEEDED).replicas == ()
