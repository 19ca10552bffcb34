"""The stages of planning, in the order `pipeline.plan` runs them.

Each stage is ``stage(context, planned) -> planned``: it reads the
`context.PlanningContext` (settings, roles, budgets, log, models) and the
`pipeline.Planned` so far, and returns a new `Planned` (the same object
when the stage does not apply). `STAGES` lists them as `contract.Stage`s,
each with the parts of `Planned` it reads and writes, which the pipeline
checks (`contract`); adding or removing a stage is one entry there. No
stage imports another: what they share is in `records` (what stages
record), `tuning` (the tuner's search, for the swaps and order stages) and
`timed` (timed replays, the replay budget).

What a stage decided is the plan (`Planned.plan`, put in place with
`Planned.with_plan` once the tuner made one) and, when it has more to say,
its own record: a frozen dataclass subclassing `records.StageRecord`,
defined in `records` and added with `Planned.with_record`
(`Serialized`, `Reduced`, `Deferred`, `Tuned`, `Ordered`, `Unwaited`,
`Prefetched`, `HostBound`). Readers
ask ``planned.record(ThatType)``. A record that names swaps says what
still holds when a later stage replaces the plan (`StageRecord.for_plan`);
`Planned` itself gets no new field. Inputs every stage shares (settings,
roles, budgets, hardware) belong in the context, not in a record.

    serialize    control edges chaining the chosen levels, in the planning
                 index
    reduce_first control edges running the chains that reduce a large
                 tensor (a metric of the logits) before its other reader
                 makes a large output, in the planning index, where they
                 raise no peak
    defer        control edges delaying fills made long before use
    swaps        the swap plan: auto-tuned (`autotune.tune`) or made from
                 the fixed parameters (`planner.make_plan`)
    order        when tuning found nothing that fits, or only plans with
                 synchronous swap-ins: control edges ordering the ops at the
                 memory peaks, and the search again
    fewer_waits  swap-outs the tuner made readers wait for, made
                 asynchronous where memory allows and the step gets shorter
    recompute    unless `Settings.recompute` is False: swaps replaced by
                 clones of the ops that made the tensor, where they cost
                 less
    fewer_waits  again where recomputes replaced swaps
                 (`fewer_waits.after_recompute`): their room may free
                 more waits
    prefetch     swap-ins that readers (or recompute clones) wait for,
                 started earlier where memory allows and the step gets
                 shorter
    host         the swapped tensors within the host budget: a tuned plan
                 that needs more host memory has swaps replaced by
                 recomputes until it fits (`host.HostMemoryError` if never)

A stage that cannot finish its part records why in `Planned.failure`; a
later stage may overcome it (ordering after a failed search), and
`pipeline.plan` raises what is left.
"""

from tflms.stages import defer
from tflms.stages import fewer_waits
from tflms.stages import host
from tflms.stages import order
from tflms.stages import prefetch
from tflms.stages import recompute
from tflms.stages import reduce_first
from tflms.stages import serialize
from tflms.stages import swaps
from tflms.stages.contract import Stage, check_order
from tflms.stages.records import (Deferred, HostBound, Ordered, Prefetched,
                                  Reduced, Serialized, Tuned, Unwaited)

__all__ = ["STAGES"]

# What a stage that changes the plan after the tuner may replace: the plan,
# its timed replay and its predicted step.
_REPLANS = frozenset({"plan", "with_lms", "step_time"})
# What the tuner's search sets (`tuning.with_outcome`).
_SEARCH = _REPLANS | {"without_lms", "failure", Tuned}

STAGES = (
    Stage("serialize", serialize.stage, reads=frozenset({"index"}),
          writes=frozenset({"index", Serialized})),
    Stage("reduce_first", reduce_first.stage, reads=frozenset({"index"}),
          writes=frozenset({"index", Reduced})),
    Stage("defer", defer.stage, reads=frozenset({"index"}),
          writes=frozenset({Deferred})),
    Stage("swaps", swaps.stage, reads=frozenset({"index", Deferred}),
          writes=_SEARCH),
    Stage("order", order.stage,
          reads=frozenset({"index", "failure", "step_time", Deferred,
                           Tuned}),
          writes=_SEARCH | {"index", Ordered}),
    Stage("fewer_waits", fewer_waits.stage,
          reads=frozenset({"plan", "step_time", Tuned}),
          writes=_REPLANS | {Unwaited}),
    Stage("recompute", recompute.stage,
          reads=frozenset({"plan", "step_time", "with_lms", Tuned}),
          writes=_REPLANS),
    Stage("fewer_waits.after_recompute", fewer_waits.after_recompute,
          reads=frozenset({"plan", "step_time", Tuned}),
          writes=_REPLANS | {Unwaited}),
    Stage("prefetch", prefetch.stage,
          reads=frozenset({"plan", "step_time", Tuned}),
          writes=_REPLANS | {Prefetched}),
    Stage("host", host.stage,
          reads=frozenset({"plan", "failure", Tuned}),
          writes=_REPLANS | {"failure", HostBound}),
)
check_order(STAGES)
