"""`plan_graph`: `LMS.run` on a loaded graph and the `PlanReport` of what
the simulator, the step-time model and (``--oracle``) the oracle expect
of one step."""

import dataclasses
import os

from tflms import hardware
from tflms.cli.arguments import lms_from_args
from tflms.cli.loading import PlanError


# (name, GB/s per direction): `steptime.LINKS`, theoretical peak rates;
# real copies reach roughly 80-90% of them.
LINKS = hardware.LINKS


def _silent(_):
    """A progress callback that prints nothing."""


@dataclasses.dataclass
class PlanReport:
    """Everything `plan_graph` found; `as_dict` is the --json output."""

    graph: str
    kind: str
    training: bool
    notes: list
    num_ops: int
    num_edges: int
    num_levels: int
    trainable_parameters: int
    trainable_bytes: int
    variable_bytes: int
    batch_size: object
    budget_bytes: int
    without_lms: dict
    with_lms: dict
    lms_needed: bool
    tuned: bool
    selected: bool
    params: object
    swapped_tensors: int
    swapout_bytes: int
    swapin_bytes: int
    swapout_ops: int
    swapin_ops: int
    transfer_ms: dict
    step_time: dict
    plots: list
    fits: bool
    error: object = None
    oracle: object = None
    recomputed_tensors: int = 0
    recompute_bytes: int = 0
    recompute_ops: int = 0
    ordering_edges: list = dataclasses.field(default_factory=list)
    plots_missing: object = None
    floor: object = None
    offload: object = None

    def as_dict(self):
        return dataclasses.asdict(self)


def _peak(result, budget):
    return {
        "peak_bytes": int(result.peak_device_bytes),
        "peak_level": int(result.peak_level),
        "peak_op": result.peak_op,
        "fits": bool(result.fits(budget)),
        "largest_live": [[name, int(nbytes)]
                         for name, nbytes in result.live_at_peak[:3]],
    }


def _trainable(graph):
    import tensorflow as tf
    with graph.as_default():
        variables = tf.compat.v1.trainable_variables()
    count = nbytes = 0
    for v in variables:
        if v.shape.is_fully_defined():
            n = v.shape.num_elements()
            count += n
            nbytes += n * v.dtype.base_dtype.size
    return count, nbytes


def transfer_ms(nbytes):
    """Milliseconds to move `nbytes` over each of `LINKS`, one direction."""
    return {name: nbytes / (gbps * 1e9) * 1e3 for name, gbps in LINKS}


def plan_graph(loaded, args, graph_name, progress=_silent):
    """Run LMS on the loaded graph and measure the result.

    The graph is rewritten by `LMS.run` as it would be before training;
    the report reads the plan and the simulations from its `RunResult`
    (`pipeline.plan`, the same steps every user of LMS runs).
    A plan that does not fit is reported (``fits`` False, and ``error``
    holds the auto-tuner's message when it found nothing).

    `progress(text)` is called at the start of each phase.

    Raises:
      autotune.NoGpuError, simulator.BatchSizeError, ValueError: bad input.
    """
    from tflms.tf import oracle
    graph = loaded.graph
    lms = lms_from_args(args, loaded)
    settings = lms.settings
    traced = loaded.traced
    params_count, params_bytes = (traced.trainable if traced is not None
                                  else _trainable(graph))
    before = fetches = None
    if args.oracle:
        fetches = _oracle_fetches(graph)
        before = oracle.graph_def(graph)
    progress("planning %s ops: index, roles, %s, rewrite ..." % (
        "{:,}".format(len(graph.get_operations())),
        "auto-tuning" if settings.autotune_requested
        else "plan with the given parameters"))
    run, error, lowest = _run(lms, loaded, graph_name)
    m = _measured(run, loaded, settings, lowest)
    plan = run.plan if run is not None else None
    plots, plots_missing = _plots(args, settings, m, plan, progress)
    swapout = plan.swapout_bytes() if plan else 0
    swapin = plan.swapin_bytes() if plan else 0
    shown = m.with_lms if plan is not None else m.without
    progress("predicting the step time ...")
    step_time = _step_time(_predict(m, settings), plan)
    oracle_peaks = None
    if args.oracle:
        progress("measuring with the oracle (Grappler's virtual GPU) ...")
        oracle_peaks = _oracle_report(m, settings, fetches, before,
                                      oracle.graph_def(graph) if plan
                                      else None)
    return PlanReport(
        graph=graph_name, kind=loaded.kind, training=settings.is_training,
        notes=list(loaded.notes) + (
            [_PlannedOnly.NOTE] if isinstance(run, _PlannedOnly) else []),
        num_ops=m.index.num_ops, num_edges=m.index.num_edges,
        num_levels=run.planned.original_num_levels if run else
        m.index.num_levels,
        trainable_parameters=params_count, trainable_bytes=params_bytes,
        variable_bytes=int(sum(m.index.variable_bytes)),
        batch_size=settings.batch_size, budget_bytes=int(m.budget),
        without_lms=_peak(m.without, m.budget),
        with_lms=_peak(shown, m.budget),
        lms_needed=plan is not None, tuned=settings.autotune_requested,
        params=_params(plan),
        selected=bool(plan is not None and run.planned.only_tensors
                      is not None),
        swapped_tensors=len(plan.swaps) if plan else 0,
        swapout_bytes=int(swapout), swapin_bytes=int(swapin),
        swapout_ops=len(run.swapout_ops) if run else 0,
        swapin_ops=len(run.swapin_ops) if run else 0,
        transfer_ms=transfer_ms(swapout + swapin),
        step_time=step_time,
        plots=[os.path.abspath(p) for p in plots],
        plots_missing=plots_missing,
        fits=error is None and bool(shown.fits(m.budget)), error=error,
        oracle=oracle_peaks,
        recomputed_tensors=len(plan.recomputes) if plan else 0,
        recompute_bytes=int(plan.recompute_bytes()) if plan else 0,
        recompute_ops=len(run.rewrite.recompute_ops)
        if run and run.rewrite else 0,
        offload=_offload_report(run),
        ordering_edges=[[run.planned.index.names[a],
                         run.planned.index.names[b]]
                        for a, b in run.planned.ordering_edges]
        if run else [],
        floor=m.lowest.as_dict())


def _offload_report(run):
    """What ``--offload-optimizer`` moved to the host (None: nothing)."""
    moved = None if run is None else run.offload
    if moved is None:
        return None
    names = run.planned.index.names
    return {"host": moved.host,
            "variables": [names[u.variable] for u in moved.updates],
            "slot_bytes": int(moved.slot_bytes),
            "weight_bytes": int(moved.weight_bytes),
            "moved_bytes": moved.moved_bytes(),
            "left": list(moved.left)}


def _run(lms, loaded, graph_name):
    """``(RunResult or None, the tuner's error text or None, its floor or
    None)`` of planning and rewriting the loaded graph."""
    from tflms import autotune
    from tflms.tf.adapters import graph_step, rewrite
    graph, settings = loaded.graph, lms.settings
    # Planned for the GPU of the settings, where oneDNN's CPU passes do
    # not run (`Target.onednn_cpu`), whatever this machine runs.
    target = graph_step.step_target(settings, here=False)
    try:
        if loaded.traced is None:
            run = rewrite.rewrite_session_graph(
                graph, settings, fetches=loaded.fetches, target=target)
        elif settings.offload_optimizer:
            run = _planned_offloaded(graph, settings, target)
        else:
            run = rewrite.rewrite_function_graph(graph, settings,
                                                 target=target)
    except autotune.AutotuneError as e:
        return None, str(e), e.floor
    if run.planned is None:
        raise PlanError(
            "%s already has LMS's swap operations (saved after LMS rewrote "
            "it); plan the model as it was before LMS, or save it without "
            "the LMS callback or hook" % (graph_name,))
    return run, None, None


@dataclasses.dataclass(frozen=True)
class _PlannedOnly:
    """A Keras 3 step planned with its optimizer's updates on the host and
    not rewritten: what `plan_graph` reads of a `RunResult`."""

    NOTE = ("planned with the optimizer's element-wise updates and slots "
            "on the host (--offload-optimizer); the step was planned, not "
            "rewritten")

    planned: object
    offload: object
    rewrite = None
    swapout_ops = ()
    swapin_ops = ()

    @property
    def plan(self):
        return self.planned.plan if self.planned.needed else None


def _planned_offloaded(graph, settings, target):
    """The `_PlannedOnly` of the Keras 3 step `graph` with its element-wise
    updates on the host (`offload.find_updates`): planned as `LMS.run`
    plans a step with ``offload_optimizer``, on the index with them there
    (`offload.planning_index`); the traced step's slots are on the device,
    the plan's on the host, where offload puts them. Nothing is rewritten
    (the rewrite of a tf.function step's updates is not part of this
    report)."""
    from tflms import offload, pipeline
    from tflms.tf.adapters import rewrite
    index, target = rewrite.function_graph_step(graph, settings, target)
    index, target, moved = offload.planning_step(
        index, target, settings.cpu_device, target.manages)
    log = rewrite.logger_of(settings)
    log.info(moved.describe())
    planned = pipeline.plan(index, settings,
                            roles=pipeline.classify(index, settings, target),
                            log=log, target=target)
    return _PlannedOnly(planned, moved)


@dataclasses.dataclass
class _Measured:
    """The step's index and roles, its replays without and with LMS, the
    budget and the floor; `planned` when a plan was made."""

    index: object
    roles: object
    without: object
    with_lms: object
    budget: int
    lowest: object
    planned: object = None


def _measured(run, loaded, settings, lowest):
    from tflms import autotune
    from tflms import floor as floor_mod
    from tflms import pipeline
    from tflms.tf.adapters import graph_step, rewrite
    if run is not None:
        planned = pipeline.simulate_plan(run.planned)
        budget = planned.budget_bytes
        if budget is None:  # fixed parameters: no budget was planned for
            budget = autotune.device_budget(settings.autotune_gpu_mem,
                                            settings.gpu_device)
        return _Measured(planned.index, planned.context.roles,
                         planned.without_lms, planned.with_lms, budget,
                         pipeline.step_floor(planned), planned)
    # Nothing fits: the report still shows the step without LMS (the graph
    # is unchanged).
    graph = loaded.graph
    target = graph_step.step_target(settings, here=False)
    if loaded.traced is None:
        index, target = rewrite.session_graph_step(graph, settings,
                                                   loaded.fetches, target)
    else:
        index, target = rewrite.function_graph_step(graph, settings, target)
    moved = None
    if settings.offload_optimizer:
        # As LMS.run (a Session graph) or _planned_offloaded (a Keras 3
        # step) planned it.
        from tflms import offload
        index, target, moved = offload.planning_step(
            index, target, settings.cpu_device,
            None if loaded.traced is None else target.manages)
    roles = pipeline.classify(index, settings, target)
    without = pipeline.simulate_without(index, roles, settings, moved)
    if lowest is None:
        lowest = floor_mod.floor_of(index, roles, settings.batch_size)
    budget = autotune.device_budget(settings.autotune_gpu_mem,
                                    settings.gpu_device)
    return _Measured(index, roles, without, None, budget, lowest)


def _plots(args, settings, m, plan, progress):
    """``(paths written, why the pictures are missing or None)``."""
    from tflms import autotune
    from tflms import plots as plotting
    if args.no_plots:
        return [], None
    progress("writing plots to %s ..." % settings.plot_dir)
    plots = list(plotting.write_plots(settings.plot_dir, autotune.PlotData(
        index=m.index, roles=m.roles, batch_size=settings.batch_size,
        without_lms=m.without, budget_bytes=m.budget,
        with_lms=m.with_lms if plan is not None else None)))
    if not any(p.endswith(".png") for p in plots):
        return plots, plotting.MISSING_MATPLOTLIB
    return plots, None


def _params(plan):
    if plan is None:
        return None
    p = plan.params
    return {"swapout_threshold": p.swapout_threshold,
            "swapin_ahead": p.swapin_ahead,
            "swapin_groupby": p.swapin_groupby, "sync_mode": p.sync_mode}


def _predict(m, settings):
    from tflms import steptime
    if m.planned is not None:
        return steptime.predict_planned(m.planned, gpu=settings.gpu,
                                        interconnect=settings.interconnect)
    return steptime.StepTimeModel(
        m.index, m.roles, settings.batch_size, gpu=settings.gpu,
        interconnect=settings.interconnect).predict()


def _oracle_report(m, settings, fetches, before, after):
    from tflms import pipeline
    peaks = _oracle_peaks(fetches, before, after, settings.batch_size,
                          m.budget, settings.gpu)
    if m.planned is not None and after is not None:
        # The oracle replays copies as instant; the simulator's peak above
        # counts them at the interconnect. Its count with instant copies
        # is the one to set beside the oracle's.
        peaks["with_lms"]["simulator_instant_peak_bytes"] = int(
            pipeline.instant_replay(m.planned).peak_device_bytes)
    return peaks


def _step_time(step, plan):
    """The step-time model's prediction for the report (milliseconds)."""
    from tflms import steptime
    # Offloaded updates change the step without a plan too.
    changed = plan is not None or bool(step.host_updates)
    return {
        "gpu": step.gpu,
        "interconnect": steptime.interconnect_named(step.interconnect).label,
        "without_lms_ms": step.without_lms_s * 1e3,
        "with_lms_ms": step.with_lms_s * 1e3 if changed else None,
        # Waiting for copies is never negative; the difference of the two
        # clocks can be, by rounding.
        "exposed_transfer_ms": (max(0.0, step.exposed_transfer_s * 1e3)
                                if changed else None),
    }


def _static_batch(graph_def, fetches, batch_size):
    """`graph_def` with the unknown first dimension of every placeholder the
    step reads (those `fetches` depend on) set to `batch_size`, so that
    Grappler knows every tensor's size."""
    if batch_size is None:
        return graph_def
    fixed = type(graph_def)()
    fixed.CopyFrom(graph_def)
    nodes = {node.name: node for node in fixed.node}
    seen, todo = set(), list(fetches)
    while todo:
        name = todo.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        todo.extend(i.lstrip("^").split(":")[0] for i in nodes[name].input)
    for name in seen:
        node = nodes[name]
        if node.op in ("Placeholder", "PlaceholderWithDefault") and \
                "shape" in node.attr:
            dims = node.attr["shape"].shape.dim
            if dims and dims[0].size == -1:
                dims[0].size = batch_size
    return fixed


def _oracle_fetches(graph):
    """Names of the graph's train ops, which one oracle step runs."""
    import tensorflow as tf
    names = [op.name for op in graph.get_collection(
        tf.compat.v1.GraphKeys.TRAIN_OP) if isinstance(op, tf.Operation)]
    if not names:
        raise PlanError(
            "--oracle needs the op that runs one training step: the graph "
            "has no train_op collection (tf.compat.v1.add_to_collection("
            "tf.compat.v1.GraphKeys.TRAIN_OP, train_op) before saving)")
    return names


def _oracle_peaks(fetches, before, rewritten, batch_size, budget, gpu):
    """The oracle's GPU peaks of one step without LMS (`before`, a GraphDef)
    and with it (`rewritten`, the GraphDef LMS edited, or None), each as the
    runtime replay and as Grappler's own count, on the virtual GPU of
    `gpu` (a `hardware.GPUS` name: the --gpu setting)."""
    # Imported here: the oracle loads Grappler's private modules.
    from tflms.tf import oracle
    out = {}
    for label, graph_def in (("without_lms", before),
                             ("with_lms", rewritten)):
        if graph_def is None:
            continue
        result = oracle.peak_memory(_static_batch(graph_def, fetches,
                                                  batch_size),
                                    fetches, budget, gpu=gpu)
        out[label] = {
            "runtime_peak_bytes": int(result.runtime_gpu_peak_bytes),
            "grappler_peak_bytes": int(result.raw_gpu_peak_bytes),
            "fits": bool(result.runtime_gpu_peak_bytes <= budget)}
    return out
