"""Host: a plan's swapped tensors within the host budget.

Swapped tensors live in pinned host memory, which the system cannot page
out (a plan that outgrows it stalls or kills the training process), so
the host is a budget like the device (`context.budgets.host_bytes`:
``autotune_host_mem``, or physical memory per process on the node).

* A tuned plan that fits the device but needs more host memory has swaps
  replaced by recomputes, most bytes moved first, cheap operations before
  convolutions and matrix products, each kept only while the plan still
  fits the device budget with its copies timed and needs less host memory,
  until the host fits. If it never does, planning fails with
  `HostMemoryError`, which says what to change.
* Fixed parameters are applied as given; a warning says when they need
  more host memory than the budget.

The log says which memory bound the plan.
"""

import dataclasses

from tflms import planner
from tflms import simulator
from tflms.autotune import AutotuneError
from tflms.stages import timed
from tflms.stages.records import HostBound

__all__ = ["stage", "HostMemoryError"]

_GIB = float(1 << 30)


class HostMemoryError(AutotuneError):
    """The plan that fits the device needs more host memory than the host
    budget, even with swapped tensors recomputed instead."""


def stage(context, planned):
    """`planned` within the host budget (tuned plans), or as it is with a
    warning (fixed parameters)."""
    limit = context.budgets.host_bytes
    plan = planned.plan
    if (not limit or plan is None or not plan.swaps
            or planned.failure is not None):
        return planned
    if planned.autotuned:
        return _within_host(context, planned, limit)
    _warn_fixed(context, planned, limit)
    return planned


def _within_host(context, planned, limit):
    log = context.log
    need = planned.with_lms.peak_host_bytes
    if need <= limit:
        log.info("[Simulator] Device memory bounds the plan: %.2f of %.2f "
                 "GiB on the device; the swapped tensors need at most %.2f "
                 "of %.2f GiB of host memory" % (
                     planned.with_lms.peak_device_bytes / _GIB,
                     context.budget_bytes / _GIB, need / _GIB,
                     limit / _GIB))
        return planned
    log.info("[Simulator] The plan needs %.2f GiB of host memory at its "
             "peak, more than the %.2f GiB budget (%s); recomputing swapped "
             "tensors instead" % (need / _GIB, limit / _GIB,
                                  _budget_source(context)))
    model = context.model(planned.index)
    timer = context.timer(planned.index)
    budget = context.budget_bytes
    host_peaks = {id(planned.plan): (planned.plan, need)}

    def accept(candidate, current):
        if host_peaks[id(current)][1] <= limit:
            return False  # fits the host: no more compute spent on it
        fitting = timed.fitting_replay(model, timer, candidate, budget)
        if (fitting is None
                or fitting[0].peak_host_bytes >= host_peaks[id(current)][1]):
            return False
        host_peaks[id(candidate)] = (candidate, fitting[0].peak_host_bytes)
        return True

    chosen = planned.plan
    # Cheap clones first; convolutions and matrix products only if those
    # are not enough.
    for clone_types in (planner.RECOMPUTABLE_TYPES,
                        planner.TIMED_RECOMPUTABLE_TYPES):
        chosen = planner.Recomputer(
            planned.index, context.roles, context.batch_size,
            clone_types=clone_types).with_recomputes(chosen, accept)
        if host_peaks[id(chosen)][1] <= limit:
            break
    final, step = timed.replay_at_link(model, timer, chosen)
    if final.peak_host_bytes > limit or not final.fits(budget):
        return _failed(context, planned, limit, need, final, chosen)
    added = len(chosen.recomputes) - len(planned.plan.recomputes)
    log.info("[Simulator] Host memory bounds the plan: %d swapped tensors "
             "(%.3f GiB) are recomputed instead, so the swapped tensors need "
             "at most %.2f of %.2f GiB of host memory; one step peaks at "
             "%.2f of %.2f GiB on the device; predicted step %.1f ms, %.1f "
             "ms of it recomputing" % (
                 added, chosen.recompute_bytes() / _GIB,
                 final.peak_host_bytes / _GIB, limit / _GIB,
                 final.peak_device_bytes / _GIB, budget / _GIB,
                 step.with_lms_s * 1e3, step.recompute_s * 1e3))
    before = {(r.producer, r.output) for r in planned.plan.recomputes}
    recorded = planned.with_record(HostBound(
        recomputed=tuple((r.producer, r.output) for r in chosen.recomputes
                         if (r.producer, r.output) not in before),
        peak_host_bytes=final.peak_host_bytes))
    return recorded.with_plan(chosen, final, step)


def _failed(context, planned, limit, need, final, chosen):
    message = (
        "The LMS plan that fits %.2f GiB of device memory needs %.2f GiB of "
        "host memory at its peak (%.2f GiB with %d of its swapped tensors "
        "recomputed instead, as many as fit the device), more than the "
        "%.2f GiB budget (%s). Swapped tensors live in pinned host memory, "
        "which cannot be paged out. Use a smaller batch size or input, fewer "
        "training processes per node, or, if this process may use more, "
        "set lms.autotune_host_mem = <GiB>." % (
            context.budget_bytes / _GIB, need / _GIB,
            final.peak_host_bytes / _GIB, len(chosen.recomputes),
            limit / _GIB, _budget_source(context)))
    context.log.info("[Simulator] %s" % message)
    # Its plots show the plan that fits the device.
    return _with_failure(planned, HostMemoryError(
        message, plot_data=planned.plot_data()))


def _with_failure(planned, error):
    return dataclasses.replace(planned, failure=error)


def _warn_fixed(context, planned, limit):
    # Every swapped tensor held at once is an upper bound of the host
    # peak: only when it is over the budget is the plan replayed.
    if sum(s.nbytes or 0 for s in planned.plan.swaps) <= limit:
        return
    try:
        model = context.model(planned.index)
        need = model.replay(planned.plan, detail=False).peak_host_bytes
    except simulator.BatchSizeError:
        return
    if need > limit:
        context.log.warning(
            "The LMS plan needs %.2f GiB of host memory at its peak, more "
            "than the %.2f GiB budget (%s); the host may run out of memory. "
            "Swap fewer tensors (a larger swapout_threshold), use a smaller "
            "batch size or fewer processes per node, or auto-tune, which "
            "recomputes tensors to stay within it." % (
                need / _GIB, limit / _GIB, _budget_source(context)))


def _budget_source(context):
    gib = context.settings.autotune_host_mem
    if gib is not None:
        return "autotune_host_mem=%g" % gib
    if context.budgets.local_processes > 1:
        return "physical memory / %d processes on this node" % (
            context.budgets.local_processes)
    return "this machine's physical memory"
