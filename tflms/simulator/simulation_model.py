"""`SimulationModel`: a graph's memory made once (`buffers`, `levels`), then
one step replayed for each plan (`replay`), and the estimates the tuner
chooses tensors by (`freed_levels`).
"""

import numpy as np

from tflms.simulator.additions import Additions
from tflms.simulator.buffers import DEVICE, HOST, NO_BUFFER, GraphBuffers
from tflms.simulator.levels import GraphLevels
from tflms.simulator.simulation_result import (SimulationResult, buffers_with,
                                               lifetimes, timeline)


class SimulationModel:
    """Everything about a graph's memory that does not depend on the plan.

    Build once per (index, roles, batch size), then call `replay` for each
    plan. Node ids ``0..num_ops-1`` are the index's op ids; replays add
    virtual nodes after them for swap ops.

    Args:
      index: a `GraphIndex`. The control edges LMS plans to add
        (serialization, `index.planned_edges`) are replayed with the
        graph's own.
      roles: the `OpRoles` of the same index.
      batch_size: the first unknown dimension of every shape, or None.
      extra_edges: more ``(from_id, to_id)`` control edges to replay.
      landings: ``(op id, bytes, name)`` of device buffers an op makes
        that no tensor of the index shows, alive at the op's level only:
        with ``offload_optimizer``, the new weights an update on the host
        sends back, which land on the device before the write-back puts
        them in the variable (`offload.write_back_buffers`).

    Raises:
      BatchSizeError: if a size needs the batch size and none was given.
      ValueError: if the index's levels do not follow from its edges (an
        index re-levelled by hand instead of by
        `graph_index.with_planned_edges`).
    """

    def __init__(self, index, roles, batch_size=None, extra_edges=(),
                 landings=()):
        self.index = index
        self.roles = roles
        self.batch_size = batch_size
        buffers = GraphBuffers(index, roles, batch_size, landings)
        self._buffers = buffers
        # The graph's buffers as the model's own attributes: ordering and
        # the tests read them.
        self.num_ops = buffers.num_ops
        self.space = buffers.space
        self.initializer_ops = buffers.initializer_ops
        self.buf_bytes = buffers.buf_bytes
        self.buf_space = buffers.buf_space
        self.buf_alloc = buffers.buf_alloc
        self.buf_name = buffers.buf_name
        self.use_buf = buffers.use_buf
        self.use_node = buffers.use_node
        self.resident_device_bytes = buffers.resident_device_bytes
        self.resident_host_bytes = buffers.resident_host_bytes
        self.unknown_tensors = buffers.unknown_tensors
        self._freed_cache = (None, {})
        self._levels = GraphLevels(index, extra_edges)
        # (plan, its levels) of the last plan replayed: see `_levels_of`.
        self._last_levels = (None, None)

    # ---- queries ----------------------------------------------------------
    def tensor_size(self, op_id, output):
        """Bytes of a tensor as the model counts it (0 if unknown)."""
        buffers = self._buffers
        return buffers.tensor_bytes[buffers.out_base[op_id] + output]

    def buffer_of(self, op_id, output):
        """Buffer id of a tensor, or -1 if it has none (resident, empty)."""
        buffers = self._buffers
        return buffers.tensor_buffer[buffers.out_base[op_id] + output]

    # ---- replay -----------------------------------------------------------
    def replay(self, plan=None, detail=True, copy_levels=None):
        """Simulate one iteration of the graph rewritten with `plan`.

        Args:
          plan: a `planner.Plan`, or None for the graph without LMS.
          detail: compute `live_at_peak` and `peak_op` (a few ms on large
            graphs); searches that only need the peak pass False.
          copy_levels: a `CopyLevels` of this plan (at the levels of its
            replay without them) to count copies that take time: each
            swapped tensor's device buffer lives until its copy to the host
            has finished, each swap-in's device copy from the start of its
            copy, each gradient an update on the host reads until its copy
            there has finished. None: copies are instant (a swapped tensor
            is freed after its swap-out's level, a copy allocated at its
            swap-in's level).

        Returns:
          A `SimulationResult`.
        """
        if copy_levels is not None:
            copy_levels.check_against(plan)
        added = Additions(self._buffers, self._levels)
        if plan is not None:
            added.add_swaps(plan.swaps, copy_levels, detail)
            added.add_recomputes(plan.recomputes, detail)
        control_edges = plan.control_edges if plan is not None else ()
        added.add_rerouted_reads()
        if copy_levels is not None:
            added.hold_tensors(copy_levels.gradients_held_through)
        levels = self._levels_of(plan, added, control_edges)
        num_levels = int(levels.max()) + 1 if len(levels) else 0
        buffers = buffers_with(self._buffers, added)
        alloc, free = lifetimes(added, buffers, levels, num_levels)
        return self._result(added, buffers, levels, num_levels, alloc, free,
                            detail)

    def _levels_of(self, plan, added, control_edges):
        """The levels of every node of the graph rewritten with `plan`
        (`added` holds what it adds). Copies move no op to another level,
        so a plan's levels do not depend on `copy_levels`, and a timed
        replay (`steptime.replay_in_time`) replays the plan it has just
        replayed with instant copies: its levels, the costliest part of a
        replay on a large graph, are those of the last replay of the same
        plan object (kept here, so `is` never matches another plan), read
        only so that no reader changes them for the next."""
        last_plan, last_levels = self._last_levels
        if plan is not None and plan is last_plan:
            return last_levels
        levels = self._levels.replayed(added, control_edges)
        levels.flags.writeable = False
        self._last_levels = (plan, levels)
        return levels

    def _result(self, added, buffers, levels, num_levels, alloc, free,
                detail):
        """The `SimulationResult`: timelines per space, the device peak and,
        with `detail`, what is live there and which op made the peak."""
        buf_bytes, buf_space, buf_alloc, _, _ = buffers
        n = self.num_ops
        device = buf_space == DEVICE
        host = buf_space == HOST
        dev_tl = timeline(alloc[device], free[device], buf_bytes[device],
                          num_levels) + self.resident_device_bytes
        host_tl = timeline(alloc[host], free[host], buf_bytes[host],
                           num_levels) + self.resident_host_bytes
        peak_level = int(np.argmax(dev_tl)) if num_levels else 0
        peak = int(dev_tl[peak_level]) if num_levels else \
            self.resident_device_bytes

        peak_op = ""
        live = ()
        if detail and num_levels:
            all_names = self.buf_name + added.names
            at = np.nonzero(device & (alloc <= peak_level)
                            & (free >= peak_level) & (buf_bytes > 0))[0]
            rows = sorted(((all_names[j], int(buf_bytes[j])) for j in at),
                          key=lambda r: (-r[1], r[0]))
            if self.resident_device_bytes:
                rows.append(("<resident variables and constants>",
                             self.resident_device_bytes))
                rows.sort(key=lambda r: (-r[1], r[0]))
            live = tuple(rows)
            fresh = np.nonzero(device & (alloc == peak_level))[0]
            if len(fresh):
                j = fresh[np.argmax(buf_bytes[fresh])]
                node = int(buf_alloc[j])
                peak_op = self.index.names[node] if node < n else \
                    all_names[j].split(" ")[0]
                if peak_op.startswith("lms/recompute_"):
                    peak_op = peak_op.rpartition(":")[0]  # the clone op
        return SimulationResult(
            peak_device_bytes=peak,
            peak_level=peak_level,
            peak_op=peak_op,
            live_at_peak=live,
            peak_host_bytes=int(host_tl.max()) if num_levels else
            self.resident_host_bytes,
            device_timeline=dev_tl,
            host_timeline=host_tl,
            resident_device_bytes=self.resident_device_bytes,
            resident_host_bytes=self.resident_host_bytes,
            num_levels=num_levels,
            levels=levels[:n],
            swapout_bytes=added.swapout_bytes,
            swapin_bytes=added.swapin_bytes,
            recompute_bytes=added.recompute_bytes)

    def freed_levels(self, swap, levels):
        """Levels at which swapping one tensor frees its device bytes.

        An estimate for choosing what to swap, computed from the levels of a
        previous replay (swap ops do not move original ops in asynchronous
        modes): the tensor's buffer is freed after its remaining readers and
        the swap-out, and comes back as a device copy from each swap-in
        (just after its triggers) to that swap-in's last reader.

        Args:
          swap: a `planner.SwapPlan`.
          levels: per-op levels, e.g. `SimulationResult.levels`.

        Returns:
          A list of inclusive ``(first, last)`` level ranges, ascending.
        """
        # The tuner asks again about the same swaps with the same levels
        # (every candidate pool starts from the replay without swaps).
        cached_levels, answers = self._freed_cache
        if cached_levels is not levels:
            answers = {}
            self._freed_cache = (levels, answers)
        found = answers.get(swap)
        if found is None:
            found = answers[swap] = self._freed_levels(swap, levels)
        return list(found)

    def _freed_levels(self, swap, levels):
        b = self.buffer_of(swap.producer, swap.output)
        if b == NO_BUFFER:
            return []
        rerouted = {cs: k for k, sin in enumerate(swap.swap_ins)
                    for cs in sin.consumers}
        buffers = self._buffers
        moved = dict(buffers.rerouted_uses(rerouted))
        lo, hi = buffers.uses_ptr[b], buffers.uses_ptr[b + 1]
        uses = buffers.uses_by_buf[lo:hi]
        alloc = int(levels[self.buf_alloc[b]])
        end = alloc
        near = max(alloc, int(levels[swap.producer]) + 1)
        last_read = [max(int(levels[c]) for c, _ in sin.consumers)
                     for sin in swap.swap_ins]
        for u in uses:
            lvl = int(levels[self.use_node[u]])
            end = max(end, lvl)
            k = moved.get(int(u))
            if k is None:
                near = max(near, lvl)
            else:
                last_read[k] = max(last_read[k], lvl)
        copies = []
        for sin, last in zip(swap.swap_ins, last_read):
            start = max([int(levels[t]) + 1 for t in sin.triggers]
                        + [int(levels[swap.producer]) + 2])
            copies.append((start, last))
        copies.sort()
        freed = []
        cursor = near + 1
        for start, last in copies:
            if start > cursor:
                freed.append((cursor, min(start - 1, end)))
            cursor = max(cursor, last + 1)
        if cursor <= end:
            freed.append((cursor, end))
        return [(a, z) for a, z in freed if a <= z]
