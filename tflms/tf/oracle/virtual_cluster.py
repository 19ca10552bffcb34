"""The virtual cluster's devices: a GPU and a CPU for Grappler's analytical
cost model, the placement the oracle measures, and the names the virtual
scheduler gives the copies it inserts."""

import dataclasses
from typing import Optional, Union

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import device_properties_pb2
from tensorflow.python.grappler import cluster as gcluster

from tflms import devices, hardware
from tflms.tf.oracle import functions

GPU_DEVICE = "/job:localhost/replica:0/task:0/device:GPU:0"
CPU_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"

# Large enough that no realistic graph trips the virtual cluster's
# RESOURCE_EXHAUSTED check during measurement; capacity is judged afterwards.
_UNLIMITED = 1 << 50

_GraphLike = Union[tf.Graph, graph_pb2.GraphDef]


# What the cost model is told that no `hardware.Gpu` varies. Registers:
# 64K 32-bit registers per SM on compute capability 5.0 through 9.0 (CUDA C
# Programming Guide, technical specifications per compute capability). L1:
# what TensorFlow's own GetLocalGPUInfo sets for capability 5.0 and later.
# CUDA: the toolkit version the oracle has always claimed (12.2, the one
# TensorFlow 2.15 is built with); the cost model does not read it.
_GPU_VENDOR = "NVIDIA"
_GPU_REGISTERS_PER_SM = 65536
_GPU_L1_BYTES = 24 * 1024
_GPU_CUDA_VERSION = "12020"
# The `hardware.Gpu` fields the proto is made of.
_COST_MODEL_FIELDS = ("sms", "boost_clock_mhz", "compute_capability",
                      "l2_bytes", "shared_memory_per_sm", "device_name")


def gpu_properties(gpu=hardware.DEFAULT_GPU,
                   memory_bytes: Optional[int] = None
                   ) -> device_properties_pb2.DeviceProperties:
    """Properties of a GPU of `tflms.hardware` for the analytical cost model.

    Grappler's cost model reads the SMs, clock, compute capability and
    bandwidth (``OpLevelCostEstimator::GetDeviceInfo``): compute is SMs x
    boost clock x 64 FP32 lanes x 2, its rule for compute capability 6.0
    and later (so it sees half an H100's FP32 rate), memory the HBM
    bandwidth. The other fields describe the chip as TensorFlow's
    ``GetLocalGPUInfo`` would on the real GPU.

    Args:
      gpu: a `tflms.hardware.Gpu` or a key of `tflms.hardware.GPUS`; the
        default is the V100 LMS has always modelled.
      memory_bytes: device memory size; None for the GPU's own.

    Returns:
      A ``DeviceProperties`` proto of type ``"GPU"``.

    Raises:
      ValueError: for an unknown name (naming the known ones), or a `Gpu`
        without the SMs, clock, compute capability, L2, shared memory and
        device name the cost model is given.
    """
    gpu = hardware.gpu_named(gpu)
    missing = [field for field in _COST_MODEL_FIELDS
               if getattr(gpu, field) is None]
    if missing:
        raise ValueError(
            "gpu %r cannot be the oracle's GPU: it has no %s; give the "
            "Gpu these fields, as tflms.hardware.GPUS' GPUs have"
            % (gpu.name, ", ".join(missing)))
    props = device_properties_pb2.DeviceProperties()
    props.type = "GPU"
    props.vendor = _GPU_VENDOR
    props.model = gpu.device_name
    props.frequency = gpu.boost_clock_mhz          # MHz
    props.num_cores = gpu.sms                      # streaming multiprocessors
    props.environment["architecture"] = gpu.compute_capability
    props.environment["cuda"] = _GPU_CUDA_VERSION
    props.num_registers = _GPU_REGISTERS_PER_SM
    props.l1_cache_size = _GPU_L1_BYTES
    props.l2_cache_size = gpu.l2_bytes
    props.shared_memory_size_per_multiprocessor = gpu.shared_memory_per_sm
    props.memory_size = (gpu.memory_bytes if memory_bytes is None
                         else memory_bytes)
    props.bandwidth = int(round(gpu.memory_bandwidth / 1000))  # KB/s
    return props


def cpu_properties(
        memory_bytes: int = 256 << 30,
) -> device_properties_pb2.DeviceProperties:
    """Properties of a server CPU for the analytical cost model.

    Args:
      memory_bytes: host memory size.

    Returns:
      A ``DeviceProperties`` proto of type ``"CPU"``.
    """
    props = device_properties_pb2.DeviceProperties()
    props.type = "CPU"
    props.vendor = "GenuineIntel"
    props.model = "default"
    props.frequency = 2500
    props.num_cores = 16
    props.environment["cpu_instruction_set"] = "AVX2"
    props.l1_cache_size = 32 * 1024
    props.l2_cache_size = 1024 * 1024
    props.l3_cache_size = 32 * 1024 * 1024
    props.memory_size = memory_bytes
    props.bandwidth = 100 * 1000 * 1000  # KB/s
    return props


@dataclasses.dataclass(frozen=True)
class VirtualCluster:
    """The machine `peak_memory` simulates, described to Grappler: its
    devices' names and properties. The GPU's properties are usually
    named by `peak_memory`'s ``gpu`` instead.

    Attributes:
      gpu_props: ``DeviceProperties`` of the GPU; None for
        ``gpu_properties(gpu)``.
      cpu_props: ``DeviceProperties`` of the CPU; None for
        `cpu_properties`.
      gpu_device: full name of the simulated GPU.
      cpu_device: full name of the simulated CPU.
    """

    gpu_props: Optional[device_properties_pb2.DeviceProperties] = None
    cpu_props: Optional[device_properties_pb2.DeviceProperties] = None
    gpu_device: str = GPU_DEVICE
    cpu_device: str = CPU_DEVICE


def _is_cpu_device(device: str) -> bool:
    if not device:
        return False
    try:
        spec = tf.DeviceSpec.from_string(device)
    except ValueError:
        return "cpu" in device.lower()
    return (spec.device_type or "").upper() == "CPU"


def _as_graph_def(graph: _GraphLike,
                  variable_devices: bool = False) -> graph_pb2.GraphDef:
    if isinstance(graph, tf.Graph):
        # A tf.function's graph with its captured variables made variables.
        return functions.graph_def(graph, variable_devices)
    if isinstance(graph, graph_pb2.GraphDef):
        copy = graph_pb2.GraphDef()
        copy.CopyFrom(graph)
        return copy
    raise TypeError(f"expected a tf.Graph or GraphDef, got {type(graph)!r}")


def place_on_gpu(graph: _GraphLike, gpu: str = "/device:GPU:0",
                 cpu: str = "/cpu:0",
                 host: Optional[str] = None) -> graph_pb2.GraphDef:
    """Returns a copy of ``graph`` with every non-CPU op placed on the GPU.

    Ops pinned to a CPU (for example LMS swap ops on ``/cpu:0``) are kept on
    the CPU, with their device rewritten to ``cpu``; every other op, placed or
    not, gets ``gpu``. The virtual cluster would put unplaced ops on the GPU
    anyway, but explicit devices make the measured placement unambiguous.

    With ``host`` (LMS's ``cpu_device``), the rule is LMS's own
    (`tflms.target.Target.manages`): the ops on ``host`` go to ``cpu`` and
    every other op to ``gpu``, a logical ``/cpu:1`` that stands for the GPU
    included; and the variables a function graph captures are placed on
    their own devices first (`functions.graph_def`), so that a Keras 3
    optimizer's slots moved to ``host`` are measured in host memory and
    the weights on the GPU.

    Args:
      graph: a ``tf.Graph`` or ``GraphDef``; it is not modified.
      gpu: device string for compute ops.
      cpu: device string for CPU-pinned ops.
      host: the one device that is the host, or None for every CPU.

    Returns:
      A new ``GraphDef``.
    """
    graph_def = _as_graph_def(graph, variable_devices=host is not None)
    for node in graph_def.node:
        on_host = (_is_cpu_device(node.device) if host is None
                   else devices.same_device(node.device, host))
        node.device = cpu if on_host else gpu
    return graph_def


def _cluster(gpu_props, cpu_props, gpu_device, cpu_device):
    gpu = device_properties_pb2.NamedDevice(name=gpu_device)
    gpu.properties.CopyFrom(gpu_props)
    cpu = device_properties_pb2.NamedDevice(name=cpu_device)
    cpu.properties.CopyFrom(cpu_props)
    return gcluster.Cluster(devices=[gpu, cpu], disable_timeline=False,
                            disable_detailed_stats=False)


def _with_memory(props, memory_bytes):
    copy = device_properties_pb2.DeviceProperties()
    copy.CopyFrom(props)
    copy.memory_size = memory_bytes
    return copy


def _sanitized(device: str) -> str:
    return device.replace(":", "_")


def _recv_name(source: str, port, gpu_device: str) -> str:
    """The virtual scheduler's _Recv node that copies ``source:port`` onto
    `gpu_device`; its output 0 is the GPU copy."""
    return f"Recv_{source}_{port}_on_{_sanitized(gpu_device)}"
