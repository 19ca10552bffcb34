"""What `LMS.run` returns: `RunResult` and its `Outcome`, and the error
for code LMS cannot act on (`EagerModeError`). A module of their own so that
`tflms.tf.lms_function`, which `tflms.lms` imports, can name them too; standard
library only."""

import dataclasses
import enum

from tflms.errors import LMSError

__all__ = ["EagerModeError", "Outcome", "RunResult"]


class EagerModeError(LMSError, RuntimeError):
    """LMS rewrites graphs; it cannot act on eagerly executed code."""


class Outcome(enum.Enum):
    """What `LMS.run` did to a graph."""

    # The values are what `distributed.check_ranks_agree` compares across
    # the ranks of a job.
    REWRITTEN = "rewritten"
    NOT_NEEDED = "not needed"
    ALREADY_REWRITTEN = "already rewritten"


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
      replicas: for a step whose replicas were planned one device at a
        time, ``((device, RunResult), ...)``; empty otherwise.
      offload: with ``offload_optimizer``, the `tflms.offload.Offload`
        (the updates moved to the host, their bytes); None otherwise.
      grappler: with the ``grappler_check`` setting on, the
        `tflms.tf.grappler_check.GrapplerReport` of the rewrite; None
        otherwise.
    """

    outcome: Outcome
    planned: object = None
    rewrite: object = None
    seconds: float = 0.0

    # ((device, RunResult), ...) when the step was planned one replica
    # device at a time (a tf.distribute strategy's step): this result then
    # sums them (`of_replicas`).
    replicas: tuple = ()
    offload: object = None
    grappler: object = None

    @classmethod
    def of_replicas(cls, by_device, seconds):
        """One result for a step planned device by device: `by_device` is
        ``[(device, RunResult), ...]`` in planning order. REWRITTEN when any
        replica was rewritten, NOT_NEEDED when none needed LMS, else
        ALREADY_REWRITTEN; `planned` is the first rewritten replica's (or
        the first replica's); `rewrite` holds every replica's added ops."""
        by_device = tuple(by_device)
        results = [r for _, r in by_device]
        rewritten = [r for r in results if r.rewritten]
        if rewritten:
            outcome = Outcome.REWRITTEN
        elif all(r.outcome is Outcome.NOT_NEEDED for r in results):
            outcome = Outcome.NOT_NEEDED
        else:
            outcome = Outcome.ALREADY_REWRITTEN
        first = (rewritten or results)[0]
        rewrite = None
        if rewritten:
            rewrite = dataclasses.replace(
                rewritten[0].rewrite,
                **{f.name: _summed(f.name, [r.rewrite for r in rewritten])
                   for f in dataclasses.fields(rewritten[0].rewrite)})
        return cls(outcome, first.planned, rewrite, seconds, by_device)

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


def _summed(name, rewrites):
    """A field of several `RewriteResult`s together: op names joined in
    order, counts added."""
    values = [getattr(r, name) for r in rewrites]
    if isinstance(values[0], tuple):
        return tuple(v for value in values for v in value)
    return sum(values)
