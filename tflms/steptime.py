"""How long one training step takes on a named GPU, with and without a plan.

Pure: takes a `GraphIndex`, `OpRoles`, a batch size and a `planner.Plan`,
imports no TensorFlow. The memory simulator says whether a plan fits; this
model says what it costs in time.

The model
---------

* **Compute.** Ops run one at a time on the GPU's compute stream, in the
  order of the simulator's levels (level by level, a level's ops back to
  back in op-id order). An op takes a roofline estimate
  ``max(flops / achieved_flops, bytes_touched / achieved_bandwidth)`` plus
  `LAUNCH_OVERHEAD_S`. FLOPs are the index's (`GraphIndex.flops`:
  matrix products and convolutions and their gradients; every other op
  counts as memory-bound); bytes touched are the op's input and output
  tensors (`graph_index.tensor_bytes`) that go through device memory.
  The achieved rates are the GPU's peaks times an `Efficiency`
  (`ACHIEVED`: fractions fitted to published training throughput,
  benchmarks/step_time.py): per precision for matrix products and for
  convolutions, and one for memory. The precision (`PRECISIONS`) is
  float16 or bfloat16 (`half`) for ops with 2-byte outputs, TF32 (`tf32`,
  on GPUs that have it) or FP32 for the others (`Gpu.peak_flops`). Ops
  that run no kernel (`NO_KERNEL_TYPES`: forwarding ops, variable reads,
  constants, placeholders, v1 control flow) and ops off the managed
  device take no time.
* **Fusion.** An elementwise op (`ELEMENTWISE_TYPES`) whose output only
  elementwise ops and reductions (`REDUCTION_TYPES`) on the device read is
  computed inside their kernels, as XLA fuses it: that output is neither
  written nor read through memory, and the op launches no kernel of its
  own (`StepTimeModel.fused`). Only with ``fusion=True`` (XLA); without
  XLA TensorFlow runs every op as a kernel of its own.
* **Copies.** Swap-outs queue first in, first out on one device-to-host
  copy stream at the link's device-to-host rate
  (`Interconnect.d2h_bytes_per_s`), swap-ins on one host-to-device stream
  at its host-to-device rate (`h2d_bytes_per_s`); both run beside the
  compute stream. A swap-out
  can start when its tensor has been made; a swap-in when its triggers have
  finished and its swap-out has finished. A reader of a swap-in waits until
  the copy has finished. With ``sync_mode`` 1 or 3, the plan's waiters
  (`planner.SwapPlan.waiters`) wait for the swap-out; with 2 or 3, each
  swap-in is triggered by its reader's other inputs, so the reader waits
  for the whole copy. Nothing else waits: with one compute stream, an op's
  graph predecessors have finished before it starts.
* **Recomputes.** The clones of a `planner.RecomputePlan` run on the
  compute stream just before the first of its late readers, as long as the
  ops they copy take, once the swap-ins they read have arrived
  (`StepTime.recompute_s`).
* **The step** ends when the compute stream and both copy streams are idle.
  Without LMS it is the sum of the op times; the exposed transfer time is
  the difference.

Memory and time: the per-level start times (`StepTime.level_start_s`) and,
per swap, the level at which its swap-out copy has finished
(`SwapTiming.out_done_level`: the tensor stays on the device until then)
and the level at which each swap-in copy starts
(`SwapInTiming.start_level`: the copy occupies the device from then) are
what the simulator needs to count copies that take time: `copy_levels`
turns them into a `simulator.CopyLevels`, and `replay_in_time` replays a
plan with them (what the auto-tuner checks its chosen plan with).

Not modelled: the variable and slot bytes an optimizer update reads and
writes through resource handles (handles have no size in the index; only
the gradient counts), overlapping kernels (several streams, or ops of one
level running concurrently), cuDNN algorithm choice per shape, fusion
beyond elementwise chains (epilogues of matrix products, Grappler's
remapper), caches, host-side op scheduling, input pipelines, and copy
rates below the link's.

Hardware numbers are the vendors' published peak rates (sources in
`GPUS` and `INTERCONNECTS`; the Grace Hopper link's copy rates are
measured ones); docs/benchmarks.md compares the predictions with
published throughput.
"""

import bisect
import dataclasses
import heapq
import math

import numpy as np

from tflms import graph_index as gi
from tflms import simulator
# The hardware tables live in `tflms.hardware` (standard library only, for
# the settings' checks); they are re-exported here, where they are used.
from tflms.hardware import (DEFAULT_GPU, DEFAULT_INTERCONNECT, GPUS, INSTANT,
                            INTERCONNECTS, LINKS, PRECISIONS, Gpu,
                            Interconnect, gpu_named, interconnect_named)
from tflms.analysis import initializer_only_ops
from tflms.graph_index import CONTROL_FLOW_V1_TYPES

__all__ = [
    "Gpu",
    "Interconnect",
    "GPUS",
    "INTERCONNECTS",
    "INSTANT",
    "LINKS",
    "DEFAULT_GPU",
    "DEFAULT_INTERCONNECT",
    "PRECISIONS",
    "Efficiency",
    "PEAK",
    "ACHIEVED",
    "LAUNCH_OVERHEAD_S",
    "NO_KERNEL_TYPES",
    "ELEMENTWISE_TYPES",
    "CONVOLUTION_TYPES",
    "REDUCTION_TYPES",
    "gpu_named",
    "interconnect_named",
    "StepTimeModel",
    "predict_planned",
    "copy_levels",
    "replay_in_time",
    "StepTime",
    "SwapTiming",
    "SwapInTiming",
]

# What launching one kernel costs beyond its work: CUDA's launch latency
# (a few microseconds) plus TensorFlow's executor bookkeeping per op. 5 us is
# a round figure in that range; set it per model with `launch_overhead_s`.
LAUNCH_OVERHEAD_S = 5e-6

@dataclasses.dataclass(frozen=True)
class Efficiency:
    """The fractions of the published peak rates kernels reach. Matrix
    products (`MatMul`, `BatchMatMul*`: cuBLAS) and convolutions
    (`CONVOLUTION_TYPES`: cuDNN) per precision (`PRECISIONS`), memory-bound
    work of the HBM bandwidth. One set for every GPU and model: what
    differs between GPUs is their peak rates, what differs between models
    is their ops. Every fraction defaults to 1 (the peak).

    Raises:
      ValueError: a fraction that is not in (0, 1].
    """

    memory: float = 1.0
    fp32: float = 1.0
    tf32: float = 1.0
    fp16: float = 1.0
    bf16: float = 1.0
    conv_fp32: float = 1.0
    conv_tf32: float = 1.0
    conv_fp16: float = 1.0
    conv_bf16: float = 1.0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not 0 < value <= 1:
                raise ValueError(
                    "Efficiency.%s must be a fraction of the peak in (0, 1]; "
                    "got %r" % (field.name, value))

    def of(self, precision, convolution=False):
        """The fraction for products in `precision`: a convolution's, or a
        matrix product's."""
        return getattr(self, ("conv_" if convolution else "") + precision)


# Every kernel at its peak rate: the roofline as the datasheets draw it.
PEAK = Efficiency()

# The fractions fitted to published single-GPU training throughput by
# `benchmarks/step_time.py` (docs/benchmarks.md, "Step-time model": which
# published runs they were fitted on, and how far off the model is on the
# runs held out). The products' fractions come from BERT-large, the
# convolutions' from ResNet50, memory from both. bfloat16 takes float16's
# fractions: no published run in bfloat16 was fitted or held out.
ACHIEVED = Efficiency(
    memory=0.961,
    fp32=0.755, tf32=0.71, fp16=0.505, bf16=0.505,
    conv_fp32=0.851, conv_tf32=0.217, conv_fp16=0.439, conv_bf16=0.439)

# Convolutions and their gradients (cuDNN's kernels; `Efficiency` gives
# them fractions of their own).
CONVOLUTION_TYPES = frozenset({
    "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D",
    "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter",
})

# Ops that run no GPU kernel in a step: they forward a buffer, hand out a
# variable, or were materialized before the step (constants, fed inputs).
NO_KERNEL_TYPES = frozenset({
    "Identity", "IdentityN", "StopGradient", "PreventGradient", "Reshape",
    "Squeeze", "ExpandDims", "Snapshot",
    "ReadVariableOp", "VarHandleOp", "VariableV2", "Variable",
    "VarHandleOpV2", "VarIsInitializedOp",
    "Const", "Placeholder", "PlaceholderWithDefault", "NoOp",
    "Shape", "ShapeN", "Size", "Rank",
}) | CONTROL_FLOW_V1_TYPES


@dataclasses.dataclass(frozen=True)
class SwapInTiming:
    """When one swap-in's copy ran.

    Attributes:
      ready_s: when its triggers and its swap-out had finished.
      start_s, end_s: the copy on the host-to-device stream.
      start_level: the level running when the copy starts (the last level
        that started at or before `start_s`): the device copy occupies
        memory from this level on.
    """

    ready_s: float
    start_s: float
    end_s: float
    start_level: int


@dataclasses.dataclass(frozen=True)
class SwapTiming:
    """When one swapped tensor's copies ran.

    Attributes:
      producer, output: the tensor.
      nbytes: bytes per copy.
      out_start_s, out_end_s: the swap-out on the device-to-host stream.
      out_done_level: the first level that starts at or after `out_end_s`
        (the number of levels if none): the tensor stays on the device
        until this level.
      swap_ins: a `SwapInTiming` per swap-in, in plan order.
    """

    producer: int
    output: int
    nbytes: int
    out_start_s: float
    out_end_s: float
    out_done_level: int
    swap_ins: tuple


# Ops that compute each output element from the elements at the same
# position of their inputs (broadcasting allowed), or draw them at random:
# what XLA's loop fusion merges into one kernel.
ELEMENTWISE_TYPES = frozenset({
    "Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Div", "DivNoNan",
    "Neg", "Abs", "Sign", "Maximum", "Minimum", "Pow", "Reciprocal",
    "ReciprocalGrad", "Square", "SquaredDifference", "Sqrt", "SqrtGrad",
    "Rsqrt", "RsqrtGrad", "Exp", "Log", "Log1p", "Erf", "Erfc", "Tanh",
    "TanhGrad", "Sigmoid", "SigmoidGrad", "Relu", "ReluGrad", "Relu6",
    "Relu6Grad", "Elu", "EluGrad", "Selu", "SeluGrad", "Softplus",
    "SoftplusGrad", "LeakyRelu", "LeakyReluGrad", "BiasAdd", "Cast",
    "Select", "SelectV2", "Greater", "GreaterEqual", "Less", "LessEqual",
    "Equal", "NotEqual", "LogicalAnd", "LogicalOr", "LogicalNot",
    "ZerosLike", "OnesLike", "Floor", "Ceil", "Round", "FloorDiv",
    "FloorMod", "ClipByValue", "RandomUniform", "RandomStandardNormal",
})

# Reductions, into which XLA fuses the elementwise ops that feed them.
REDUCTION_TYPES = frozenset({"Sum", "Mean", "Max", "Min", "Prod",
                             "BiasAddGrad"})


@dataclasses.dataclass(frozen=True, eq=False)
class StepTime:
    """One predicted step. Times in seconds.

    Attributes:
      gpu, interconnect: names of the hardware.
      without_lms_s: the step without a plan (the sum of the op times).
      with_lms_s: the step with the plan (equal without one).
      compute_s: time of the graph's own ops on the compute stream
        (`without_lms_s` up to rounding).
      recompute_s: time of the plan's recompute clones on the compute
        stream (0 without recomputes).
      swapout_bytes, swapin_bytes: bytes each way.
      swapout_busy_s, swapin_busy_s: busy time of each copy stream.
      level_start_s: float numpy array, when each level of the (planned)
        step starts: its first op's start, or for a level without timed
        ops, when the levels before it have finished.
      op_start_s, op_end_s: float numpy arrays per op of the index (0 for
        ops that do not run).
      swaps: a `SwapTiming` per swap of the plan.
    """

    gpu: str
    interconnect: str
    without_lms_s: float
    with_lms_s: float
    compute_s: float
    recompute_s: float
    swapout_bytes: int
    swapin_bytes: int
    swapout_busy_s: float
    swapin_busy_s: float
    level_start_s: np.ndarray
    op_start_s: np.ndarray
    op_end_s: np.ndarray
    swaps: tuple

    @property
    def exposed_transfer_s(self):
        """How much longer the step takes with the plan than without it,
        beyond the time of its recompute clones: waiting for copies."""
        return self.with_lms_s - self.without_lms_s - self.recompute_s


class StepTimeModel:
    """Op times of a graph on one GPU and link; `predict` replays a plan.

    Args:
      index: a `GraphIndex` (the planning index, with its serialization
        edges, when timing a `pipeline.Planned`).
      roles: its `OpRoles` (which ops are on the device, which do not run).
      batch_size: the first unknown dimension of every shape, or None.
      gpu: a `Gpu` or a key of `GPUS`.
      interconnect: an `Interconnect` or a key of `INTERCONNECTS`.
      launch_overhead_s: seconds added to every op that runs a kernel.
      efficiency: the `Efficiency` kernels reach. Default: `ACHIEVED`
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
        XLA fuses it (`fused`). Default False: TensorFlow without XLA (a
        Session, a tf.function without ``jit_compile``) runs every op as
        a kernel of its own. The published runs `ACHIEVED` is fitted to
        ran with XLA, and benchmarks/step_time.py times them with fusion.

    Raises:
      ValueError: an unknown GPU or link, a negative overhead, or a `half`
        that is not a 2-byte precision.
    """

    def __init__(self, index, roles, batch_size=None, gpu=DEFAULT_GPU,
                 interconnect=DEFAULT_INTERCONNECT,
                 launch_overhead_s=LAUNCH_OVERHEAD_S, efficiency=None,
                 tf32=True, half="fp16", fusion=False):
        if not launch_overhead_s >= 0:
            raise ValueError("launch_overhead_s must be >= 0 seconds; got "
                             "%r" % (launch_overhead_s,))
        if half not in ("fp16", "bf16"):
            raise ValueError("half must be 'fp16' or 'bf16' (the precision "
                             "of 2-byte products); got %r" % (half,))
        self.gpu = gpu_named(gpu)
        if efficiency is None:
            published = GPUS.get(self.gpu.name) is self.gpu
            efficiency = ACHIEVED if published else PEAK
        self.efficiency = efficiency
        self.tf32 = bool(tf32)
        self.half = half
        self.fusion = bool(fusion)
        self.index = index
        self.roles = roles
        self.batch_size = batch_size
        self.interconnect = interconnect_named(interconnect)
        self.launch_overhead_s = launch_overhead_s
        inactive = roles.inactive | initializer_only_ops(index)
        self.runs = np.asarray([i not in inactive
                                for i in range(index.num_ops)], dtype=bool)
        self.fused = self._fused_tensors() if self.fusion else frozenset()
        self.op_seconds = np.asarray(
            [self._op_seconds(i) if self.runs[i] else 0.0
             for i in range(index.num_ops)], dtype=np.float64)
        self._without = None
        self._ran = None  # ids of the ops that run, made on first use
        # Python floats and bools for the per-op loop of `predict` (numpy
        # scalars cost more to index one at a time; the values are equal).
        self._seconds = self.op_seconds.tolist()
        self._runs = self.runs.tolist()

    # ---- per-op cost -------------------------------------------------------
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
        memory (unknown sizes: 0; tensors in `fused`: 0)."""
        index = self.index
        fused = self.fused
        total = sum(self._bytes(p, k) for p, k in index.inputs[op_id]
                    if (p, k) not in fused)
        return total + sum(self._bytes(op_id, k)
                           for k in range(len(index.output_shapes[op_id]))
                           if (op_id, k) not in fused)

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
        index = self.index
        if (op_id not in self.roles.device_ops
                or index.types[op_id] in NO_KERNEL_TYPES):
            return 0.0
        flops = gi.op_flops(index, op_id, self.batch_size) or 0
        work = max(flops / self.achieved_flops(op_id),
                   self.bytes_touched(op_id) / self.achieved_bandwidth)
        if (op_id, 0) in self.fused:
            return work  # in its consumer's kernel: no launch of its own
        return work + self.launch_overhead_s

    # ---- one step ------------------------------------------------------
    def predict(self, plan=None, levels=None, num_levels=None):
        """Time one step of the graph rewritten with `plan`.

        Args:
          plan: a `planner.Plan`, or None for the step without LMS.
          levels: per-op levels of the rewritten graph
            (`simulator.SimulationResult.levels` of the plan's replay);
            default: the index's levels, which are the plan's whenever it
            moves no op (asynchronous plans).
          num_levels: levels of the rewritten graph
            (`SimulationResult.num_levels`, which counts the swap ops'
            levels too); default: one past the highest op level.

        Returns:
          A `StepTime`.

        Raises:
          ValueError: if `levels` put a swap-in's reader before its
            triggers (levels that are not the plan's), or `levels` or
            `num_levels` do not fit the index.
        """
        index = self.index
        n = index.num_ops
        if levels is None:
            levels = index.levels
        levels = np.asarray(levels, dtype=np.int64)
        if len(levels) != n:
            raise ValueError("levels must give one level per op of the "
                             "index (%d); got %d" % (n, len(levels)))
        needed = int(levels.max()) + 1 if n else 0
        if num_levels is None:
            num_levels = needed
        elif num_levels < needed:
            raise ValueError(
                "num_levels must be at least one past the highest op level "
                "(%d); got %d; pass the replay's num_levels with its levels"
                % (needed, num_levels))
        order = self._order(levels)
        swaps = plan.swaps if plan is not None else ()
        # Swap-outs go device to host, swap-ins host to device, each at its
        # direction's rate.
        out_rate = self.interconnect.d2h_bytes_per_s
        in_rate = self.interconnect.h2d_bytes_per_s

        # What each op waits for, and which copies it sets off.
        swapouts_of = {}     # producer -> swap indexes
        waits_out = {}       # op -> swap indexes whose swap-out it waits for
        waits_in = {}        # op -> swap-in keys (swap, k) it reads
        trigger_of = {}      # op -> swap-in keys it triggers
        missing = {}         # swap-in key -> triggers not yet finished
        sizes = []
        for s, swap in enumerate(swaps):
            sizes.append(self._bytes(swap.producer, swap.output))
            swapouts_of.setdefault(swap.producer, []).append(s)
            for w in swap.waiters:
                waits_out.setdefault(w, []).append(s)
            for k, sin in enumerate(swap.swap_ins):
                key = (s, k)
                for c, _ in sin.consumers:
                    waits_in.setdefault(c, []).append(key)
                live = {t for t in sin.triggers if self._runs[t]}
                # The swap-out counts as one more thing to wait for.
                missing[key] = len(live) + 1
                for t in live:
                    trigger_of.setdefault(t, []).append(key)

        # Recompute clones run on the compute stream just before the first
        # of their late readers (their trigger has run by then), for as long
        # as the ops they copy, after the swap-ins they read have arrived.
        clones_before = {}   # op -> [(seconds, swap-in keys read)]
        recomputes = plan.recomputes if plan is not None else ()
        if recomputes:
            position = {op: k for k, op in enumerate(order)}
            swap_of = {(swap.producer, swap.output): s
                       for s, swap in enumerate(swaps)}
        for rec in recomputes:
            readers = [c for c, _ in rec.consumers if c in position]
            if not readers:
                continue
            first = min(readers, key=position.get)
            keys = tuple(
                (swap_of[(src[1], src[2])], src[3])
                for srcs in rec.inputs for src in srcs
                if src[0] == "swapin" and (src[1], src[2]) in swap_of)
            clones_before.setdefault(first, []).append(
                (math.fsum(self.op_seconds[o] for o in rec.ops), keys))

        op_start = np.zeros(n, dtype=np.float64)
        op_end = np.zeros(n, dtype=np.float64)
        out_start = [0.0] * len(swaps)
        out_end = [0.0] * len(swaps)
        ready = {}           # swap-in key -> latest finish it waited for
        in_times = {}        # swap-in key -> (ready, start, end)
        queue = []           # ready swap-ins not yet copied: (ready, seq, key)
        seq = [0]
        d2h_free = h2d_free = 0.0
        clock = 0.0

        def finished(key, when):
            ready[key] = max(ready.get(key, 0.0), when)
            missing[key] -= 1
            if missing[key] == 0:
                heapq.heappush(queue, (ready[key], seq[0], key))
                seq[0] += 1

        def copy_in(key):
            # Copies start in the order they became ready (FIFO); a copy
            # another op needs later can only have become ready later.
            nonlocal h2d_free
            while key not in in_times:
                if not queue:
                    swap = swaps[key[0]]
                    raise ValueError(
                        "levels put a reader of the swap-in of %s:%d before "
                        "its triggers or its swap-out; pass the levels of "
                        "the plan's replay (simulator replay(plan).levels)"
                        % (index.names[swap.producer], swap.output))
                when, _, first = heapq.heappop(queue)
                start = max(when, h2d_free)
                h2d_free = start + sizes[first[0]] / in_rate
                in_times[first] = (when, start, h2d_free)
            return in_times[key][2]

        recompute_s = 0.0
        for i in order:
            for seconds, keys in clones_before.get(i, ()):
                start = clock
                for key in keys:
                    start = max(start, copy_in(key))
                clock = start + seconds
                recompute_s += seconds
            start = clock
            for key in waits_in.get(i, ()):
                start = max(start, copy_in(key))
            for s in waits_out.get(i, ()):
                start = max(start, out_end[s])
            end = start + self._seconds[i]
            op_start[i], op_end[i] = start, end
            clock = end
            for s in swapouts_of.get(i, ()):
                out_start[s] = max(end, d2h_free)
                d2h_free = out_end[s] = out_start[s] + sizes[s] / out_rate
                for k in range(len(swaps[s].swap_ins)):
                    finished((s, k), out_end[s])
            for key in trigger_of.get(i, ()):
                finished(key, end)
        # Copies nobody in the step waits for still run before it ends.
        while queue:
            copy_in(queue[0][2])

        level_start = self._level_starts(order, levels, num_levels,
                                         op_start, op_end)
        timings = []
        for s, swap in enumerate(swaps):
            ins = []
            for k in range(len(swap.swap_ins)):
                when, start, end = in_times.get((s, k), (0.0, 0.0, 0.0))
                ins.append(SwapInTiming(
                    ready_s=when, start_s=start, end_s=end,
                    start_level=max(0, bisect.bisect_right(
                        level_start, start) - 1)))
            timings.append(SwapTiming(
                producer=swap.producer, output=swap.output, nbytes=sizes[s],
                out_start_s=out_start[s], out_end_s=out_end[s],
                out_done_level=bisect.bisect_left(level_start, out_end[s]),
                swap_ins=tuple(ins)))
        compute = math.fsum(self.op_seconds)
        swapin_bytes = sum(sizes[s] * len(swap.swap_ins)
                           for s, swap in enumerate(swaps))
        return StepTime(
            gpu=self.gpu.name, interconnect=self.interconnect.name,
            without_lms_s=self._without_lms_s(),
            with_lms_s=max(clock, d2h_free, h2d_free),
            compute_s=compute, recompute_s=recompute_s,
            swapout_bytes=int(sum(sizes)), swapin_bytes=int(swapin_bytes),
            swapout_busy_s=sum(sizes) / out_rate,
            swapin_busy_s=swapin_bytes / in_rate,
            level_start_s=level_start, op_start_s=op_start,
            op_end_s=op_end, swaps=tuple(timings))

    def _without_lms_s(self):
        # Accumulated in the graph's level order, as `predict` accumulates
        # a plan's step: a plan that moves no op and makes nothing wait then
        # gives exactly this sum, and the exposed time is exactly 0.
        if self._without is None:
            seconds = self._seconds
            clock = 0.0
            for i in self._order(np.asarray(self.index.levels,
                                            dtype=np.int64)):
                clock += seconds[i]
            self._without = clock
        return self._without

    def _order(self, levels):
        """The ops that run, by level then id (a list of ints)."""
        ran = self._ran
        if ran is None:
            ran = self._ran = np.flatnonzero(np.asarray(self.runs, dtype=bool))
        return ran[np.lexsort((ran, levels[ran]))].tolist()

    @staticmethod
    def _level_starts(order, levels, num_levels, op_start, op_end):
        """When each level starts: its first op's start in `order`; a level
        without ops of its own starts when the ones before it have ended."""
        starts = np.full(num_levels, np.nan)
        if num_levels == 0:
            return starts
        if order:
            ops = np.asarray(order, dtype=np.int64)
            at = levels[ops]
            # `order` is sorted by level: the first op of each level is
            # where its level first appears.
            first_levels, first = np.unique(at, return_index=True)
            starts[first_levels] = op_start[ops[first]]
            ends = np.full(num_levels, -np.inf)
            np.maximum.at(ends, at, op_end[ops])
        else:
            ends = np.full(num_levels, -np.inf)
        # done before level L: the latest end of the levels below it (0 at
        # the start), as the levels are walked in order.
        done = np.maximum.accumulate(np.concatenate(([0.0], ends[:-1])))
        empty = np.isnan(starts)
        starts[empty] = done[empty]
        return starts


def predict_planned(planned, gpu=DEFAULT_GPU,
                    interconnect=DEFAULT_INTERCONNECT,
                    launch_overhead_s=LAUNCH_OVERHEAD_S, efficiency=None,
                    tf32=True, half="fp16", fusion=False):
    """The `StepTime` of a `pipeline.Planned`: its plan (if any) timed at
    the levels of its with-LMS simulation.

    Args:
      planned: a `pipeline.Planned` with its simulations
        (`pipeline.simulate_plan`; auto-tuned ones have them).
      gpu, interconnect, launch_overhead_s, efficiency, tf32, half,
        fusion: as for `StepTimeModel`.

    Raises:
      ValueError: `planned` has a plan but no with-LMS simulation.
    """
    model = StepTimeModel(planned.index, planned.roles,
                          planned.settings.batch_size, gpu=gpu,
                          interconnect=interconnect,
                          launch_overhead_s=launch_overhead_s,
                          efficiency=efficiency, tf32=tf32, half=half,
                          fusion=fusion)
    if planned.plan is None:
        return model.predict()
    if planned.with_lms is None:
        raise ValueError("the plan has not been simulated, and its levels "
                         "are needed; pass pipeline.simulate_plan(planned)")
    return model.predict(planned.plan, planned.with_lms.levels,
                         planned.with_lms.num_levels)


def copy_levels(step):
    """The `simulator.CopyLevels` of a predicted step: how long its plan's
    copies occupy device memory, in the levels it was predicted at.

    The simulator counts a buffer at a level when the buffer exists as the
    level starts. So a swapped tensor is held through the last level that
    starts before its copy to the host ends (``out_done_level - 1``), and a
    swap-in's device copy is allocated from the first level that starts at
    or after its copy starts. (A copy that starts in the middle of a level
    is not counted in that level: the simulator's levels run their ops at
    once, and counting the copy there would move it a level early whatever
    the link's speed, only because of the order the step-time model gives
    the ops of one level.)

    Args:
      step: a `StepTime` from `StepTimeModel.predict` with a plan.
    """
    starts = step.level_start_s
    return simulator.CopyLevels(
        held_through=tuple(t.out_done_level - 1 for t in step.swaps),
        allocated_from=tuple(
            tuple(bisect.bisect_left(starts, i.start_s) for i in t.swap_ins)
            for t in step.swaps))


def replay_in_time(memory_model, time_model, plan, detail=True,
                   instant=None):
    """Replay `plan` counting its copies' duration on `time_model`'s link.

    The plan is replayed once with instant copies, for its levels; timed at
    those levels (copies move no op to another level, so they are the
    timed step's levels too); and replayed again with the `copy_levels`
    of that step.

    Args:
      memory_model: a `simulator.SimulationModel`.
      time_model: a `StepTimeModel` of the same index, roles and batch size.
      plan: a `planner.Plan`.
      detail: as for `SimulationModel.replay`.
      instant: the plan's replay without copy times, if already made.

    Returns:
      ``(SimulationResult, StepTime)``: the replay with copy times, and the
      predicted step.
    """
    if instant is None:
        instant = memory_model.replay(plan, detail=False)
    step = time_model.predict(plan, instant.levels, instant.num_levels)
    if not plan.swaps:
        return (memory_model.replay(plan, detail=True) if detail
                else instant), step
    return memory_model.replay(plan, detail=detail,
                               copy_levels=copy_levels(step)), step
