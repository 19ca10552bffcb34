"""Plan a swapping rewrite from an indexed graph, without touching it.

The planner answers, from a `GraphIndex` and `OpRoles`: which tensors to
swap out, which consumers read each swap-in, which op triggers each
swap-in, which ops wait for a transfer (sync modes), and which control
edges serialize levels. The result is a `Plan`, plain data that the
rewriter applies in one pass and the simulator can replay.

Picture of one swap with two swap-in groups::

    before:  (src) --t--> (near) ...... (far1) (far2) ......... (far3)

    after:   (src) --t--> (near)
               |
               +--t--> [swapout] --+--> [swapin A] --> (far1) (far2)
                        (cpu)      |        ^ ctrl
                                   |     (trigger A)
                                   +--> [swapin B] --> (far3)
                                            ^ ctrl
                                         (trigger B)

Every new edge goes from a lower level to a higher one of the planning
levels (a swap-out sits just after its source, a swap-in just before its
earliest consumer, a trigger at least `swapin_ahead` levels before that),
so a plan can never create a cycle.

The package's modules, each importable on its own:

    types           SyncMode, SwapParams, SwapInPlan, SwapPlan,
                    RecomputePlan, Plan
    triggers        find_trigger, may_trigger, TriggerFinder
    swap_plan       candidate_edges, make_plan, wait_for_ordering
    recompute_plan  Recomputer (plan, with_recomputes, with_shared_clones),
                    retrigger_swaps
    edges           deferral_edges, serialization_edges, levels_over_size,
                    requirement_masks
    prune           without_parts, Dropped (a plan without some of its
                    parts: ``grappler_repair``)

Everything public is also a name of this package (`planner.make_plan`).
"""

from tflms.planner.edges import (DEFERRABLE_TYPES, deferral_edges,
                                 levels_over_size, requirement_masks,
                                 serialization_edges)
from tflms.planner.recompute_plan import (MAX_RECOMPUTE_OPS,
                                          MAX_TIMED_RECOMPUTE_OPS,
                                          RECOMPUTABLE_TYPES,
                                          TIMED_RECOMPUTABLE_TYPES,
                                          Recomputer, retrigger_swaps)
from tflms.planner.swap_plan import (candidate_edges, make_plan,
                                     wait_for_ordering)
from tflms.planner.triggers import (TRIGGER_SEARCH_LEVELS, TriggerFinder,
                                    find_trigger, may_trigger)
# Tests reach these internals of the trigger search through the package.
from tflms.planner.triggers import (  # noqa: F401
    _UNKNOWN, _data_reaches, _trigger_window)
from tflms.planner.types import (Plan, RecomputePlan, SwapInPlan, SwapParams,
                                 SwapPlan, SyncMode)

__all__ = [
    "SyncMode",
    "SwapParams",
    "SwapInPlan",
    "SwapPlan",
    "RecomputePlan",
    "RECOMPUTABLE_TYPES",
    "TIMED_RECOMPUTABLE_TYPES",
    "MAX_RECOMPUTE_OPS",
    "MAX_TIMED_RECOMPUTE_OPS",
    "Plan",
    "TriggerFinder",
    "TRIGGER_SEARCH_LEVELS",
    "DEFERRABLE_TYPES",
    "candidate_edges",
    "deferral_edges",
    "find_trigger",
    "may_trigger",
    "wait_for_ordering",
    "make_plan",
    "Recomputer",
    "retrigger_swaps",
    "serialization_edges",
    "requirement_masks",
    "levels_over_size",
]
