"""The stages of planning, in the order `pipeline.plan` runs them.

Each stage is ``stage(context, planned) -> planned``: it reads the
`context.PlanningContext` (settings, roles, budgets, log, models) and the
`pipeline.Planned` so far, and returns a new `Planned` (the same object
when the stage does not apply). Adding or removing a stage is one line in
`STAGES`.

What a stage decided is the plan (`Planned.plan`, put in place with
`Planned.with_plan` once the tuner made one) and, when it has more to say,
its own record: a frozen dataclass subclassing `record.StageRecord`,
defined in the stage's module and added with `Planned.with_record`
(`serialize.Serialized`, `defer.Deferred`, `swaps.Tuned`,
`order.Ordered`, `fewer_waits.Unwaited`, `prefetch.Prefetched`,
`host.HostBound`). Readers
ask ``planned.record(ThatType)``. A record that names swaps says what
still holds when a later stage replaces the plan (`StageRecord.for_plan`);
`Planned` itself gets no new field. Inputs every stage shares (settings,
roles, budgets, hardware) belong in the context, not in a record.

    serialize    control edges chaining the chosen levels, in the planning
                 index
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
from tflms.stages import serialize
from tflms.stages import swaps

__all__ = ["STAGES"]

STAGES = (
    serialize.stage,
    defer.stage,
    swaps.stage,
    order.stage,
    fewer_waits.stage,
    recompute.stage,
    fewer_waits.after_recompute,
    prefetch.stage,
    host.stage,
)
