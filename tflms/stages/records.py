"""`StageRecord`: the base of what a planning stage records in a `Planned`.

A stage that has something to say beyond the plan (which edges it added,
which tensors it changed and why) defines its own frozen dataclass
subclassing `StageRecord`, and adds it with `Planned.with_record`; readers
ask `Planned.record(ThatType)`. Every field has a default, so the record
made with no arguments says "the stage did nothing": that is what `record`
returns for a stage that recorded none.
"""

import dataclasses

__all__ = ["StageRecord"]


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
