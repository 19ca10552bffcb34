"""What `LMS.run` returns: `RunResult` and its `Outcome`, and the error
for code LMS cannot act on (`EagerModeError`). A module of their own so that
`tflms.function`, which `tflms.lms` imports, can name them too."""

import dataclasses
import enum

from tflms import distributed

__all__ = ["EagerModeError", "Outcome", "RunResult"]


class EagerModeError(RuntimeError):
    """LMS rewrites graphs; it cannot act on eagerly executed code."""


class Outcome(enum.Enum):
    """What `LMS.run` did to a graph."""

    # The values are what `distributed.check_ranks_agree` compares across
    # the ranks of a job.
    REWRITTEN = distributed.REWRITTEN
    NOT_NEEDED = distributed.NOT_NEEDED
    ALREADY_REWRITTEN = distributed.ALREADY_REWRITTEN


@dataclasses.dataclass(frozen=True, eq=False)
class RunResult:
    """What `LMS.run` did, with the plan and its numbers.

    Attributes:
      outcome: an `Outcome`: REWRITTEN (swap ops added), NOT_NEEDED
        (auto-tuning found that the step fits without LMS; the graph is
        unchanged) or ALREADY_REWRITTEN (the graph has LMS's swap ops from
        an earlier run; unchanged).
      planned: the `pipeline.Planned` (index, roles, plan, tuning and
        simulations); None for ALREADY_REWRITTEN.
      rewrite: the `rewriter.RewriteResult` (the ops added), or None.
      seconds: wall time of the call.
    """

    outcome: Outcome
    planned: object = None
    rewrite: object = None
    seconds: float = 0.0

    @property
    def rewritten(self):
        return self.outcome is Outcome.REWRITTEN

    @property
    def plan(self):
        """The applied `planner.Plan`, or None."""
        return self.planned.plan if self.rewritten else None

    @property
    def swapout_ops(self):
        return self.rewrite.swapout_ops if self.rewrite else ()

    @property
    def swapin_ops(self):
        return self.rewrite.swapin_ops if self.rewrite else ()

    @property
    def control_edges(self):
        """Number of control edges the rewrite added."""
        return self.rewrite.control_edges if self.rewrite else 0
