"""The GPUs and CPU-GPU links LMS can time and plan for, with their
published peak rates and sources.

Standard library only: `tflms.settings` lists these names in its checks and
``--help`` without loading TensorFlow. `tflms.steptime` times steps with
them; the auto-tuner counts copy durations at `Settings.interconnect`.
"""

import dataclasses
import math
from typing import Optional

__all__ = [
    "Gpu",
    "Interconnect",
    "GPUS",
    "INTERCONNECTS",
    "INSTANT",
    "LINKS",
    "DEFAULT_GPU",
    "DEFAULT_INTERCONNECT",
    "gpu_named",
    "interconnect_named",
]


@dataclasses.dataclass(frozen=True)
class Gpu:
    """A GPU's published peak rates.

    Attributes:
      name: the key in `GPUS`.
      fp32_flops: FP32 FLOP/s on the CUDA cores.
      tensor_flops: FLOP/s the matrix products and convolutions of a
        float32 graph get: TF32 on the tensor cores of A100 and H100
        (TensorFlow runs float32 matmuls and convolutions in TF32 there by
        default since 2.4, ``tf.config.experimental.
        enable_tensor_float_32_execution``), FP32 on V100 (whose tensor
        cores take FP16 inputs only). Dense rates, not the "with sparsity"
        ones.
      half_flops: FP16 tensor-core FLOP/s (dense), for 2-byte outputs
        (mixed precision).
      memory_bandwidth: HBM bytes/s.
      memory_bytes: device memory.
      source: where the numbers come from.
      sms: streaming multiprocessors.
      boost_clock_mhz: the GPU boost clock, MHz.
      compute_capability: CUDA's ``"major.minor"``.
      l2_bytes: L2 cache bytes.
      shared_memory_per_sm: the most shared memory one SM can configure,
        bytes.
      device_name: the name CUDA reports for it (``cudaDeviceProp.name``,
        what ``nvidia-smi`` shows).
      architecture_source: where the SMs, clock, compute capability, L2
        and shared memory come from.

    The last seven describe the chip to Grappler's analytical cost model
    (`tflms.oracle.gpu_properties`); the step-time model uses the rates
    above. A `Gpu` made without them is fine for timing steps but cannot
    be the oracle's GPU.
    """

    name: str
    fp32_flops: float
    tensor_flops: float
    half_flops: float
    memory_bandwidth: float
    memory_bytes: int
    source: str
    sms: Optional[int] = None
    boost_clock_mhz: Optional[int] = None
    compute_capability: Optional[str] = None
    l2_bytes: Optional[int] = None
    shared_memory_per_sm: Optional[int] = None
    device_name: Optional[str] = None
    architecture_source: str = ""


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """A CPU-GPU link.

    Attributes:
      name: the key in `INTERCONNECTS`.
      label: how tables show it.
      bytes_per_s: peak data rate in each direction (links are full duplex,
        so swap-outs and swap-ins each get this much).
      source: where the number comes from.
    """

    name: str
    label: str
    bytes_per_s: float
    source: str


_T = 1e12
_G = 1e9
_GIB = 1 << 30
_V100_SOURCE = ("NVIDIA Tesla V100 GPU Accelerator datasheet (SXM2: FP32 "
                "15.7 TFLOPS, tensor 125 TFLOPS, HBM2 900 GB/s), "
                "https://images.nvidia.com/content/technologies/volta/pdf/"
                "tesla-volta-v100-datasheet-letter-fnl-web.pdf")
_A100_SOURCE = ("NVIDIA A100 Tensor Core GPU datasheet (SXM: FP32 19.5 "
                "TFLOPS, TF32 156 TFLOPS, FP16 312 TFLOPS dense; 40 GB "
                "HBM2 1,555 GB/s, 80 GB HBM2e 2,039 GB/s), "
                "https://www.nvidia.com/content/dam/en-zz/Solutions/"
                "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-"
                "1758950-r4-web.pdf")
_H100_SOURCE = ("NVIDIA H100 Tensor Core GPU datasheet (SXM: FP32 67 "
                "TFLOPS; TF32 989 and FP16 1,979 TFLOPS with sparsity, half "
                "that dense; HBM3 3.35 TB/s, 80 GB), "
                "https://resources.nvidia.com/en-us-tensor-core/"
                "nvidia-tensor-core-gpu-datasheet")

_KIB = 1 << 10
_MIB = 1 << 20
_VOLTA_SOURCE = ("NVIDIA Tesla V100 GPU Architecture whitepaper "
                 "(WP-08608-001_v1.1; Tesla V100 SXM2: 80 SMs, GPU boost "
                 "clock 1530 MHz, L2 6144 KB, compute capability 7.0, "
                 "shared memory configurable up to 96 KB per SM), "
                 "https://images.nvidia.com/content/volta-architecture/pdf/"
                 "volta-architecture-whitepaper.pdf")
_AMPERE_SOURCE = ("NVIDIA A100 Tensor Core GPU Architecture whitepaper "
                  "(V1.0; A100 SXM4: 108 SMs, GPU boost clock 1410 MHz, L2 "
                  "40960 KB, compute capability 8.0, shared memory "
                  "configurable up to 164 KB per SM), "
                  "https://images.nvidia.com/aem-dam/en-zz/Solutions/"
                  "data-center/nvidia-ampere-architecture-whitepaper.pdf")
# The Hopper whitepaper left the boost clock "not finalized"; 1980 MHz is
# the clock the datasheet's 67 TFLOPS FP32 implies, and what H100 SXM5
# boards report as their maximum.
_HOPPER_SOURCE = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper "
                  "(H100 SXM5: 132 SMs, L2 50 MB, compute capability 9.0, "
                  "shared memory configurable up to 228 KB per SM), "
                  "https://resources.nvidia.com/en-us-tensor-core/"
                  "gtc22-whitepaper-hopper; boost clock 1980 MHz: the "
                  "datasheet's 67 TFLOPS FP32 is 132 SMs x 128 FP32 lanes "
                  "x 2 FLOP x 1.98 GHz")

_VOLTA = dict(sms=80, boost_clock_mhz=1530, compute_capability="7.0",
              l2_bytes=6 * _MIB, shared_memory_per_sm=96 * _KIB,
              architecture_source=_VOLTA_SOURCE)
_AMPERE = dict(sms=108, boost_clock_mhz=1410, compute_capability="8.0",
               l2_bytes=40 * _MIB, shared_memory_per_sm=164 * _KIB,
               architecture_source=_AMPERE_SOURCE)
_HOPPER = dict(sms=132, boost_clock_mhz=1980, compute_capability="9.0",
               l2_bytes=50 * _MIB, shared_memory_per_sm=228 * _KIB,
               architecture_source=_HOPPER_SOURCE)

GPUS = {g.name: g for g in (
    Gpu("V100-SXM2-16GB", 15.7 * _T, 15.7 * _T, 125 * _T, 900 * _G,
        16 * _GIB, _V100_SOURCE, device_name="Tesla V100-SXM2-16GB",
        **_VOLTA),
    Gpu("V100-SXM2-32GB", 15.7 * _T, 15.7 * _T, 125 * _T, 900 * _G,
        32 * _GIB, _V100_SOURCE, device_name="Tesla V100-SXM2-32GB",
        **_VOLTA),
    Gpu("A100-SXM4-40GB", 19.5 * _T, 156 * _T, 312 * _T, 1555 * _G,
        40 * _GIB, _A100_SOURCE, device_name="NVIDIA A100-SXM4-40GB",
        **_AMPERE),
    Gpu("A100-SXM4-80GB", 19.5 * _T, 156 * _T, 312 * _T, 2039 * _G,
        80 * _GIB, _A100_SOURCE, device_name="NVIDIA A100-SXM4-80GB",
        **_AMPERE),
    Gpu("H100-SXM5-80GB", 67 * _T, 494.5 * _T, 989.5 * _T, 3350 * _G,
        80 * _GIB, _H100_SOURCE, device_name="NVIDIA H100 80GB HBM3",
        **_HOPPER),
)}

_PCIE_SOURCE = ("PCI-SIG PCI Express Base Specifications 3.0/4.0/5.0: 8, 16 "
                "and 32 GT/s per lane with 128b/130b encoding; x16 carries "
                "15.75, 31.5 and 63.0 GB/s per direction")
INTERCONNECTS = {i.name: i for i in (
    Interconnect("pcie3", "PCIe 3.0 x16", 15.75 * _G, _PCIE_SOURCE),
    Interconnect("pcie4", "PCIe 4.0 x16", 31.5 * _G, _PCIE_SOURCE),
    Interconnect("pcie5", "PCIe 5.0 x16", 63.0 * _G, _PCIE_SOURCE),
    Interconnect(
        "nvlink2", "NVLink 2.0 (POWER9-V100, 3 bricks)", 75.0 * _G,
        "NVIDIA Tesla V100 datasheet (NVLink 2.0: 25 GB/s per brick per "
        "direction) and IBM Power System AC922 (8335-GTH) technical "
        "overview, IBM Redpaper REDP-5472 (3 bricks between a POWER9 and "
        "each V100 in the 4-GPU model: 75 GB/s per direction)"),
    Interconnect(
        "nvlink-c2c", "NVLink-C2C (Grace Hopper)", 450.0 * _G,
        "NVIDIA GH200 Grace Hopper Superchip datasheet (NVLink-C2C 900 "
        "GB/s bidirectional, 450 GB/s per direction)"),
)}

# Not a link: copies that take no time. Planning with it counts memory as
# if every copy finished at once (the simulator without copy times); the
# step-time model then shows no transfer time at all.
INSTANT = Interconnect(
    "instant", "instant copies", math.inf,
    "none: a planning assumption (copies take no time), not hardware")

# (label, GB/s per direction), for tables that list every link.
LINKS = tuple((i.label, i.bytes_per_s / _G) for i in INTERCONNECTS.values())

# V100: the GPU the original TFLMSv2 targeted (POWER9 AC922) and the
# virtual cluster's (`tflms.oracle.gpu_properties`); PCIe 4.0: today's
# common host link (issue 15 states it as the default).
DEFAULT_GPU = "V100-SXM2-16GB"
DEFAULT_INTERCONNECT = "pcie4"


def gpu_named(name):
    """The `Gpu` called `name` (a key of `GPUS`), or `name` if it is one.

    Raises:
      ValueError: naming the known GPUs.
    """
    if isinstance(name, Gpu):
        return name
    found = GPUS.get(name)
    if found is None:
        raise ValueError("gpu %r is not known; use one of %s"
                         % (name, ", ".join(GPUS)))
    return found


def interconnect_named(name):
    """The `Interconnect` called `name` (a key of `INTERCONNECTS`, or
    ``"instant"`` for `INSTANT`), or `name` if it is one.

    Raises:
      ValueError: naming the known links.
    """
    if isinstance(name, Interconnect):
        return name
    found = INSTANT if name == INSTANT.name else INTERCONNECTS.get(name)
    if found is None:
        raise ValueError("interconnect %r is not known; use one of %s, or "
                         "%r for copies that take no time"
                         % (name, ", ".join(INTERCONNECTS), INSTANT.name))
    return found
