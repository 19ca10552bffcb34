"""What a replay returns (`SimulationResult`), what it may take to count
copies that take time (`CopyLevels`), and the counting of a replay's
buffers into lifetimes and per-level timelines.
"""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class CopyLevels:
    """How long a plan's copies occupy device memory, in levels of the
    plan's replay: what `SimulationModel.replay` needs to count copies that
    take time (`steptime.copy_levels` makes it from a predicted step).

    Attributes:
      held_through: per swap of the plan, in plan order, the last level
        that starts before its copy to the host has finished: the swapped
        tensor's device buffer is not freed before the end of this level
        (nor before its swap-out's level and its remaining readers, as
        without copy times).
      allocated_from: per swap, a tuple with one level per swap-in: the
        first level that starts after its copy to the device has started;
        the device copy is allocated no later than this level (nor later
        than the swap-in's own level, as without copy times: the runtime
        allocates the copy when it issues it, so a copy queued behind
        others holds its memory while it waits).
      gradients_held_through: ``((producer, output), level)`` per
        gradient an update on the host reads (``offload_optimizer``): the
        last level that starts before the gradient's copy to the host has
        finished. Its device buffer is not freed before the end of that
        level (nor before its readers, as without copy times: the update
        on the host reads it). Empty without offloaded updates.
    """

    held_through: tuple
    allocated_from: tuple
    gradients_held_through: tuple = ()

    def check_against(self, plan):
        """Raise `ValueError` unless there is one entry per swap and
        swap-in of `plan`."""
        shape = [len(s.swap_ins) for s in plan.swaps]
        if (len(self.held_through) != len(shape)
                or [len(a) for a in self.allocated_from] != shape):
            raise ValueError(
                "copy_levels must have one held_through level per swap and "
                "one allocated_from level per swap-in of the plan (swap-ins "
                "per swap %s); got %d and %s; make it from the plan's own "
                "step time (steptime.copy_levels)" % (
                    shape, len(self.held_through),
                    [len(a) for a in self.allocated_from]))


@dataclasses.dataclass(frozen=True, eq=False)
class SimulationResult:
    """What one replay found. Byte counts are ints.

    Attributes:
      peak_device_bytes: highest device memory over the step.
      peak_level: level (of the rewritten graph) where it happens.
      peak_op: name of the op allocating the most device bytes in that level
        (swap ops are named as the rewriter names them).
      live_at_peak: ``(tensor name, bytes)`` of the device buffers live at
        the peak, largest first; resident memory is one entry named
        ``'<resident variables and constants>'``.
      peak_host_bytes: highest host memory over the step.
      device_timeline / host_timeline: int64 numpy arrays, bytes in use at
        each level (after the level's allocations, before its frees).
      resident_device_bytes / resident_host_bytes: variables and constants.
      num_levels: levels of the rewritten graph.
      levels: int64 numpy array, the level of every original op.
      swapout_bytes: bytes the plan moves to the host (one copy per tensor).
      swapin_bytes: bytes the plan moves back (one copy per swap-in).
      recompute_bytes: bytes of the tensors the plan makes again.
    """

    peak_device_bytes: int
    peak_level: int
    peak_op: str
    live_at_peak: tuple
    peak_host_bytes: int
    device_timeline: np.ndarray
    host_timeline: np.ndarray
    resident_device_bytes: int
    resident_host_bytes: int
    num_levels: int
    levels: np.ndarray
    swapout_bytes: int
    swapin_bytes: int
    recompute_bytes: int = 0

    def fits(self, budget_bytes):
        return self.peak_device_bytes <= budget_bytes


def buffers_with(graph, added):
    """``(bytes, space, alloc node, use buffer, use node)`` arrays of the
    graph's buffers and reads (`graph`, a `GraphBuffers`) with the plan's
    (`added`, an `Additions`) added and masked."""
    if added.bytes:
        buf_bytes = np.concatenate(
            [graph.buf_bytes, np.asarray(added.bytes, dtype=np.int64)])
        buf_space = np.concatenate(
            [graph.buf_space, np.asarray(added.space, dtype=np.int8)])
        buf_alloc = np.concatenate(
            [graph.buf_alloc, np.asarray(added.alloc, dtype=np.int64)])
    else:
        buf_bytes, buf_space, buf_alloc = (graph.buf_bytes, graph.buf_space,
                                           graph.buf_alloc)
    use_buf, use_node = graph.use_buf, graph.use_node
    if added.masked:
        keep = np.ones(len(use_buf), dtype=bool)
        keep[np.asarray(added.masked, dtype=np.int64)] = False
        use_buf, use_node = use_buf[keep], use_node[keep]
    if added.use_buf:
        use_buf = np.concatenate(
            [use_buf, np.asarray(added.use_buf, dtype=np.int64)])
        use_node = np.concatenate(
            [use_node, np.asarray(added.use_node, dtype=np.int64)])
    if added.written_into:
        # An output written into a swap-in's copy: its reads keep the copy,
        # and its own buffer is never allocated.
        use_buf = buffer_targets(added.written_into, len(buf_bytes))[use_buf]
        buf_bytes = buf_bytes.copy()
        buf_bytes[np.fromiter(added.written_into, dtype=np.int64)] = 0
    return buf_bytes, buf_space, buf_alloc, use_buf, use_node


def buffer_targets(written_into, num_buffers):
    """Each buffer's id, but for an output written into a swap-in's copy
    (`Additions.written_into`), the copy's: an int64 array to map reads."""
    targets = np.arange(num_buffers, dtype=np.int64)
    for own, copy in written_into.items():
        targets[own] = copy
    return targets


def lifetimes(added, buffers, levels, num_levels):
    """Each buffer's first and last level: allocated at its maker's,
    freed after its last reader's, or as the copies' times say.
    `buffers`: what `buffers_with` returned."""
    _, _, buf_alloc, use_buf, use_node = buffers
    alloc = levels[buf_alloc]
    free = alloc.copy()
    np.maximum.at(free, use_buf, levels[use_node])
    if added.held:
        bufs, until = np.asarray(added.held, dtype=np.int64).T
        if added.written_into:
            # The few held buffers looked up one by one, not a map of every
            # buffer built again (`buffers_with` built one for the reads).
            into = added.written_into
            bufs = np.fromiter((into.get(b, b) for b in bufs.tolist()),
                               dtype=np.int64, count=len(bufs))
        np.maximum.at(free, bufs, np.minimum(until, num_levels - 1))
    if added.allocated:
        bufs, since = np.asarray(added.allocated, dtype=np.int64).T
        np.minimum.at(alloc, bufs, np.maximum(since, 0))
    return alloc, free


def timeline(alloc, free, nbytes, num_levels):
    """Bytes live per level from [alloc, free] intervals (inclusive)."""
    diff = np.zeros(num_levels + 1, dtype=np.int64)
    np.add.at(diff, alloc, nbytes)
    np.add.at(diff, free + 1, -nbytes)
    return np.cumsum(diff[:num_levels])
