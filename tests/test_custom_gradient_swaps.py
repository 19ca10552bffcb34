"""A Session graph whose step holds ``tf.custom_gradient`` functions
(``tf.nn.silu``) trains bit for bit with LMS, oneDNN off and on, and every
swap op LMS adds runs.

In graph mode a custom gradient passes the function's result and its
inputs through one ``IdentityN``; inside the step only the result's
output is read, so Grappler removes the ``IdentityN`` and its reads of the
inputs. A swap-in rerouted into one of those inputs was left without a
reader and never ran. LMS does not count such a read
(`GraphIndex.hands_on_unread`, `planner.candidate_edges`): the model
(`_custom_gradient_session.py`, run in a subprocess with
`TF_ENABLE_ONEDNN_OPTS` chosen) swaps every tensor with the parameters of
`test_session_fusions.py` and checks the step stats.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.numerics

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "_custom_gradient_session.py")


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_silu_session_graph_swaps_run_and_train_bit_for_bit(onednn):
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn,
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, _SCRIPT], env=env,
                          capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run["onednn"] == onednn
    assert run["swap_ops"] > 0
    assert not run["swaps_missing"], "swap ops that did not run"
    assert not run["unrun"], "ops that ran without LMS did not run with it"
    assert run["same_losses"], (run["losses"], run["base_losses"])
    assert run["same_weights"]
    # The model still has one IdentityN per silu (else it shows nothing),
    # and none reads a swap-in.
    assert run["identity_n"] == 4
    assert run["identity_n_swapped_in"] == 0
