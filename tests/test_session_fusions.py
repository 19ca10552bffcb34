"""A Session graph trains bit for bit with LMS, oneDNN off and on: LMS
plans it on the same target as a tf.function's step
(`graph_step.step_target`), so it leaves whole what Grappler and oneDNN
merge at run time (`fusions.grappler_groups`).

The model (`_session_fusions.py`, run as a script in a subprocess with
`TF_ENABLE_ONEDNN_OPTS` chosen, which TensorFlow reads once when it loads)
is a CNN with a convolution, bias and ReLU, an overlapping max pool, a
product chain and a sum of three branches. It trains three steps without
LMS, with ``lms.run(graph)`` (fixed parameters that swap every tensor)
and with the same plan on a target without the fusion rules. With the
rules, losses and weights are equal bit for bit in both modes and every
swap op ran (the step stats of the traced steps). Without them, with
oneDNN on, the pool's output is swapped and its MaxPoolGrad reads the
swap-in, loses the pool's workspace and sums the overlapping windows'
gradients in another order: the weights differ, the proof that the rules
are what keeps the numbers. (With oneDNN off this model rounds the same
either way; the rules are still checked to keep it bit for bit.)
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.numerics

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "_session_fusions.py")


def train_in_subprocess(onednn):
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn,
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, _SCRIPT], env=env,
                          capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_session_graph_trains_bit_for_bit(onednn):
    out = train_in_subprocess(onednn)
    assert out["onednn"] == onednn
    run = out["with_rules"]
    # Planned on the step's target: Grappler's groups, and oneDNN's where
    # the step runs on its CPU kernels.
    assert run["target"] == {"grappler_groups": True,
                             "onednn_cpu": onednn == "1"}
    assert run["swap_ops"] > 0
    assert not run["swaps_missing"], "swap ops that did not run"
    assert not run["unrun"], "ops that ran without LMS did not run with it"
    assert run["same_losses"], (run["losses"], run["base_losses"])
    assert run["same_weights"]
    # The same plan without the rules swaps more, and with oneDNN on
    # trains to other weights.
    off = out["without_rules"]
    assert off["swap_ops"] > run["swap_ops"]
    assert not off["swaps_missing"] and not off["unrun"]
    if onednn == "1":
        assert not off["same_weights"], (
            "the model no longer needs the fusion rules: it cannot show "
            "that Session graphs apply them")
