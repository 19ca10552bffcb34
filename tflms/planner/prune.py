"""A plan without some of its parts: what `grappler_repair` leaves out
when Grappler would optimize the step otherwise with them.

Dropping a swap drops the recomputes whose clones read one of its
swap-ins, and dropping a recompute drops those whose clones read one of
its clones, so that what is left applies on its own. Pure: plain data.
"""

import dataclasses
from typing import FrozenSet, NamedTuple, Tuple

from tflms.planner.types import Plan

__all__ = ["Dropped", "without_parts"]


class Dropped(NamedTuple):
    """What `without_parts` took out of a plan.

    Attributes:
      swaps: ``(producer, output)`` of the tensors no longer swapped.
      recomputes: ``(producer, output)`` of the tensors no longer
        recomputed (those asked for and those that needed a part dropped).
      edges: ``(from, to)`` control edges between the step's ops dropped.
    """

    swaps: Tuple[Tuple[int, int], ...] = ()
    recomputes: Tuple[Tuple[int, int], ...] = ()
    edges: Tuple[Tuple[int, int], ...] = ()

    def __bool__(self):
        return bool(self.swaps or self.recomputes or self.edges)


def without_parts(plan: Plan, swaps: FrozenSet = frozenset(),
                  recomputes: FrozenSet = frozenset(),
                  edges: FrozenSet = frozenset()):
    """`plan` without the swaps of the tensors in `swaps`, the recomputes
    of the tensors in `recomputes` and the control edges in `edges` (as
    ``(from, to)`` op ids), and without every recompute that reads a part
    dropped.

    Returns:
      ``(plan, Dropped)``: the plan left, and what was dropped of what
      `plan` held (a tensor or edge it did not hold is not listed).
    """
    kept_swaps = tuple(s for s in plan.swaps
                       if (s.producer, s.output) not in swaps)
    gone_swaps = {(s.producer, s.output) for s in plan.swaps} - {
        (s.producer, s.output) for s in kept_swaps}
    gone_recomputes = set()
    kept_recomputes = []
    # A recompute reads only recomputes that come before it in the plan,
    # so one pass in order sees every dependency dropped.
    for r in plan.recomputes:
        tensor = (r.producer, r.output)
        reads_gone = (
            any(src[1:3] in gone_swaps for src in r.sources("swapin"))
            or any(e[:2] in gone_swaps for e in r.earlier_swap_ins)
            or any(src[1:3] in gone_recomputes
                   for src in r.sources("recompute")))
        if tensor in recomputes or reads_gone:
            gone_recomputes.add(tensor)
        else:
            kept_recomputes.append(r)
    serialization = tuple(e for e in plan.serialization_edges
                          if tuple(e) not in edges)
    deferral = tuple(e for e in plan.deferral_edges if tuple(e) not in edges)
    gone_edges = tuple(sorted(
        {tuple(e) for e in plan.control_edges}
        - {tuple(e) for e in serialization + deferral}))
    pruned = dataclasses.replace(
        plan, swaps=kept_swaps, recomputes=tuple(kept_recomputes),
        serialization_edges=serialization, deferral_edges=deferral)
    return pruned, Dropped(swaps=tuple(sorted(gone_swaps)),
                           recomputes=tuple(sorted(gone_recomputes)),
                           edges=gone_edges)
