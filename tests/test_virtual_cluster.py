"""Tests for the oracle's virtual cluster (tflms/tf/oracle/virtual_cluster.py):
the GPU the virtual cluster simulates comes from `tflms.hardware`.

The default must be the very proto the oracle used before it took its GPU
from `hardware` (literal values below, from the hand-written V100 of
tflms/tf/oracle.py at f4e609a), so every oracle number of the tests,
benchmarks and docs stays what it was.
"""

import dataclasses

import pytest
import tensorflow as tf

if tf.executing_eagerly():
    tf.compat.v1.disable_eager_execution()

from tflms import hardware
from tflms.tf import oracle

# gpu_properties() at f4e609a, every field it set (l3_cache_size it left
# at 0).
V100_BEFORE = {
    "type": "GPU",
    "vendor": "NVIDIA",
    "model": "Tesla V100-SXM2-16GB",
    "frequency": 1530,
    "num_cores": 80,
    "num_registers": 65536,
    "l1_cache_size": 24576,
    "l2_cache_size": 6 * 1024 * 1024,
    "shared_memory_size_per_multiprocessor": 98304,
    "memory_size": 16 << 30,
    "bandwidth": 900 * 1000 * 1000,
}
V100_ENVIRONMENT_BEFORE = {"architecture": "7.0", "cuda": "12020"}

# The A100 benchmarks/step_time.py built by hand before (its
# _a100_properties), but for the model name, which the cost model does not
# read.
A100_BEFORE = dict(V100_BEFORE, model="NVIDIA A100-SXM4-40GB",
                   frequency=1410, num_cores=108,
                   l2_cache_size=40 * 1024 * 1024,
                   shared_memory_size_per_multiprocessor=164 * 1024,
                   memory_size=40 << 30, bandwidth=1555 * 1000 * 1000)


# What TensorFlow itself decides: run on both stacks (tools/run_tests.sh).
pytestmark = pytest.mark.both_stacks


def _fields(props):
    # The fields set to anything but their default (proto3 lists no others),
    # so a field a later TensorFlow adds to the proto changes nothing here.
    return {field.name: value for field, value in props.ListFields()
            if field.name != "environment"}


def test_default_gpu_is_the_v100_the_oracle_always_had():
    props = oracle.gpu_properties()
    assert _fields(props) == V100_BEFORE
    assert dict(props.environment) == V100_ENVIRONMENT_BEFORE
    # Field by field is the same proto, byte for byte.
    assert props == oracle.gpu_properties(hardware.DEFAULT_GPU)
    assert props == oracle.gpu_properties(
        hardware.GPUS["V100-SXM2-16GB"], memory_bytes=16 << 30)


def test_memory_bytes_overrides_the_gpus_memory():
    props = oracle.gpu_properties(memory_bytes=40 << 30)
    assert _fields(props) == dict(V100_BEFORE, memory_size=40 << 30)
    assert oracle.gpu_properties("A100-SXM4-80GB").memory_size == 80 << 30


def test_a100_is_the_one_the_step_time_benchmark_built_by_hand():
    props = oracle.gpu_properties("A100-SXM4-40GB")
    assert _fields(props) == A100_BEFORE
    assert dict(props.environment) == {"architecture": "8.0",
                                       "cuda": "12020"}


@pytest.mark.parametrize("name", list(hardware.GPUS))
def test_every_known_gpu_describes_its_chip(name):
    gpu = hardware.GPUS[name]
    props = oracle.gpu_properties(name)
    assert (props.num_cores, props.frequency, props.l2_cache_size,
            props.environment["architecture"], props.model) == (
                gpu.sms, gpu.boost_clock_mhz, gpu.l2_bytes,
                gpu.compute_capability, gpu.device_name)
    assert props.bandwidth * 1000 == gpu.memory_bandwidth


def test_unknown_gpu_names_the_known_ones():
    with pytest.raises(ValueError, match=r"gpu 'B200' is not known; use "
                       r"one of V100-SXM2-16GB, .*H100-SXM5-80GB"):
        oracle.gpu_properties("B200")


def test_gpu_without_the_chip_cannot_be_the_oracles():
    bare = hardware.Gpu("bare", 1.0, 1.0, 1.0, 1.0, 1 << 30, "test")
    with pytest.raises(ValueError, match=(
            r"gpu 'bare' cannot be the oracle's GPU: it has no sms, "
            r"boost_clock_mhz, compute_capability, l2_bytes, "
            r"shared_memory_per_sm, device_name; give the Gpu these")):
        oracle.gpu_properties(bare)
    partial = dataclasses.replace(hardware.GPUS["A100-SXM4-40GB"],
                                  l2_bytes=None)
    with pytest.raises(ValueError, match=r"it has no l2_bytes;"):
        oracle.gpu_properties(partial)


def _matmul_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        y = tf.linalg.matmul(tf.math.sin(x), x, name="y")
    return graph, y


def test_peak_memory_simulates_the_gpu_it_is_given():
    graph, y = _matmul_graph()
    v100 = oracle.peak_memory(graph, [y])
    assert v100 == oracle.peak_memory(graph, [y], gpu="V100-SXM2-16GB")
    assert v100 == oracle.peak_memory(
        graph, [y],
        cluster=oracle.VirtualCluster(gpu_props=oracle.gpu_properties()))
    h100 = oracle.peak_memory(graph, [y], gpu=hardware.GPUS["H100-SXM5-80GB"])
    # Same schedule of the same ops: the memory is the GPU's business only
    # through time, and the faster chip runs the step sooner.
    assert h100.runtime_gpu_peak_bytes == v100.runtime_gpu_peak_bytes
    assert h100.gpu_peak_bytes == v100.gpu_peak_bytes
    assert 0 < h100.run_time_s < v100.run_time_s


def test_peak_memory_takes_gpu_or_gpu_props_not_both():
    graph, y = _matmul_graph()
    with pytest.raises(ValueError, match=(
            r"peak_memory takes gpu or cluster.gpu_props, not both; got "
            r"gpu='A100-SXM4-40GB' and gpu_props for 'Tesla V100-SXM2-16GB'")):
        oracle.peak_memory(graph, [y], gpu="A100-SXM4-40GB",
                           cluster=oracle.VirtualCluster(
                               gpu_props=oracle.gpu_properties()))
    with pytest.raises(ValueError, match=r"gpu 'V100' is not known"):
        oracle.peak_memory(graph, [y], gpu="V100")
