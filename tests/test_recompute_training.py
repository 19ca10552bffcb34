"""Training with LMS and recompute gives bit-identical numbers.

Each model trains three steps from the same seed without LMS and with LMS
(every tensor swapped, ``swapout_threshold=1``, or auto-tuned for half the
peak on a slow link, where convolutions are cloned too) and
``recompute=True``, in a
subprocess with oneDNN explicitly off and on (TensorFlow reads
`TF_ENABLE_ONEDNN_OPTS` once, when it loads). The recomputed values are
the same kernels on the same inputs, so losses and weights must be equal
exactly, even where the swaps alone are compared with a tolerance
(`_graphs.assert_same_training`). The clone ops must really have run: each
is in the traced step's stats, or was fused by Grappler into the clone it
reads, which ran (oneDNN makes batch norm + ReLU one kernel, for the
originals and the clones alike), or merged with a twin clone that ran
(two recomputes cloning the same op with the same trigger). The script is
`_recompute_training.py`.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.numerics

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "_recompute_training.py")

# Model -> the op types its recomputes must clone (what the model shows).
EXPECTED_TYPES = {
    "cnn_bn": {"FusedBatchNormV3", "Relu"},
    "cnn_branchy": {"ConcatV2", "FusedBatchNormV3", "MaxPool"},
    "keras_resnet": {"AddV2", "FusedBatchNormV3", "Relu"},
    # Auto-tuned, each recompute judged by predicted step time: the clones
    # go through convolutions (`_recompute_training.tuned_lms`).
    "keras_resnet_64:tuned": {"Conv2D", "FusedBatchNormV3", "Relu"},
}
# Models whose plans have a recompute read another's clone (a
# ``('recompute', ...)`` source): the rewrite of shared clones trains the
# same and runs them.
# With oneDNN on, cnn_branchy's shared clone (its pool's) is not made: LMS
# leaves that pool's output alone on oneDNN's CPU kernels (below).
SHARES_CLONES = {
    "0": {"cnn_branchy", "keras_resnet", "keras_resnet_64:tuned"},
    "1": {"keras_resnet", "keras_resnet_64:tuned"}}


def train_in_subprocess(name, onednn):
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn,
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, _SCRIPT, name], env=env,
                          capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("onednn", ["0", "1"])
@pytest.mark.parametrize("name", sorted(EXPECTED_TYPES))
def test_recompute_trains_bit_identically(name, onednn):
    out = train_in_subprocess(name, onednn)
    assert out["onednn"] == onednn
    assert out["recomputed"], "nothing was recomputed"
    expected = set(EXPECTED_TYPES[name])
    if onednn == "1":
        # On oneDNN's CPU kernels a MaxPoolGrad reads its pool's workspace
        # only while it reads the pool's own output, so LMS neither swaps
        # nor recomputes that output there (`Target.onednn_cpu`).
        expected.discard("MaxPool")
        assert "MaxPool" not in out["cloned_types"]
    assert expected <= set(out["cloned_types"])
    assert (out["shared_reads"] > 0) == (name in SHARES_CLONES[onednn]), (
        out["shared_reads"])
    assert out["swapouts"] > 0
    assert not out["unrun"], "ops that ran without LMS did not run with it"
    assert out["same_losses"], out["losses"]
    assert out["same_weights"]
    clones = out["clones"]
    for clone in clones:
        if clone in out["clones_gone"]:
            into = out["clones_gone"][clone]
            assert into and all(c in out["clones_ran"] for c in into), (
                clone, into)
        else:
            assert clone in out["clones_ran"], clone
    assert out["rewritten_again"] == "ALREADY_REWRITTEN"
