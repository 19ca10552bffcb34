"""The step-time model: `StepTimeModel` predicts one step, with or
without a plan, as a `StepTime` (docs: the `tflms.steptime` package)."""

import bisect
import dataclasses
import heapq
import math

import numpy as np

from tflms import graph_index as gi
from tflms.analysis import initializer_only_ops
from tflms.hardware import (DEFAULT_GPU, DEFAULT_INTERCONNECT, GPUS,
                            gpu_named, interconnect_named)
from tflms.step import APPLY_PREFIXES, ASSIGN_TYPES
from tflms.steptime.rates import (ACHIEVED, CONVOLUTION_TYPES,
                                  ELEMENTWISE_TYPES, LAUNCH_OVERHEAD_S,
                                  NO_KERNEL_TYPES, PEAK, REDUCTION_TYPES)

__all__ = ["StepTime", "StepTimeModel", "SwapTiming", "SwapInTiming"]


@dataclasses.dataclass(frozen=True)
class SwapInTiming:
    """When one swap-in's copy ran.

    Attributes:
      ready_s: when its triggers and its swap-out had finished.
      start_s, end_s: the copy on the host-to-device stream.
      start_level: the level running when the copy starts (the last level
        that started at or before `start_s`): the device copy occupies
        memory from this level on.
      needed_s: when the compute stream first needed the copy: the moment
        the first op or recompute clones reading it would have started had
        they not waited for it (``inf`` when nothing in the step reads
        it). The copy delayed the step where ``end_s > needed_s``.
    """

    ready_s: float
    start_s: float
    end_s: float
    start_level: int
    needed_s: float = math.inf


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


# Why one class: half of it is `predict`, one walk of the compute stream and the two copy
# streams together, whose clocks, queues and per-swap timings are shared
# state of that walk; split into functions they would pass a dozen arrays
# and clocks between them. The rest is each op's rate (precision, fusion,
# bytes touched), read by `predict` and by the recompute stage.
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
        ran with XLA, and benchmarks/step_time.py times them with fusion
        (and PyTorch's eager ResNet50 runs, held out, without).
      layout: the memory layout of the 4-D (and 5-D) tensors the graph's
        convolutions read and write when the step runs: ``"NHWC"``
        (channels last, the default: TensorFlow's layout, and the one
        XLA's layout assignment gives float16 convolutions) or ``"NCHW"``
        (channels first, PyTorch's default memory format). The index
        records shapes, not layouts. cuDNN runs tensor-core convolutions
        (2-byte, and TF32) in NHWC and transposes NCHW tensors into and
        out of it around each one (`transposed_bytes`); in NHWC, and in
        FP32 on the CUDA cores, it transposes nothing.

    Raises:
      ValueError: an unknown GPU or link, a negative overhead, a `half`
        that is not a 2-byte precision, or an unknown `layout`.
    """

    def __init__(self, index, roles, batch_size=None, gpu=DEFAULT_GPU,
                 interconnect=DEFAULT_INTERCONNECT,
                 launch_overhead_s=LAUNCH_OVERHEAD_S, efficiency=None,
                 tf32=True, half="fp16", fusion=False, layout="NHWC"):
        if not launch_overhead_s >= 0:
            raise ValueError("launch_overhead_s must be >= 0 seconds; got "
                             "%r" % (launch_overhead_s,))
        if half not in ("fp16", "bf16"):
            raise ValueError("half must be 'fp16' or 'bf16' (the precision "
                             "of 2-byte products); got %r" % (half,))
        if layout not in ("NHWC", "NCHW"):
            raise ValueError("layout must be 'NHWC' or 'NCHW' (the layout "
                             "of the convolutions' tensors); got %r"
                             % (layout,))
        self.layout = layout
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
        index = self.index
        if (op_id not in self.roles.device_ops
                or index.types[op_id] in NO_KERNEL_TYPES):
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
        firsts = []
        if recomputes:
            position = {op: k for k, op in enumerate(order)}
            swap_of = {(swap.producer, swap.output): s
                       for s, swap in enumerate(swaps)}
            firsts = self._clones_run_before(recomputes, position)
        for rec, first in zip(recomputes, firsts):
            if first is None:
                continue
            keys = tuple((swap_of[src[1:3]], src[3])
                         for src in rec.sources("swapin")
                         if src[1:3] in swap_of)
            clones_before.setdefault(first, []).append(
                (math.fsum(self.op_seconds[o] for o in rec.ops), keys))

        op_start = np.zeros(n, dtype=np.float64)
        op_end = np.zeros(n, dtype=np.float64)
        out_start = [0.0] * len(swaps)
        out_end = [0.0] * len(swaps)
        ready = {}           # swap-in key -> latest finish it waited for
        in_times = {}        # swap-in key -> (ready, start, end)
        needed = {}          # swap-in key -> when the stream first needed it
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
                    needed.setdefault(key, clock)
                    start = max(start, copy_in(key))
                clock = start + seconds
                recompute_s += seconds
            start = clock
            for key in waits_in.get(i, ()):
                needed.setdefault(key, clock)
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
                        level_start, start) - 1),
                    needed_s=needed.get((s, k), math.inf)))
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

    @staticmethod
    def _clones_run_before(recomputes, position):
        """Per recompute, the op its clones run just before: the first of
        its late readers that runs (by `position`), or None when none
        does. A recompute whose clone another reads (a ``'recompute'``
        source, always an earlier one of the plan) runs no later than
        that one, as the reader's clones wait for it."""
        firsts = []
        for rec in recomputes:
            readers = [c for c, _ in rec.consumers if c in position]
            firsts.append(min(readers, key=position.get) if readers
                          else None)
        number = {(rec.producer, rec.output): k
                  for k, rec in enumerate(recomputes)}
        for k in range(len(recomputes) - 1, -1, -1):
            first = firsts[k]
            if first is None:
                continue
            for src in recomputes[k].sources("recompute"):
                j = number[src[1:3]]
                if firsts[j] is None or position[first] < position[
                        firsts[j]]:
                    firsts[j] = first
        return firsts

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
