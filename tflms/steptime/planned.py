"""A `pipeline.Planned` timed by the step-time model, and a plan's replay
with its copies timed."""

import bisect

from tflms import simulator
from tflms.hardware import DEFAULT_GPU, DEFAULT_INTERCONNECT
from tflms.steptime.step_time_model import StepTimeModel

__all__ = ["predict_planned", "copy_levels", "replay_in_time"]


def predict_planned(planned, gpu=DEFAULT_GPU,
                    interconnect=DEFAULT_INTERCONNECT, kernels=None):
    """The `StepTime` of a `pipeline.Planned`: its plan (if any) timed at
    the levels of its with-LMS simulation, with the offloaded updates of
    its context (``offload_optimizer``) on the host.

    Args:
      planned: a `pipeline.Planned` with its simulations
        (`pipeline.simulate_plan`; auto-tuned ones have them).
      gpu, interconnect, kernels: as for `StepTimeModel`.

    Raises:
      ValueError: `planned` has a plan but no with-LMS simulation.
    """
    model = StepTimeModel(planned.index, planned.context.roles,
                          planned.context.batch_size, gpu=gpu,
                          interconnect=interconnect, kernels=kernels,
                          offload=planned.context.offload)
    if planned.plan is None:
        return model.predict()
    if planned.with_lms is None:
        raise ValueError("the plan has not been simulated, and its levels "
                         "are needed; pass pipeline.simulate_plan(planned)")
    return model.predict(planned.plan, planned.with_lms.levels,
                         planned.with_lms.num_levels)


def copy_levels(step):
    """The `simulator.CopyLevels` of a predicted step: how long its plan's
    copies occupy device memory, in the levels it was predicted at.

    The simulator counts a buffer at a level when the buffer exists as the
    level starts. So a swapped tensor is held through the last level that
    starts before its copy to the host ends (``out_done_level - 1``), and a
    swap-in's device copy is allocated from the first level that starts at
    or after its copy starts. With ``offload_optimizer`` each gradient an
    update on the host reads is held, as a swapped tensor, through the last
    level that starts before its copy to the host ends. (A copy that starts
    in the middle of a level is not counted in that level: the simulator's
    levels run their ops at once, and counting the copy there would move it
    a level early whatever the link's speed, only because of the order the
    step-time model gives the ops of one level.)

    Args:
      step: a `StepTime` from `StepTimeModel.predict` with a plan.
    """
    starts = step.level_start_s
    return simulator.CopyLevels(
        held_through=tuple(t.out_done_level - 1 for t in step.swaps),
        allocated_from=tuple(
            tuple(bisect.bisect_left(starts, i.start_s) for i in t.swap_ins)
            for t in step.swaps),
        gradients_held_through=tuple(
            (u.gradient, bisect.bisect_left(starts, u.gradient_out_end_s) - 1)
            for u in step.host_updates))


def replay_in_time(memory_model, time_model, plan, detail=True,
                   instant=None):
    """Replay `plan` counting its copies' duration on `time_model`'s link.

    The plan is replayed once with instant copies, for its levels; timed at
    those levels (copies move no op to another level, so they are the
    timed step's levels too); and replayed again with the `copy_levels`
    of that step.

    Args:
      memory_model: a `simulator.SimulationModel`.
      time_model: a `StepTimeModel` of the same index, roles and batch size.
      plan: a `planner.Plan`.
      detail: as for `SimulationModel.replay`.
      instant: the plan's replay without copy times, if already made.

    Returns:
      ``(SimulationResult, StepTime)``: the replay with copy times, and the
      predicted step.
    """
    if instant is None:
        instant = memory_model.replay(plan, detail=False)
    step = time_model.predict(plan, instant.levels, instant.num_levels)
    if not plan.swaps and not step.host_updates:
        return (memory_model.replay(plan, detail=True) if detail
                else instant), step
    return memory_model.replay(plan, detail=detail,
                               copy_levels=copy_levels(step)), step
