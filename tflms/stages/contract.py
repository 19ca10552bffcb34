"""What each planning stage reads and writes, checked by the pipeline.

A stage is a function ``run(context, planned) -> planned``. `Stage` wraps
it with its contract: the parts of the `pipeline.Planned` it reads and the
parts it may change, each named either as a field of `Planned`
(``"index"``, ``"plan"``, ``"without_lms"``, ``"with_lms"``,
``"step_time"``, ``"failure"``) or as a record type
(`tflms.stages.records`).

Two checks hold the stages to it:

* `check_order` (when `tflms.stages` is imported): every part a stage
  reads is the pipeline's input (the planning index) or written by a stage
  before it, so reordering or removing a stage that another one needs
  fails at once, naming both;
* `Stage.__call__` (each run): the fields a stage replaced and the record
  types it added are among its writes. Records a new plan carries over
  (`StageRecord.for_plan`) are the plan's consequence, not the stage's.

Stages never import one another: what one hands to a later one is a field
or a record, and what several share lives in `timed` and `tuning`.
"""

import dataclasses
from typing import Callable, FrozenSet

from tflms.errors import LMSError

__all__ = ["Stage", "StageContractError", "check_order", "PLANNED_FIELDS",
           "INPUTS"]

# The fields of `Planned` a stage may replace (its context is fixed, its
# records are named by type).
PLANNED_FIELDS = ("index", "plan", "without_lms", "with_lms", "step_time",
                  "failure")
# What the first stage is given: the planning index of the step.
INPUTS = frozenset({"index"})


class StageContractError(LMSError, AssertionError):
    """A stage broke its declared contract: a bug in tflms, not in the
    user's graph or settings (an `AssertionError`: please report it)."""


def _name(part):
    return part if isinstance(part, str) else part.__name__


@dataclasses.dataclass(frozen=True)
class Stage:
    """A planning stage and its contract.

    Attributes:
      name: the stage's name in logs and errors.
      run: ``run(context, planned) -> planned``.
      reads: field names and record types the stage reads.
      writes: field names it may replace and record types it may add.
    """

    name: str
    run: Callable
    reads: FrozenSet = frozenset()
    writes: FrozenSet = frozenset()

    def __post_init__(self):
        for part in self.reads | self.writes:
            if isinstance(part, str) and part not in PLANNED_FIELDS:
                raise StageContractError(
                    "stage %r names %r, which is no field of Planned (one "
                    "of %s) nor a record type" % (
                        self.name, part, ", ".join(PLANNED_FIELDS)))

    def __call__(self, context, planned):
        """`run`, checked: a field replaced or a record type added that
        `writes` does not name raises `StageContractError`."""
        after = self.run(context, planned)
        replaced = {f for f in PLANNED_FIELDS
                    if getattr(after, f) is not getattr(planned, f)}
        added = ({type(r) for r in after.records}
                 - {type(r) for r in planned.records})
        undeclared = (replaced | added) - self.writes
        if undeclared:
            raise StageContractError(
                "planning stage %r changed %s, which its contract does not "
                "declare (writes: %s)" % (
                    self.name, ", ".join(sorted(map(_name, undeclared))),
                    ", ".join(sorted(map(_name, self.writes))) or "none"))
        return after


def check_order(stages):
    """Raise `StageContractError` unless every part each of `stages` reads
    is in `INPUTS` or written by a stage before it."""
    written = set(INPUTS)
    for stage in stages:
        missing = stage.reads - written
        if missing:
            raise StageContractError(
                "planning stage %r reads %s, which no stage before it writes"
                " (stages before it: %s)" % (
                    stage.name, ", ".join(sorted(map(_name, missing))),
                    ", ".join(s.name for s in stages[:stages.index(stage)])
                    or "none"))
        written |= stage.writes
