"""What each op of a graph costs on one GPU: `OpCosts` (the seconds of its
kernel from its flops and the bytes it moves, at the rates `Efficiency`
says a kernel reaches) and `KernelOptions` (how the kernels run: launch
overhead, precisions, XLA fusion, memory layout). `StepTimeModel` replays
a step over these costs (docs: the `tflms.steptime` package)."""

import dataclasses
from typing import Optional

import numpy as np

from tflms import graph_index as gi
from tflms.initializers import initializer_only_ops
from tflms.hardware import DEFAULT_GPU, GPUS, gpu_named
from tflms.step import APPLY_PREFIXES, ASSIGN_TYPES
from tflms.steptime.rates import (ACHIEVED, CONVOLUTION_TYPES,
                                  ELEMENTWISE_TYPES, LAUNCH_OVERHEAD_S,
                                  NO_KERNEL_TYPES, PEAK, REDUCTION_TYPES,
                                  Efficiency)

__all__ = ["KernelOptions", "OpCosts"]


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """How the step's kernels run, for `OpCosts` and `StepTimeModel`.

    Attributes:
      launch_overhead_s: seconds added to every op that runs a kernel.
      efficiency: the `Efficiency` kernels reach. Default (None): `ACHIEVED`
        (the fractions fitted to published runs) for the GPUs of `GPUS`,
        whose datasheet peaks they derate; `PEAK` for a `Gpu` made
        elsewhere, whose rates are taken as given. `PEAK` for the
        datasheets' roofline.
      tf32: whether products with 4-byte outputs run in TF32 on GPUs that
        have it (TensorFlow's default on Ampere and later,
        ``tf.config.experimental.enable_tensor_float_32_execution``); False:
        in FP32 on the CUDA cores.
      half: the precision of products with 2-byte outputs: ``"fp16"``
        (float16, the default) or ``"bf16"`` (bfloat16); the index records
        sizes, not types.
      fusion: whether an elementwise op whose output only elementwise ops
        and reductions on the device read runs inside their kernels, as
        XLA fuses it (`OpCosts.fused`). Default False: TensorFlow without
        XLA (a Session, a tf.function without ``jit_compile``) runs every
        op as a kernel of its own. The published runs `ACHIEVED` is fitted
        to ran with XLA, and benchmarks/step_time.py times them with
        fusion (and PyTorch's eager ResNet50 runs, held out, without).
      layout: the memory layout of the 4-D (and 5-D) tensors the graph's
        convolutions read and write when the step runs: ``"NHWC"``
        (channels last, the default: TensorFlow's layout, and the one
        XLA's layout assignment gives float16 convolutions) or ``"NCHW"``
        (channels first, PyTorch's default memory format). The index
        records shapes, not layouts. cuDNN runs tensor-core convolutions
        (2-byte, and TF32) in NHWC and transposes NCHW tensors into and
        out of it around each one (`OpCosts.transposed_bytes`); in NHWC,
        and in FP32 on the CUDA cores, it transposes nothing.

    Raises:
      ValueError: a negative overhead, a `half` that is not a 2-byte
        precision, or an unknown `layout`.
    """

    launch_overhead_s: float = LAUNCH_OVERHEAD_S
    efficiency: Optional[Efficiency] = None
    tf32: bool = True
    half: str = "fp16"
    fusion: bool = False
    layout: str = "NHWC"

    def __post_init__(self):
        if not self.launch_overhead_s >= 0:
            raise ValueError("launch_overhead_s must be >= 0 seconds; got "
                             "%r" % (self.launch_overhead_s,))
        if self.half not in ("fp16", "bf16"):
            raise ValueError("half must be 'fp16' or 'bf16' (the precision "
                             "of 2-byte products); got %r" % (self.half,))
        if self.layout not in ("NHWC", "NCHW"):
            raise ValueError("layout must be 'NHWC' or 'NCHW' (the layout "
                             "of the convolutions' tensors); got %r"
                             % (self.layout,))


class OpCosts:
    """The seconds each op of a graph takes on one GPU.

    Args:
      index: a `GraphIndex` (the planning index, with its serialization
        edges, when timing a `pipeline.Planned`).
      roles: its `OpRoles` (which ops are on the device, which do not run).
      batch_size: the first unknown dimension of every shape, or None.
      gpu: a `Gpu` or a key of `GPUS`.
      kernels: the `KernelOptions`; default: ``KernelOptions()``.

    Attributes:
      runs: per op, whether it runs in the step (numpy bools).
      fused: the tensors that stay inside fused kernels (`fusion`).
      op_seconds: per op, its kernel's seconds (0 for ops that do not run
        or run no kernel).

    Raises:
      ValueError: an unknown GPU.
    """

    def __init__(self, index, roles, batch_size=None, gpu=DEFAULT_GPU,
                 kernels=None):
        kernels = KernelOptions() if kernels is None else kernels
        self.kernels = kernels
        self.layout = kernels.layout
        self.gpu = gpu_named(gpu)
        efficiency = kernels.efficiency
        if efficiency is None:
            published = GPUS.get(self.gpu.name) is self.gpu
            efficiency = ACHIEVED if published else PEAK
        self.efficiency = efficiency
        self.tf32 = bool(kernels.tf32)
        self.half = kernels.half
        self.fusion = bool(kernels.fusion)
        self.index = index
        self.roles = roles
        self.batch_size = batch_size
        self.launch_overhead_s = kernels.launch_overhead_s
        inactive = roles.inactive | initializer_only_ops(index)
        self.runs = np.asarray([i not in inactive
                                for i in range(index.num_ops)], dtype=bool)
        self.fused = self._fused_tensors() if self.fusion else frozenset()
        self.op_seconds = np.asarray(
            [self._op_seconds(i) if self.runs[i] else 0.0
             for i in range(index.num_ops)], dtype=np.float64)

    def _bytes(self, op_id, output):
        return gi.tensor_bytes(self.index, op_id, output,
                               self.batch_size) or 0

    def _fused_tensors(self):
        """The tensors ``(producer, output)`` that stay inside fused
        kernels: the only output of a running elementwise op on the device
        whose consumers are all running elementwise ops or reductions on
        the device. (XLA fuses an elementwise op into each of its
        consumers, computing it again in each; the inputs it reads are
        counted once, as its own.)"""
        index = self.index
        device = self.roles.device_ops
        runs = self.runs
        fusible = ELEMENTWISE_TYPES | REDUCTION_TYPES
        fused = set()
        for p in range(index.num_ops):
            if (index.types[p] not in ELEMENTWISE_TYPES or p not in device
                    or not runs[p] or len(index.consumers[p]) != 1
                    or not index.consumers[p][0]):
                continue
            if all(runs[c] and c in device and index.types[c] in fusible
                   for c, _ in index.consumers[p][0]):
                fused.add((p, 0))
        return frozenset(fused)

    def bytes_touched(self, op_id):
        """Bytes of an op's input and output tensors that go through device
        memory (unknown sizes: 0; tensors in `fused`: 0), and the variables
        an update writes (`state_bytes`)."""
        index = self.index
        fused = self.fused
        total = sum(self._bytes(p, k) for p, k in index.inputs[op_id]
                    if (p, k) not in fused)
        return total + self.state_bytes(op_id) + sum(
            self._bytes(op_id, k)
            for k in range(len(index.output_shapes[op_id]))
            if (op_id, k) not in fused)

    def state_bytes(self, op_id):
        """Bytes of variables an update op reads and writes in place, which
        its tensors do not show: a resource input is a handle (0 bytes),
        but the kernel reads and writes the variable behind it. An
        optimizer's update (`step.APPLY_PREFIXES`: ``ResourceApplyAdam``
        reads and writes the variable and its two slots) moves, per
        resource input, the bytes of its largest other input (the
        gradient, or for a sparse update its rows) twice; an assignment
        (`step.ASSIGN_TYPES`) writes its value into the variable, and one
        that adds or subtracts reads the variable too. 0 for other ops."""
        index = self.index
        kind = index.types[op_id]
        if not (kind.startswith(APPLY_PREFIXES) or kind in ASSIGN_TYPES):
            return 0
        sizes = index.output_itemsizes
        handles = sum(1 for p, k in index.inputs[op_id] if sizes[p][k] == 0)
        if not handles:
            return 0  # reference variables: their tensors are counted
        value = max([self._bytes(p, k) for p, k in index.inputs[op_id]
                     if sizes[p][k] != 0] or [0])
        if kind.startswith(APPLY_PREFIXES):
            return 2 * handles * value
        return value * (1 if kind == "AssignVariableOp" else 2)

    def transposed_tensors(self, op_id):
        """The bytes of each tensor the layout has transposed around a
        convolution (`transposed_bytes`), one entry per transpose kernel;
        empty for other ops, NHWC and FP32 products."""
        if (self.layout != "NCHW"
                or self.index.types[op_id] not in CONVOLUTION_TYPES
                or self.precision(op_id) == "fp32"):
            return []
        index = self.index
        tensors = list(index.inputs[op_id]) + [
            (op_id, k) for k in range(len(index.output_shapes[op_id]))]
        # Rank 4 or 5: the activations, their gradients and the filter;
        # not the shape vectors the backprop ops take.
        return [self._bytes(p, k) for p, k in tensors
                if index.output_shapes[p][k] is not None
                and len(index.output_shapes[p][k]) >= 4]

    def transposed_bytes(self, op_id):
        """Bytes the layout transposes around a convolution move: with
        ``layout="NCHW"``, a convolution whose products run on tensor
        cores (2-byte or TF32: cuDNN runs it in NHWC) has each of its 4-D
        or 5-D input and output tensors transposed by a kernel of its own,
        which reads it and writes it once (inputs into NHWC before, outputs
        back to NCHW after): twice the tensor's bytes, memory-bound. The
        cuDNN Developer Guide (Legacy API, "Data and Filter Formats")
        says it may reach tensor-core convolutions through NCHW-to-NHWC
        transformations; channels-last exists in PyTorch to avoid them.
        0 for other ops, for NHWC, and for FP32 products (the CUDA
        cores'). With these transposes and the TF32 convolution fraction
        refitted, the model follows the published TF32 runs in NCHW
        (PyTorch's default; XLA's layout for float32 convolutions in
        TensorFlow 1.15); benchmarks/step_time.py says how closely."""
        return 2 * sum(self.transposed_tensors(op_id))

    def precision(self, op_id):
        """The precision of an op's products (one of `PRECISIONS`): 2-byte
        outputs `half`; others TF32 (with `tf32`, on a GPU whose
        `Gpu.tensor_flops` exceed its FP32 rate) or FP32."""
        sizes = self.index.output_itemsizes[op_id]
        if sizes and sizes[0] == 2:
            return self.half
        if self.tf32 and self.gpu.tensor_flops > self.gpu.fp32_flops:
            return "tf32"
        return "fp32"

    def peak_flops(self, op_id):
        """The published peak FLOP/s of an op's products in its
        `precision`."""
        return self.gpu.peak_flops(self.precision(op_id))

    def achieved_flops(self, op_id):
        """`peak_flops` times the `efficiency` of its precision (a
        convolution's or a matrix product's)."""
        precision = self.precision(op_id)
        return self.gpu.peak_flops(precision) * self.efficiency.of(
            precision, self.index.types[op_id] in CONVOLUTION_TYPES)

    @property
    def achieved_bandwidth(self):
        """The HBM bytes/s memory-bound work gets (peak x efficiency)."""
        return self.gpu.memory_bandwidth * self.efficiency.memory

    def _op_seconds(self, op_id):
        if op_id not in self.roles.device_ops:
            return 0.0
        return self.kernel_seconds(op_id)

    def kernel_seconds(self, op_id):
        """Seconds of the op's kernel on the GPU, wherever the op is
        placed (an update ``offload_optimizer`` moved to the host: what
        it takes on the device without LMS); 0 for ops that run no
        kernel."""
        index = self.index
        if index.types[op_id] in NO_KERNEL_TYPES:
            return 0.0
        flops = gi.op_flops(index, op_id, self.batch_size) or 0
        work = max(flops / self.achieved_flops(op_id),
                   self.bytes_touched(op_id) / self.achieved_bandwidth)
        if (op_id, 0) in self.fused:
            return work  # in its consumer's kernel: no launch of its own
        # Layout transposes: kernels of their own before and after the
        # convolution's, each memory-bound and launched.
        transposes = self.transposed_tensors(op_id)
        if transposes:
            work += 2 * sum(transposes) / self.achieved_bandwidth
        return work + self.launch_overhead_s * (1 + len(transposes))
