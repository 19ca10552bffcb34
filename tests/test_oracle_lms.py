"""The rewrite lowers the GPU peak, as measured by TensorFlow itself.

The oracle (`tflms.tf.oracle`) is Grappler's virtual cluster with the
swapped-in-copy correction: it shares no code with the planner or the
simulator, so it is an independent check that swapping helps on a graph
whose compute ops are on ``/device:GPU:0``.
"""

import pytest
import tensorflow as tf

from tflms import LMS
from tflms.tf import oracle

from zoo import models


def _deep_cnn():
    graph = tf.Graph()
    with graph.as_default(), tf.device("/device:GPU:0"):
        # Activations (8 x 48 x 48 x 16 floats = 1.2 MB per conv) dwarf the
        # weights (16 x 16 x 3 x 3 floats = 9 kB per conv).
        model = models.cnn_bn(image=48, channels=16, depth=8, batch=8, seed=1)
    return model


@pytest.mark.parametrize("params", [
    dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0),
    dict(swapout_threshold=4, swapin_ahead=2, swapin_groupby=2),
    dict(swapout_threshold=2, swapin_ahead=1, swapin_groupby=0, sync_mode=3),
])
def test_rewrite_lowers_the_oracle_gpu_peak(params):
    model = _deep_cnn()
    before = oracle.peak_memory(model.graph, model.fetches, place=False)
    result = LMS(**params).run(model.graph)
    assert result.swapout_ops
    after = oracle.peak_memory(model.graph, model.fetches, place=False)
    # The corrected peak counts every swapped-in GPU copy until its last
    # consumer; with the raw number LMS would look better than it is.
    assert after.gpu_peak_bytes >= after.raw_gpu_peak_bytes
    assert after.transfers, "the oracle saw no CPU-to-GPU transfer"
    assert after.gpu_peak_bytes < 0.8 * before.gpu_peak_bytes, (
        before.gpu_peak_bytes, after.gpu_peak_bytes)
    # What left the GPU went to the host.
    assert after.host_peak_bytes > before.host_peak_bytes
