"""What the planning stages record in a `Planned`, beside the plan.

A stage that has something to say beyond the plan (which edges it added,
which tensors it changed and why) records a frozen dataclass subclassing
`StageRecord`, with `Planned.with_record`; readers ask
`Planned.record(ThatType)`. Every field has a default, so the record made
with no arguments says "the stage did nothing": that is what `record`
returns for a stage that recorded none.

The records live here, not in their stages' modules, because they are what
stages pass on to each other: a stage reads an earlier stage's record
without importing that stage (each stage declares the records it reads and
writes, `tflms.stages.contract`).
"""

import dataclasses
from typing import TYPE_CHECKING, Optional, Tuple

if TYPE_CHECKING:
    from tflms.autotune import TuneOutcome

__all__ = ["StageRecord", "Serialized", "Reduced", "Deferred", "Tuned",
           "Ordered", "Unwaited", "Prefetched", "HostBound"]


@dataclasses.dataclass(frozen=True)
class StageRecord:
    """What one stage recorded in a `Planned`."""

    def for_plan(self, plan):
        """This record as it holds for `plan`, which a later stage put in
        place of the plan it was made for (`Planned.with_plan`): a record
        naming swaps drops those `plan` no longer has. The record itself
        by default."""
        del plan
        return self


@dataclasses.dataclass(frozen=True)
class Serialized(StageRecord):
    """The levels serialization chained (levels of the step as given),
    sorted; their edges are the planning index's `planned_edges`."""

    levels: Tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Reduced(StageRecord):
    """The control edges that run side chains reducing a large tensor
    before its other large reader (`planner.reductions`), in every
    plan; they are among the planning index's `planned_edges`."""

    edges: Tuple[Tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Deferred(StageRecord):
    """The deferral edges of the planning index (`planner.deferral_edges`):
    ``(trigger, fill)`` pairs every plan carries out. Where the order
    stage replaced the planning index, `Ordered.deferral` holds the
    ordered index's (`Planned.deferral_edges` reads the one that holds)."""

    edges: Tuple[Tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Tuned(StageRecord):
    """What the tuner chose and why: its `autotune.TuneOutcome` (the
    parameters, the tensors it selected, its replays and predicted step),
    or None when the parameters were fixed. Later stages may replace the
    plan; this stays the tuner's."""

    outcome: Optional["TuneOutcome"] = None


@dataclasses.dataclass(frozen=True)
class Ordered(StageRecord):
    """The control edges ``(first, second)`` the stage added between ops at
    the memory peaks (`order.peaks.order_peaks`), all rounds together; they are
    also among the planning index's `planned_edges`, and so among the
    plan's serialization edges, which the rewriter adds. `deferral`: the
    deferral edges of that ordered index (the delayed fills' triggers
    follow its levels), in place of `Deferred`'s."""

    edges: Tuple[Tuple[int, int], ...] = ()
    deferral: Tuple[Tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Unwaited(StageRecord):
    """``(producer, output)`` of the swapped tensors whose swap-outs the
    tuner's `sync_mode` would make their readers wait for, and whose waits
    were dropped because the plan fits without them and its predicted step
    is shorter; both passes of the stage together."""

    tensors: Tuple[Tuple[int, int], ...] = ()

    def for_plan(self, plan):
        # A tensor recomputed instead is no longer swapped: no wait to drop.
        swapped = {(s.producer, s.output) for s in plan.swaps}
        return Unwaited(tuple(t for t in self.tensors if t in swapped))


@dataclasses.dataclass(frozen=True)
class Prefetched(StageRecord):
    """``(producer, output, j)`` of the swap-ins (the j-th of that
    tensor's) the stage started earlier than the tuner did, because a
    reader (or a recompute's clones) waited for them and the plan fits and
    runs faster with the earlier start."""

    swap_ins: Tuple[Tuple[int, int, int], ...] = ()

    def for_plan(self, plan):
        # A tensor recomputed instead is no longer swapped in.
        swapped = {(s.producer, s.output) for s in plan.swaps}
        return Prefetched(tuple(k for k in self.swap_ins
                                if k[:2] in swapped))


@dataclasses.dataclass(frozen=True)
class HostBound(StageRecord):
    """Host memory bounded a tuned plan: ``(producer, output)`` of the
    swapped tensors the stage recomputed instead so that the swapped ones
    fit the host budget, and the plan's host peak with them. (No record:
    the device bounded the plan, or the parameters were fixed.)"""

    recomputed: Tuple[Tuple[int, int], ...] = ()
    peak_host_bytes: int = 0
