"""`tflms.tf.swaps_ran.watch_swaps`: which swap ops of a rewrite TensorFlow
ran, from the partition graphs it makes inside the block.

The check runs in a subprocess (TensorFlow 2 code in eager mode; the test
process has eager execution off): a `lms.function` step whose first call
is inside the block has every swap op found, on the CPU; a step already
run before the block has none found, since TensorFlow partitioned it
before (the check can fail); the names inlining prefixes are found
as `RunResult` names them. Keras 3 `fit` is checked by docs/tf2.md's
example (tests/test_docs.py) and tests/test_keras3_mixed_precision.py.
"""

import json
import os
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

_SCRIPT = r"""
import json
import tensorflow as tf
from tflms import LMS
from tflms.tf.swaps_ran import watch_swaps

w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[1, 2]))
x = tf.random.stateless_normal([32, 64], seed=[3, 4])


def step(x):
    with tf.GradientTape() as tape:
        h = x
        for _ in range(6):
            h = tf.nn.relu(tf.matmul(h, w))
        loss = tf.reduce_sum(h * x)
    w.assign_sub(1e-4 * tape.gradient(loss, w))
    return loss


def checked(call_before):
    lms = LMS(swapout_threshold=2, swapin_ahead=1, swapin_groupby=0)
    train = lms.function(step)
    if call_before:
        train(x)
    with watch_swaps(lms) as swaps:
        train(x)
    return dict(expected=list(swaps.expected), ran=swaps.ran,
                missing=list(swaps.missing), all_ran=swaps.all_ran,
                text=str(swaps), graphs=swaps.partition_graphs,
                swapouts=list(lms.last_run.swapout_ops),
                swapins=list(lms.last_run.swapin_ops))


print("RESULT " + json.dumps(dict(first=checked(False),
                                  before=checked(True))))
"""


def test_watch_swaps_finds_the_swaps_of_a_first_call_and_only_then():
    env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_DUMP_GRAPH_PREFIX", None)
    env.pop("TF_DUMP_GRAPH_NAME_FILTER", None)
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    r = json.loads(line[-1][len("RESULT "):])
    first, before = r["first"], r["before"]
    assert first["swapouts"] and first["swapins"]
    assert first["expected"] == first["swapouts"] + first["swapins"]
    assert first["all_ran"] and first["missing"] == []
    assert sorted(first["ran"]) == sorted(first["expected"])
    assert all("CPU" in device.upper() for device in first["ran"].values())
    assert first["graphs"] >= 1
    assert first["text"].startswith("%d of the %d swap operations LMS "
                                    "added ran (on " % (
                                        len(first["expected"]),
                                        len(first["expected"])))
    # Partitioned before the block: nothing to find inside it.
    assert before["expected"] and not before["all_ran"]
    assert before["missing"] == before["expected"] and before["ran"] == {}
    assert "; not in any of the 0 partition graphs: lms/" in before["text"]
