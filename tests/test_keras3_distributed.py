"""Keras 3 ``model.fit(callbacks=[LMS(...)])`` under MirroredStrategy.

Each case runs tests/dist_jobs/keras3_mirrored_job.py in a subprocess
(Keras 3 trains in eager mode, and the strategy's logical devices must be
set before TensorFlow starts): two logical CPUs hold the replicas and
stand in for GPUs, CPU:0 is the host. The job trains the same model from
the same seed without LMS and with it, and reports the losses, the final
weights, each replica's plan and the swap ops found in the partition
graphs TensorFlow ran (TF_DUMP_GRAPH_PREFIX).
"""

import json
import os

import numpy as np
import pytest

from tests._keras3 import needs_keras3, onednn, python

pytestmark = needs_keras3

_HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(_HERE, "dist_jobs", "keras3_mirrored_job.py")
TOWERS = ("/job:localhost/replica:0/task:0/device:CPU:1",
          "/job:localhost/replica:0/task:0/device:CPU:2")
HOST = "/job:localhost/replica:0/task:0/device:CPU:0"


def _train(tmp_path, model, modes):
    dump = tmp_path / "dump"
    dump.mkdir()
    out = python(JOB, tmp_path, model, ",".join(modes),
                 TF_DUMP_GRAPH_PREFIX=str(dump),
                 TF_DUMP_GRAPH_NAME_FILTER="multi_step_on_iterator")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    results = {}
    for mode in modes:
        weights = dict(np.load(str(tmp_path / ("k3_%s.npz" % mode))))
        with open(tmp_path / ("k3_%s.json" % mode), encoding="utf-8") as f:
            results[mode] = (weights, json.load(f))
    return results, out.stderr


def _assert_same_training(base, other, what):
    """Bit for bit with oneDNN off; to float rounding with it on, where a
    swapped tensor may keep oneDNN from fusing two ops."""
    (base_weights, base_record), (weights, record) = base, other
    assert sorted(weights) == sorted(base_weights), what
    if onednn() == "0":
        assert record["losses"] == base_record["losses"], what
        for name in base_weights:
            np.testing.assert_array_equal(weights[name], base_weights[name],
                                          err_msg="%s: %s" % (what, name))
    else:
        assert record["losses"] == pytest.approx(base_record["losses"],
                                                 rel=1e-5), what
        for name in base_weights:
            np.testing.assert_allclose(weights[name], base_weights[name],
                                       rtol=1e-4, atol=1e-6,
                                       err_msg="%s: %s" % (what, name))


def _assert_every_replica_swapped_on_its_host(record, towers):
    """Each replica's device was planned on its own, each plan swaps, and
    every swap op LMS added ran, on the host."""
    assert record["outcome"] == "REWRITTEN"
    plans = record["plans"]
    assert [p["device"] for p in plans] == list(towers)
    for plan in plans:
        assert plan["outcome"] == "REWRITTEN", plan["device"]
        assert plan["swapins"], plan["device"]
    names = record["swapins"] + record["swapouts"]
    assert len(record["swapins"]) == sum(len(p["swapins"]) for p in plans)
    executed = record["executed"]
    missing = sorted(set(names) - set(executed))
    assert not missing, "swap ops not in the partition graphs: %s" % missing
    assert {executed[n] for n in names} == {HOST}


# With oneDNN off (exact) in the Python 3.13 pass of tools/run_tests.sh
# only; the other two train with it on (to rounding) in the newest stack's.
@pytest.mark.numerics
@pytest.mark.onednn_off_pass
def test_fit_under_mirrored_strategy_plans_each_replica(tmp_path):
    """Fixed parameters and auto-tuning to 0.6 of a replica's
    activations: every replica's step planned for its own device (the
    tuned plans within the budget), each swap op ran on the host, and the
    training is the training without LMS (bit for bit with oneDNN off)."""
    results, log = _train(tmp_path, "cnn", ("none", "fixed", "tuned"))
    base = results["none"]
    assert base[1]["replicas"] == 2
    for mode in ("fixed", "tuned"):
        record = results[mode][1]
        assert record["replicas"] == 2
        _assert_every_replica_swapped_on_its_host(record, TOWERS)
        _assert_same_training(base, results[mode], mode)
    tuned = results["tuned"][1]["plans"]
    # Each replica's variables (its own copies) stay on its device; the
    # first also holds a few scalars of its own (the optimizer's step).
    assert tuned[0]["resident_bytes"] > 100000
    assert tuned[1]["resident_bytes"] == pytest.approx(
        tuned[0]["resident_bytes"], rel=1e-3)
    for plan in tuned:
        assert plan["autotuned"]
        assert plan["peak_bytes"] <= plan["budget_bytes"]
        assert plan["peak_bytes"] < plan["peak_without_lms_bytes"] * 0.75
    assert "Keras 3 fit under MirroredStrategy (2 replicas)" in log
    assert "Planning the replica on %s (2 of 2 devices)" % TOWERS[1] in log


@pytest.mark.numerics
def test_fit_under_mirrored_strategy_with_steps_per_execution(tmp_path):
    """steps_per_execution=2: the step is planned inside Keras' loop and
    trains as without LMS. One replica: Keras 3.15 itself fails to train
    with two replicas and steps_per_execution > 1 (with or without LMS;
    docs/distributed.md)."""
    results, _ = _train(tmp_path, "cnn", ("none_spe", "fixed_spe"))
    record = results["fixed_spe"][1]
    assert record["outcome"] == "REWRITTEN"
    assert record["swapins"]
    names = record["swapins"] + record["swapouts"]
    assert set(names) <= set(record["executed"])
    _assert_same_training(results["none_spe"], results["fixed_spe"],
                          "steps_per_execution=2")


@pytest.mark.numerics
def test_keras_mobilenetv2_under_mirrored_strategy_tuned(tmp_path):
    """A model the project did not write: Keras' MobileNetV2 application
    (weights=None, 128x128) trained with fit under MirroredStrategy, LMS
    auto-tuned to half of each replica's activations (with recomputes, by
    default): the same training, bit for bit with oneDNN off."""
    results, _ = _train(tmp_path, "mobilenetv2", ("none", "tuned"))
    record = results["tuned"][1]
    _assert_every_replica_swapped_on_its_host(record, TOWERS)
    for plan in record["plans"]:
        assert plan["peak_bytes"] <= plan["budget_bytes"]
    _assert_same_training(results["none"], results["tuned"], "MobileNetV2")
