"""The GPUs and CPU-GPU links LMS can time and plan for, with their
published peak rates and sources.

Standard library only: `tflms.settings` lists these names in its checks and
``--help`` without loading TensorFlow. `tflms.steptime` times steps with
them; the auto-tuner counts copy durations at `Settings.interconnect`;
`tflms.tf.oracle.gpu_properties` describes a GPU's chip to Grappler's cost
model. The tables of them in docs/performance.md and the names in
docs/plan.md are made from them (``python tools/docs_tables.py``).
"""

import dataclasses
import math
from typing import Optional

__all__ = [
    "Gpu",
    "Interconnect",
    "PRECISIONS",
    "GPUS",
    "INTERCONNECTS",
    "INSTANT",
    "LINKS",
    "DEFAULT_GPU",
    "DEFAULT_INTERCONNECT",
    "gpu_named",
    "interconnect_named",
    "HostUpdateRate",
    "HOST_UPDATE_RATE",
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
      bf16_flops: bfloat16 tensor-core FLOP/s (dense), or None for a GPU
        without bfloat16 tensor cores (V100: its bfloat16 products run on
        the CUDA cores, at `fp32_flops` at best).

    The seven from `sms` on describe the chip to Grappler's analytical cost
    model (`tflms.tf.oracle.gpu_properties`); the step-time model uses the
    rates above. A `Gpu` made without them is fine for timing steps but cannot
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
    bf16_flops: Optional[float] = None

    def peak_flops(self, precision):
        """The dense FLOP/s of matrix products in `precision` (one of
        `PRECISIONS`): ``"fp32"`` the CUDA cores, ``"tf32"``
        `tensor_flops` (the CUDA cores' rate on a GPU without TF32),
        ``"fp16"`` `half_flops`, ``"bf16"`` `bf16_flops` (the CUDA cores'
        rate without bfloat16 tensor cores).

        Raises:
          ValueError: for another precision.
        """
        if precision == "fp32":
            return self.fp32_flops
        if precision == "tf32":
            return self.tensor_flops
        if precision == "fp16":
            return self.half_flops
        if precision == "bf16":
            return (self.fp32_flops if self.bf16_flops is None
                    else self.bf16_flops)
        raise ValueError("precision must be one of %s; got %r"
                         % (", ".join(PRECISIONS), precision))


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """A CPU-GPU link.

    Attributes:
      name: the key in `INTERCONNECTS`.
      label: how tables show it.
      bytes_per_s: the link's peak data rate per direction, as its
        specification gives it (links are full duplex: swap-outs and
        swap-ins run at once, each in its own direction).
      source: where the numbers come from.
      h2d_bytes_per_s: the rate copies from the host to the device
        (swap-ins) get; default `bytes_per_s`.
      d2h_bytes_per_s: the rate copies from the device to the host
        (swap-outs) get; default `bytes_per_s`. The two differ where
        copies were measured to run at different rates each way (Grace
        Hopper's NVLink-C2C).
    """

    name: str
    label: str
    bytes_per_s: float
    source: str
    h2d_bytes_per_s: Optional[float] = None
    d2h_bytes_per_s: Optional[float] = None

    def __post_init__(self):
        for field in ("h2d_bytes_per_s", "d2h_bytes_per_s"):
            if getattr(self, field) is None:
                object.__setattr__(self, field, self.bytes_per_s)


# The precisions of matrix products (`Gpu.peak_flops`): float32 on the CUDA
# cores, TF32, float16 and bfloat16 on the tensor cores.
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")

_T = 1e12
_G = 1e9
_GIB = 1 << 30
_V100_SOURCE = ("NVIDIA Tesla V100 GPU Accelerator datasheet (SXM2: FP32 "
                "15.7 TFLOPS, tensor 125 TFLOPS, HBM2 900 GB/s), "
                "https://images.nvidia.com/content/technologies/volta/pdf/"
                "tesla-volta-v100-datasheet-letter-fnl-web.pdf")
_A100_SOURCE = ("NVIDIA A100 Tensor Core GPU datasheet (SXM: FP32 19.5 "
                "TFLOPS, TF32 156 TFLOPS, FP16 and BF16 312 TFLOPS dense; "
                "40 GB HBM2 1,555 GB/s, 80 GB HBM2e 2,039 GB/s), "
                "https://www.nvidia.com/content/dam/en-zz/Solutions/"
                "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-"
                "1758950-r4-web.pdf")
_H100_SOURCE = ("NVIDIA H100 Tensor Core GPU datasheet (SXM: FP32 67 "
                "TFLOPS; TF32 989, FP16 and BF16 1,979 TFLOPS with sparsity, "
                "half that dense; HBM3 3.35 TB/s, 80 GB), "
                "https://resources.nvidia.com/en-us-tensor-core/"
                "nvidia-tensor-core-gpu-datasheet")
# Read in hpctech's copy of the datasheet's table,
# https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html, and
# NVIDIA's H100 PCIe product brief (PB-11133-001_v02: 350 W, "greater than
# 2,000 gigabytes per second").
_H100_PCIE_SOURCE = ("NVIDIA H100 Tensor Core GPU datasheet (PCIe: FP32 51 "
                     "TFLOPS; TF32 756, FP16 and BF16 1,513 TFLOPS with "
                     "sparsity, half that dense; HBM2e 2,000 GB/s, 80 GB), "
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
# H100 PCIe: 114 SMs (the datasheet's table); 1755 MHz is the clock its
# 51 TFLOPS FP32 implies.
_HOPPER_PCIE_SOURCE = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper "
                       "(L2 50 MB, compute capability 9.0, shared memory "
                       "configurable up to 228 KB per SM), "
                       "https://resources.nvidia.com/en-us-tensor-core/"
                       "gtc22-whitepaper-hopper; H100 PCIe: 114 SMs (the "
                       "datasheet), boost clock 1755 MHz: the datasheet's "
                       "51 TFLOPS FP32 is 114 SMs x 128 FP32 lanes x 2 FLOP "
                       "x 1.755 GHz")

_VOLTA = dict(sms=80, boost_clock_mhz=1530, compute_capability="7.0",
              l2_bytes=6 * _MIB, shared_memory_per_sm=96 * _KIB,
              architecture_source=_VOLTA_SOURCE)
_AMPERE = dict(sms=108, boost_clock_mhz=1410, compute_capability="8.0",
               l2_bytes=40 * _MIB, shared_memory_per_sm=164 * _KIB,
               architecture_source=_AMPERE_SOURCE)
_HOPPER = dict(sms=132, boost_clock_mhz=1980, compute_capability="9.0",
               l2_bytes=50 * _MIB, shared_memory_per_sm=228 * _KIB,
               architecture_source=_HOPPER_SOURCE)
_HOPPER_PCIE = dict(sms=114, boost_clock_mhz=1755, compute_capability="9.0",
                    l2_bytes=50 * _MIB, shared_memory_per_sm=228 * _KIB,
                    architecture_source=_HOPPER_PCIE_SOURCE)

GPUS = {g.name: g for g in (
    Gpu("V100-SXM2-16GB", 15.7 * _T, 15.7 * _T, 125 * _T, 900 * _G,
        16 * _GIB, _V100_SOURCE, device_name="Tesla V100-SXM2-16GB",
        **_VOLTA),
    Gpu("V100-SXM2-32GB", 15.7 * _T, 15.7 * _T, 125 * _T, 900 * _G,
        32 * _GIB, _V100_SOURCE, device_name="Tesla V100-SXM2-32GB",
        **_VOLTA),
    Gpu("A100-SXM4-40GB", 19.5 * _T, 156 * _T, 312 * _T, 1555 * _G,
        40 * _GIB, _A100_SOURCE, device_name="NVIDIA A100-SXM4-40GB",
        bf16_flops=312 * _T, **_AMPERE),
    Gpu("A100-SXM4-80GB", 19.5 * _T, 156 * _T, 312 * _T, 2039 * _G,
        80 * _GIB, _A100_SOURCE, device_name="NVIDIA A100-SXM4-80GB",
        bf16_flops=312 * _T, **_AMPERE),
    Gpu("H100-SXM5-80GB", 67 * _T, 494.5 * _T, 989.5 * _T, 3350 * _G,
        80 * _GIB, _H100_SOURCE, device_name="NVIDIA H100 80GB HBM3",
        bf16_flops=989.5 * _T, **_HOPPER),
    Gpu("H100-PCIe-80GB", 51 * _T, 378 * _T, 756.5 * _T, 2000 * _G,
        80 * _GIB, _H100_PCIE_SOURCE, device_name="NVIDIA H100 PCIe",
        bf16_flops=756.5 * _T, **_HOPPER_PCIE),
)}


def _pcie_source(version, gigatransfers, per_direction):
    return ("PCI-SIG PCI Express Base Specification %s: %d GT/s per lane, "
            "128b/130b encoding; x16 carries %s GB/s per direction"
            % (version, gigatransfers, per_direction))


INTERCONNECTS = {i.name: i for i in (
    Interconnect("pcie3", "PCIe 3.0 x16", 15.75 * _G,
                 _pcie_source("3.0", 8, "15.75")),
    Interconnect("pcie4", "PCIe 4.0 x16", 31.5 * _G,
                 _pcie_source("4.0", 16, "31.5")),
    Interconnect("pcie5", "PCIe 5.0 x16", 63.0 * _G,
                 _pcie_source("5.0", 32, "63.0")),
    Interconnect(
        "nvlink2", "NVLink 2.0 (POWER9-V100, 3 bricks)", 75.0 * _G,
        "NVIDIA Tesla V100 datasheet (NVLink 2.0: 25 GB/s per brick per "
        "direction) and IBM Power System AC922 (8335-GTH) technical "
        "overview, IBM Redpaper REDP-5472 (3 bricks between a POWER9 and "
        "each V100 in the 4-GPU model: 75 GB/s per direction)"),
    # Grace Hopper's copies run at different rates each way, far below
    # the link's 450 GB/s from the device to the host: NVIDIA's
    # nvbandwidth on 4 x GH200 measured copy-engine copies CPU -> GPU at
    # 411.6-421.1 GB/s and GPU -> CPU at 169.9-170.1 GB/s per GPU.
    Interconnect(
        "nvlink-c2c", "NVLink-C2C (Grace Hopper)", 450.0 * _G,
        "NVIDIA GH200 Grace Hopper Superchip datasheet (NVLink-C2C 900 "
        "GB/s bidirectional, 450 GB/s per direction); copies measured "
        "with nvbandwidth on 4 x GH200 at 411.6-421.1 GB/s host to device "
        "(416 used) and 169.9-170.1 GB/s device to host (170 used), "
        "NVIDIA/Megatron-LM issue 6491, "
        "https://github.com/NVIDIA/Megatron-LM/issues/6491",
        h2d_bytes_per_s=416.0 * _G, d2h_bytes_per_s=170.0 * _G),
)}

# Not a link: copies that take no time. Planning with it counts memory as
# if every copy finished at once (the simulator without copy times); the
# step-time model then shows no transfer time at all.
INSTANT = Interconnect(
    "instant", "instant copies", math.inf,
    "none: a planning assumption (copies take no time), not hardware")

# (label, GB/s per direction), for tables that list every link.
LINKS = tuple((i.label, i.bytes_per_s / _G) for i in INTERCONNECTS.values())

@dataclasses.dataclass(frozen=True)
class HostUpdateRate:
    """How fast the host runs an optimizer's fused updates
    (``offload_optimizer``; `tflms.steptime` times each offloaded update
    on the host with it).

    An update is element-wise and memory-bound: it takes `overhead_s`
    plus the bytes of the weights, slots and gradient it reads and writes
    (the device's `OpCosts.bytes_touched` of the same kernel) at
    `bytes_per_s`.

    Attributes:
      bytes_per_s: bytes touched per second.
      overhead_s: seconds per update beyond its bytes (the executor's
        bookkeeping of the host's ops).
      source: where the numbers come from.
    """

    bytes_per_s: float
    overhead_s: float
    source: str


# Measured, not published: a CPU's rate grows with its cores and memory
# channels, so on a server these are conservative figures.
HOST_UPDATE_RATE = HostUpdateRate(
    bytes_per_s=11.0 * _G, overhead_s=6.3e-6,
    source="measured with TensorFlow 2.15 on 2 cores of an AMD EPYC, "
    "oneDNN off, best of 10 and 30 runs: ResourceApplyAdam on 16 Mi "
    "float32 parameters (weights, two moments and the gradient, 28 bytes "
    "a parameter) in 0.043 s, 11.0 GB/s; 200 of them on 16-element "
    "variables in one Session step, 6.3 us each beyond an empty step")

# V100: the GPU the original TFLMSv2 targeted (POWER9 AC922) and the
# virtual cluster's (`tflms.tf.oracle.gpu_properties`); PCIe 4.0: today's
# common host link between a server's CPU and its GPUs.
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
