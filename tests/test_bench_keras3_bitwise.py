"""benchmarks/keras3_bitwise.py: the two helpers it relies on, and what
docs/tf2.md says of Grappler's memory optimizer."""

from _keras3 import result_of

# A tf.function whose AddN of three 64 MiB tensors is live at Grappler's
# estimated peak (four such tensors: 256 MiB, above 80% of the 256 MiB
# TensorFlow's CPU device declares), called eagerly, once as TensorFlow
# calls it and once after keras3_bitwise.no_memory_scheduling().
_ACCUMULATED = r"""
import json
import os
import sys

os.environ["TF_DUMP_GRAPH_NAME_FILTER"] = "sum_of_three"
import numpy as np
import tensorflow as tf

from benchmarks import keras3_bitwise

x = tf.constant(np.random.RandomState(0).rand(16 << 20).astype("float32"))


def accumulated(folder):
    os.makedirs(folder)
    os.environ["TF_DUMP_GRAPH_PREFIX"] = folder

    @tf.function
    def sum_of_three(x):
        return tf.reduce_sum(tf.math.add_n([tf.sin(x), tf.cos(x),
                                            tf.exp(x)]))
    sum_of_three(x)
    return keras3_bitwise.accumulated_addns(folder)


on = accumulated(os.path.join(sys.argv[1], "on"))
keras3_bitwise.no_memory_scheduling()
off = accumulated(os.path.join(sys.argv[1], "off"))
print("RESULT " + json.dumps(dict(on=on, off=off)))
"""


def test_keras3_bitwise_sees_the_memory_optimizers_accumulations(tmp_path):
    """What docs/tf2.md says of Grappler's memory optimizer, and the two
    helpers of benchmarks/keras3_bitwise.py that rely on it: above 80% of
    the device's memory by Grappler's estimate (205 MiB on a CPU), an AddN
    of more than two inputs live at the peak becomes an accumulation into
    a temporary variable (`accumulated_addns` finds it in the partition
    graphs), and none once `no_memory_scheduling` turned the optimizer
    off."""
    result, _ = result_of("-c", _ACCUMULATED, tmp_path, timeout=300)
    assert result == {"on": ["AddN"], "off": []}
