"""An Estimator trained with MirroredStrategy over two towers, with LMS.

Started in a subprocess by tests/test_distributed.py (logical devices must
be configured before TensorFlow initialises its runtime). The process has
three logical CPU devices: CPU:1 and CPU:2 hold the two towers and stand in
for two GPUs, CPU:0 is the host the swap ops go to (``cpu_device``,
`_common.FIXED`). LMS manages every device but the host, so the towers
are planned as two GPUs would be: nothing of the library is patched, on a
real mirrored graph.

Usage: mirrored_job.py OUT_DIR MODE[,MODE...], MODE one of 'none' (no
LMS), 'one' (one LMS for every tower) and 'per_device' (one LMS per tower,
gpu_device set); the modes run one after the other in this process. Writes
OUT_DIR/MODE.npz (final weights) and OUT_DIR/MODE.json (per swap-in:
devices of the swapped tensor's producer, of the swap op, of its consumers
and triggers; which swap ops ran).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import TOWERS, TraceHook, make_input_fn, model_fn  # noqa: E402
from _common import describe_swaps, lms_for_mode, run_mirrored_modes  # noqa: E402
from _common import save_result  # noqa: E402


class DescribeHook(tf.compat.v1.train.SessionRunHook):
    """Records, after the LMS hooks edited the graph, where each swap is."""

    def __init__(self, lms_list):
        self.lms_list = lms_list
        self.swaps = []

    def begin(self):
        self.swaps = describe_swaps(tf.compat.v1.get_default_graph(),
                                    self.lms_list)


def train(out, mode):
    strategy = tf.distribute.MirroredStrategy(list(TOWERS))
    lms_list = lms_for_mode(mode)
    trace, describe = TraceHook(), DescribeHook(lms_list)
    est = tf.compat.v1.estimator.Estimator(
        model_fn, model_dir=os.path.join(out, "model_" + mode),
        config=tf.compat.v1.estimator.RunConfig(
            tf_random_seed=1, train_distribute=strategy))
    est.train(make_input_fn(0), steps=3, hooks=lms_list + [describe, trace])
    names = [n for n in est.get_variable_names()
             if n.startswith(("dense", "logits"))]
    save_result(out, mode, mode,
                {n: est.get_variable_value(n) for n in names},
                {"replicas": strategy.num_replicas_in_sync,
                 "swaps": describe.swaps, "executed": sorted(trace.executed)})


if __name__ == "__main__":
    run_mirrored_modes(train)
