"""The step-time model: `StepTimeModel` predicts one step, with or
without a plan, as a `StepTime`: the ops at their `OpCosts` on one compute
stream, the copies on one stream each way (docs: the `tflms.steptime`
package)."""

import bisect
import dataclasses
import heapq
import math

import numpy as np

from tflms.hardware import (DEFAULT_GPU, DEFAULT_INTERCONNECT,
                            HOST_UPDATE_RATE, interconnect_named)
from tflms.steptime.host_updates import HostUpdates
from tflms.steptime.op_costs import OpCosts
from tflms.steptime.rates import NO_KERNEL_TYPES

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
      offload_out_bytes, offload_in_bytes: with ``offload_optimizer``,
        bytes the offloaded updates copy to the host (gradients and
        weights) and back (the new weights) per step; 0 without.
      host_update_s: the host's busy time running them.
      host_updates: a `host_updates.HostUpdateTiming` per offloaded
        update.
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
    offload_out_bytes: int = 0
    offload_in_bytes: int = 0
    host_update_s: float = 0.0
    host_updates: tuple = ()

    @property
    def exposed_transfer_s(self):
        """How much longer the step takes with the plan than without it,
        beyond the time of its recompute clones: waiting for copies."""
        return self.with_lms_s - self.without_lms_s - self.recompute_s


# Why one class: half of it is `predict`, one walk of the compute stream and
# the two copy streams together, whose clocks, queues and per-swap timings are
# shared state of that walk; split into functions they would pass a dozen
# arrays and clocks between them. The rest is each op's rate (precision,
# fusion, bytes touched), read by `predict` and by the recompute stage.
class StepTimeModel(OpCosts):
    """Op times of a graph on one GPU and link (`OpCosts`); `predict`
    replays a plan.

    Args:
      index: a `GraphIndex` (the planning index, with its serialization
        edges, when timing a `pipeline.Planned`).
      roles: its `OpRoles` (which ops are on the device, which do not run).
      batch_size: the first unknown dimension of every shape, or None.
      gpu: a `Gpu` or a key of `GPUS`.
      interconnect: an `Interconnect` or a key of `INTERCONNECTS`.
      kernels: how the kernels run (`KernelOptions`: launch overhead,
        efficiency, TF32, the 2-byte precision, XLA fusion, layout);
        default: ``KernelOptions()``.
      offload: with ``offload_optimizer``, the `tflms.offload.Offload`
        whose updates `index` (its `offload.planning_index`) has on the
        host: their copies and host time are part of every step predicted
        (`host_updates`), and `StepTime.without_lms_s` counts them as the
        device's kernels, where they run without LMS.
      host: the `hardware.HostUpdateRate` the host runs them at (default
        `hardware.HOST_UPDATE_RATE`).

    Raises:
      ValueError: an unknown GPU or link.
    """

    def __init__(self, index, roles, batch_size=None, gpu=DEFAULT_GPU,
                 interconnect=DEFAULT_INTERCONNECT, kernels=None,
                 offload=None, host=HOST_UPDATE_RATE):
        super().__init__(index, roles, batch_size, gpu, kernels)
        self.interconnect = interconnect_named(interconnect)
        self.updates = () if offload is None else tuple(offload.updates)
        self.host = host
        self._without = None
        self._ran = None  # ids of the ops that run, made on first use
        # Python floats and bools for the per-op loop of `predict` (numpy
        # scalars cost more to index one at a time; the values are equal).
        self._seconds = self.op_seconds.tolist()
        self._runs = self.runs.tolist()

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
        levels, num_levels = self._checked_levels(levels, num_levels)
        order = self._order(levels)
        swaps = plan.swaps if plan is not None else ()
        sizes = [self._bytes(swap.producer, swap.output) for swap in swaps]
        waits = _SwapWaits(swaps, self._runs)
        clones_before = self._clones_before(plan, order, swaps)
        # Swap-outs go device to host, swap-ins host to device, each at its
        # direction's rate.
        out_rate = self.interconnect.d2h_bytes_per_s
        stream = _HostToDevice(self.index, swaps, sizes, waits.missing,
                               self.interconnect.h2d_bytes_per_s)
        host = self._host_updates()

        n = self.index.num_ops
        op_start = np.zeros(n, dtype=np.float64)
        op_end = np.zeros(n, dtype=np.float64)
        out_start = [0.0] * len(swaps)
        out_end = [0.0] * len(swaps)
        d2h_free = 0.0 if host is None else host.start(out_rate, stream)
        clock = 0.0
        recompute_s = 0.0
        host_waits = {} if host is None else host.waiting
        gradients_of = {} if host is None else host.by_producer
        # Most ops wait for nothing and set off nothing: the dictionaries
        # are only asked about the ops in them.
        seconds_of = self._seconds
        waits_in, waits_out = waits.waits_in, waits.waits_out
        swapouts_of, trigger_of = waits.swapouts_of, waits.trigger_of
        for i in order:
            if i in clones_before:
                for seconds, keys in clones_before[i]:
                    clock = stream.wait_for(keys, clock) + seconds
                    recompute_s += seconds
            start = (stream.wait_for(waits_in[i], clock) if i in waits_in
                     else clock)
            if i in waits_out:
                for s in waits_out[i]:
                    start = max(start, out_end[s])
            if i in host_waits:
                start = stream.wait_for(host_waits[i], start)
            end = start + seconds_of[i]
            op_start[i], op_end[i] = start, end
            clock = end
            if i in swapouts_of:
                for s in swapouts_of[i]:
                    out_start[s] = max(end, d2h_free)
                    d2h_free = out_end[s] = (out_start[s]
                                             + sizes[s] / out_rate)
                    for k in range(len(swaps[s].swap_ins)):
                        stream.finished((s, k), out_end[s])
            if i in trigger_of:
                for key in trigger_of[i]:
                    stream.finished(key, end)
            if i in gradients_of:
                d2h_free = host.gradient_made(i, end, d2h_free, out_rate,
                                              stream)
        stream.drain()

        level_start = self._level_starts(order, levels, num_levels,
                                         op_start, op_end)
        swapin_bytes = sum(sizes[s] * len(swap.swap_ins)
                           for s, swap in enumerate(swaps))
        return StepTime(
            gpu=self.gpu.name, interconnect=self.interconnect.name,
            without_lms_s=self._without_lms_s(),
            with_lms_s=max(clock, d2h_free, stream.free,
                           0.0 if host is None else host.free),
            compute_s=math.fsum(self.op_seconds), recompute_s=recompute_s,
            swapout_bytes=int(sum(sizes)), swapin_bytes=int(swapin_bytes),
            swapout_busy_s=sum(sizes) / out_rate,
            swapin_busy_s=swapin_bytes / stream.rate,
            level_start_s=level_start, op_start_s=op_start,
            op_end_s=op_end,
            swaps=_swap_timings(swaps, sizes, stream, out_start, out_end,
                                level_start),
            **({} if host is None else dict(
                offload_out_bytes=int(host.out_bytes),
                offload_in_bytes=int(host.in_bytes),
                host_update_s=host.host_s,
                host_updates=host.timings(stream))))

    def _host_updates(self):
        """The `HostUpdates` of one predicted step, or None without
        offloaded updates."""
        if not self.updates:
            return None
        host = self.host

        def host_seconds(op):
            if self.index.types[op] in NO_KERNEL_TYPES:
                return 0.0  # a slot's read: its buffer, no kernel
            return host.overhead_s + self.bytes_touched(op) / host.bytes_per_s
        return HostUpdates(self.index, self.updates, self._bytes,
                           host_seconds, self._runs)

    def _checked_levels(self, levels, num_levels):
        """`levels` as an int64 array (default: the index's) and
        `num_levels` (default: one past the highest), checked against the
        index."""
        n = self.index.num_ops
        if levels is None:
            levels = self.index.levels
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
        return levels, num_levels

    def _clones_before(self, plan, order, swaps):
        """op -> ``[(seconds, swap-in keys read)]`` of the recompute clones
        that run just before it.

        Recompute clones run on the compute stream just before the first
        of their late readers (their trigger has run by then), for as long
        as the ops they copy, after the swap-ins they read have arrived."""
        clones_before = {}
        recomputes = plan.recomputes if plan is not None else ()
        if not recomputes:
            return clones_before
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
        return clones_before

    def _without_lms_s(self):
        # Accumulated in the graph's level order, as `predict` accumulates
        # a plan's step: a plan that moves no op and makes nothing wait then
        # gives exactly this sum, and the exposed time is exactly 0.
        if self._without is None:
            seconds = self._seconds
            if self.updates:
                # Without LMS the offloaded updates run on the device.
                seconds = list(seconds)
                for u in self.updates:
                    for op in u.moved_ops:
                        seconds[op] = self.kernel_seconds(op)
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


class _SwapWaits:
    """What each op of a step waits for and which copies it sets off.

    Attributes:
      swapouts_of: producer -> indexes of the swaps of its outputs.
      waits_out: op -> indexes of the swaps whose swap-out it waits for.
      waits_in: op -> keys ``(swap, k)`` of the swap-ins it reads.
      trigger_of: op -> keys of the swap-ins it triggers.
      missing: swap-in key -> how many of its triggers that run, and its
        swap-out, have not finished yet.
    """

    def __init__(self, swaps, runs):
        self.swapouts_of = {}
        self.waits_out = {}
        self.waits_in = {}
        self.trigger_of = {}
        self.missing = {}
        for s, swap in enumerate(swaps):
            self.swapouts_of.setdefault(swap.producer, []).append(s)
            for w in swap.waiters:
                self.waits_out.setdefault(w, []).append(s)
            for k, sin in enumerate(swap.swap_ins):
                key = (s, k)
                for c, _ in sin.consumers:
                    self.waits_in.setdefault(c, []).append(key)
                live = {t for t in sin.triggers if runs[t]}
                # The swap-out counts as one more thing to wait for.
                self.missing[key] = len(live) + 1
                for t in live:
                    self.trigger_of.setdefault(t, []).append(key)


class _HostToDevice:
    """The host-to-device copy stream of one step: swap-ins copied one at
    a time, in the order they became ready (FIFO), at `rate` bytes/s.

    Attributes:
      free: when the stream has finished its last copy so far.
      in_times: swap-in key -> (ready, start, end) of its copy.
      needed: swap-in key -> when the compute stream first needed it.
    """

    def __init__(self, index, swaps, sizes, missing, rate):
        self._index = index
        self._swaps = swaps
        self._sizes = sizes
        self._missing = missing
        self.rate = rate
        self.free = 0.0
        self.in_times = {}
        self.needed = {}
        self._ready = {}     # swap-in key -> latest finish it waited for
        self._queue = []     # ready swap-ins not yet copied: (ready, seq, key)
        self._seq = 0
        self._extra_sizes = {}  # key -> bytes of copies that are no swap-in

    def finished(self, key, when):
        """One of the things swap-in `key` waits for finished at `when`."""
        self._ready[key] = max(self._ready.get(key, 0.0), when)
        self._missing[key] -= 1
        if self._missing[key] == 0:
            heapq.heappush(self._queue, (self._ready[key], self._seq, key))
            self._seq += 1

    def wait_for(self, keys, clock):
        """When the compute stream, free at `clock`, may run what reads the
        swap-ins `keys`: once they have all arrived."""
        start = clock
        for key in keys:
            self.needed.setdefault(key, clock)
            start = max(start, self._copy_in(key))
        return start

    def ready(self, key, when, nbytes):
        """Queue a copy of `nbytes` ready at `when` that waits for nothing
        else (an offloaded update's new weights)."""
        self._extra_sizes[key] = nbytes
        self._missing[key] = 1
        self.finished(key, when)

    def drain(self):
        """Copies nobody in the step waits for still run before it ends."""
        while self._queue:
            self._copy_in(self._queue[0][2])

    def _copy_in(self, key):
        # Copies start in the order they became ready (FIFO); a copy
        # another op needs later can only have become ready later.
        while key not in self.in_times:
            if not self._queue:
                swap = self._swaps[key[0]]
                raise ValueError(
                    "levels put a reader of the swap-in of %s:%d before "
                    "its triggers or its swap-out; pass the levels of "
                    "the plan's replay (simulator replay(plan).levels)"
                    % (self._index.names[swap.producer], swap.output))
            when, _, first = heapq.heappop(self._queue)
            start = max(when, self.free)
            nbytes = self._extra_sizes.get(first)
            if nbytes is None:
                nbytes = self._sizes[first[0]]
            self.free = start + nbytes / self.rate
            self.in_times[first] = (when, start, self.free)
        return self.in_times[key][2]


def _swap_timings(swaps, sizes, stream, out_start, out_end, level_start):
    """The `SwapTiming` of each swap, from the copies' times."""
    timings = []
    for s, swap in enumerate(swaps):
        ins = []
        for k in range(len(swap.swap_ins)):
            when, start, end = stream.in_times.get((s, k), (0.0, 0.0, 0.0))
            ins.append(SwapInTiming(
                ready_s=when, start_s=start, end_s=end,
                start_level=max(0, bisect.bisect_right(
                    level_start, start) - 1),
                needed_s=stream.needed.get((s, k), math.inf)))
        timings.append(SwapTiming(
            producer=swap.producer, output=swap.output, nbytes=sizes[s],
            out_start_s=out_start[s], out_end_s=out_end[s],
            out_done_level=bisect.bisect_left(level_start, out_end[s]),
            swap_ins=tuple(ins)))
    return tuple(timings)
