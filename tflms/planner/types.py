"""The plain data of a plan: `SwapParams` (with `SyncMode`), the swaps,
swap-ins and recomputes it holds, and the `Plan` the rewriter applies and the
simulator replays."""

import dataclasses
import enum


class SyncMode(enum.IntFlag):
    """What a plan makes wait for its copies (the ``sync_mode`` setting).

    Two independent choices, as TFLMSv2 numbered them: bit 1 makes the
    early readers of a swapped tensor wait until its copy to the host has
    finished (nothing new is allocated while it still occupies the device),
    bit 2 makes each swap-in a synchronous copy just before its reader
    instead of one started ahead. ``SyncMode(3)`` is both. It is an int to
    every reader (settings, command line, logs: 0 to 3); `text` says what
    it means.
    """

    NONE = 0
    SWAPOUT = 1
    SWAPIN = 2

    # The digit users set and logs print, also inside reprs of plans.
    def __repr__(self):
        return str(int(self))

    __str__ = __repr__

    @property
    def swapouts_wait(self):
        """Readers wait for the swap-out's copy to the host."""
        return bool(self & SyncMode.SWAPOUT)

    @property
    def swapins_sync(self):
        """Swap-ins are copied just before their reader."""
        return bool(self & SyncMode.SWAPIN)

    @property
    def text(self):
        return _SYNC_TEXT[int(self)]


_SYNC_TEXT = {
    0: "asynchronous copies between host and device",
    1: "device waits for swap-outs, swap-ins asynchronous",
    2: "swap-outs asynchronous, device waits for swap-ins",
    3: "device waits for swap-outs and swap-ins",
}


@dataclasses.dataclass(frozen=True)
class SwapParams:
    """Resolved (non-negative) swapping parameters.

    Before planning, the requested ones may hold -1 (auto) for the first
    three; `sync_mode` is always a `SyncMode` (the search starts from it).
    """

    swapout_threshold: int
    swapin_ahead: int
    swapin_groupby: int
    sync_mode: SyncMode

    def __post_init__(self):
        if not isinstance(self.sync_mode, SyncMode):
            object.__setattr__(self, "sync_mode", SyncMode(self.sync_mode))

    @property
    def sync_swapout(self):
        return self.sync_mode.swapouts_wait

    @property
    def sync_swapin(self):
        return self.sync_mode.swapins_sync

    def describe(self):
        """The parameters as logs and errors name them."""
        return ("swapout_threshold %d, swapin_ahead %d, swapin_groupby %d, "
                "sync_mode %d" % (self.swapout_threshold, self.swapin_ahead,
                                  self.swapin_groupby, self.sync_mode))


@dataclasses.dataclass(frozen=True)
class SwapInPlan:
    """One swap-in of a swapped tensor.

    Attributes:
      consumers: ``(op_id, input_slot)`` pairs rerouted to the swap-in.
      triggers: op ids the swap-in waits on through control edges.
      synchronous: True when the triggers are the first consumer's other
        inputs (sync_mode 2/3, or no trigger op was found in time).
    """

    consumers: tuple
    triggers: tuple
    synchronous: bool

    @property
    def first_consumer(self):
        return self.consumers[0][0]


@dataclasses.dataclass(frozen=True)
class SwapPlan:
    """Swap-out of one tensor and its swap-ins.

    Attributes:
      producer, output: the swapped tensor.
      nbytes: its static size (None if unknown).
      swap_ins: tuple of `SwapInPlan`, earliest first.
      waiters: device ops that wait for the swap-out (sync_mode 1/3).
    """

    producer: int
    output: int
    nbytes: object
    swap_ins: tuple
    waiters: tuple


@dataclasses.dataclass(frozen=True)
class RecomputePlan:
    """A tensor made again, just before its late readers, instead of kept.

    The ops that made it are cloned (same type, attributes and device) and
    the late readers read the last clone's output; the originals stay as
    they are, so the early readers and everything else see no change, and
    the original tensor's buffer is freed after its early readers.

    Attributes:
      producer, output: the recomputed tensor.
      nbytes: its static size (None if unknown).
      ops: the original op ids cloned, in topological order; the last one
        is `producer`.
      inputs: per clone, one source per input slot, each
        ``('tensor', op, output)`` (an original tensor still on the device
        then), ``('clone', k, output)`` (an output of the k-th clone) or
        ``('swapin', op, output, j)`` (the device copy of the j-th swap-in
        of tensor ``(op, output)`` of the same plan's swaps) or
        ``('recompute', op, output, n, k)`` (output k of the n-th clone of
        the same plan's recompute of tensor ``(op, output)``, which comes
        earlier in `Plan.recomputes` and whose clones run first: an op
        two recomputes need is cloned once).
      consumers: ``(op_id, input_slot)`` pairs rerouted to the last clone.
      trigger: the op every clone waits on through a control edge, so the
        clones run just before the first late reader (found as a
        swap-in's trigger is).
      earlier_swap_ins: ``(op, output, j)`` of the swap-ins among `inputs`
        that the plan's swaps start later than the clones need them: the
        plan starts them at `trigger` instead (`retrigger_swaps`). The
        batch-norm input that its gradient reads late is swapped anyway;
        brought back a little earlier it also feeds the clones.
    """

    producer: int
    output: int
    nbytes: object
    ops: tuple
    inputs: tuple
    consumers: tuple
    trigger: int
    earlier_swap_ins: tuple = ()

    @property
    def first_consumer(self):
        return min(c for c, _ in self.consumers)

    def sources(self, kind):
        """The sources of `kind` (``'tensor'``, ``'clone'``, ``'swapin'``
        or ``'recompute'``) the clones read, once per read, in clone and
        input order."""
        return (src for srcs in self.inputs for src in srcs
                if src[0] == kind)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything the rewriter will do, in a deterministic order."""

    params: SwapParams
    swaps: tuple
    serialization_edges: tuple
    num_levels: int
    unplanned_groups: int = 0
    deferral_edges: tuple = ()
    recomputes: tuple = ()

    @property
    def control_edges(self):
        """Serialization and deferral edges: control edges between existing
        ops, which the rewriter adds and the simulator replays."""
        return self.serialization_edges + self.deferral_edges

    @property
    def num_swap_ins(self):
        return sum(len(s.swap_ins) for s in self.swaps)

    def swapout_bytes(self):
        return sum(s.nbytes or 0 for s in self.swaps)

    def swapin_bytes(self):
        return sum((s.nbytes or 0) * len(s.swap_ins) for s in self.swaps)

    def moved_bytes(self):
        """Bytes copied between device and host per step, both ways."""
        return self.swapout_bytes() + self.swapin_bytes()

    def recompute_bytes(self):
        """Bytes of the tensors made again instead of kept."""
        return sum(r.nbytes or 0 for r in self.recomputes)
