"""What every planning stage reads, built once per plan.

`PlanningContext.create(index, settings, target=...)` classifies the
step's ops on its `target.Target` (devices, host, fusion rules), reads the
budgets (`Budgets`) and holds the log and how plans are judged
(`Judging`); the stages of `tflms.stages` read it and never build these
again. The simulation and step-time models of a planning index are made on
first use and kept: the tuner, the ordering search, fewer waits and
recompute all replay plans on the same index, and one model serves them
all (a step-time model is the costlier of the two to make).

Pure: the index is plain data; the GPU's memory, when auto-tuning is asked
for without ``autotune_gpu_mem``, comes from the device lister the
TensorFlow wing registers with `budget`.
"""

import dataclasses
from typing import TYPE_CHECKING, Optional, Tuple, Union

from tflms import analysis
from tflms import hardware
from tflms import budget as budget_mod
from tflms import offload as offload_rules
from tflms import planner
from tflms import simulator
from tflms import steptime
from tflms._logging import Logger
from tflms.settings import Settings
from tflms.target import Target

if TYPE_CHECKING:
    from tflms.graph_index.index import GraphIndex

__all__ = ["PlanningContext", "Budgets", "Judging", "classify"]
# `Settings` filter name -> the `analysis.classify_ops` filter it feeds, as
# (key, scopes setting, types setting).
_FILTER_PAIRS = (
    ("incl_sources", "incl_output_by_scopes", "incl_output_by_types"),
    ("excl_sources", "excl_output_by_scopes", "excl_output_by_types"),
    ("incl_sinks", "incl_input_by_scopes", "incl_input_by_types"),
    ("excl_sinks", "excl_input_by_scopes", "excl_input_by_types"),
)


def classify(index, settings, target=None):
    """The `OpRoles` of `index` under `settings` (its filters) on `target`
    (a `target.Target`: the devices managed, the fusion rules; default:
    `Target.of(settings)`).

    Raises:
      ValueError: a filter or `gpu_device` that matches no operation.
    """
    if target is None:
        target = Target.of(settings)
    filters = {}
    for key, scopes_name, types_name in _FILTER_PAIRS:
        scopes = getattr(settings, scopes_name)
        types = getattr(settings, types_name)
        if scopes or types:
            filters[key] = analysis.ops_matching(
                index, scopes, types, "%s/%s" % (scopes_name, types_name))
    roles = analysis.classify_ops(index, target, settings.is_training,
                                  filters)
    if target.device is not None and not roles.device_ops:
        raise ValueError(
            "gpu_device=%r matches no operation in the graph; ops are "
            "placed on %s. Use one of those, or None for every device but "
            "the host cpu_device." % (target.device,
                                      _device_summary(index)))
    return roles


def _device_summary(index):
    devices = sorted({d or "(unplaced)" for d in index.devices})
    return ", ".join(devices[:6]) + (" ..." if len(devices) > 6 else "")


@dataclasses.dataclass(frozen=True)
class Budgets:
    """The memory a plan may use, as this machine and the settings give it.

    Attributes:
      device_bytes: device bytes a tuned plan may use (None when the
        parameters are fixed: nothing is tuned to a budget).
      host_bytes: host bytes the swapped tensors may use at once
        (`budget.host_budget`; 0: unknown, no limit).
      local_processes: training processes on this node (the host budget
        is shared by them).
    """

    device_bytes: Optional[int] = None
    host_bytes: int = 0
    local_processes: int = 1

    @classmethod
    def read(cls, settings, env=None, list_devices=None, device=None):
        """The budgets of planning with `settings` on this machine for
        `device` (default: the settings' ``gpu_device``; a
        `target.Target`'s device); `env` (default `os.environ`) and
        `list_devices` stand in for the machine in tests.

        Raises:
          ValueError: a bad ``TF_LMS_SIMULATOR_MEM_RATIO``.
          budget.NoGpuError: auto-tuning without a GPU or
            ``autotune_gpu_mem``.
        """
        device_bytes = None
        if settings.autotune_requested:
            device_bytes = budget_mod.device_budget(
                settings.autotune_gpu_mem, device or settings.gpu_device,
                env, list_devices)
        return cls(device_bytes=device_bytes,
                   host_bytes=budget_mod.host_budget(
                       env, settings.autotune_host_mem),
                   local_processes=budget_mod.local_processes(env))


@dataclasses.dataclass(frozen=True)
class Judging:
    """How candidate plans are judged, beyond what the settings say.

    Attributes:
      by_step_time: choose among fitting plans by predicted step time
        (False: by bytes moved; benchmarks compare the two).
      select: let the tuner choose tensors when the threshold is on auto
        (tests turn it off to pin the threshold search).
      extra_edges: control edges the simulator adds beyond the index's own
        planned edges (tests).
      gpu, interconnect: a `hardware.Gpu` and `hardware.Interconnect` (or
        their names) to time plans on instead of the settings' `gpu` and
        `interconnect` (hardware not in the tables, in tests); None: the
        settings'.
    """

    by_step_time: bool = True
    select: bool = True
    extra_edges: Tuple[Tuple[int, int], ...] = ()
    gpu: Union[str, hardware.Gpu, None] = None
    interconnect: Union[str, hardware.Interconnect, None] = None


@dataclasses.dataclass(frozen=True, eq=False)
class PlanningContext:
    """The inputs of one plan, shared by its stages.

    Attributes:
      settings: the `Settings` planned with.
      target: the `target.Target` planned for (devices, host, fusion
        rules).
      given_index: the index of the step as given (no edges of LMS's own).
      roles: the `analysis.OpRoles` of the step.
      log: the `Logger` of the planning lines.
      budgets: the `Budgets` planned for.
      judging: the `Judging` of candidate plans.
      gpu, interconnect: the `hardware.Gpu` and `hardware.Interconnect`
        plans are timed on (`judging`'s, else the settings').
    """

    settings: Settings
    given_index: "GraphIndex"
    roles: analysis.OpRoles
    log: Logger
    target: Target = Target()
    budgets: Budgets = Budgets()
    judging: Judging = Judging()
    gpu: Optional[hardware.Gpu] = None
    interconnect: Optional[hardware.Interconnect] = None
    # id(index) -> (index, model): the index is kept so its id stays its own.
    _models: dict = dataclasses.field(default_factory=dict, repr=False)
    _timers: dict = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def create(cls, index, settings, roles=None, log=None, budgets=None,
               judging=None, target=None):
        """The context of planning `index` with `settings`.

        Args:
          index: the `GraphIndex` of the step.
          settings: a `Settings`.
          roles: its `classify` result, if already made.
          log: a `Logger` (default: quiet).
          budgets: the `Budgets` (default: `Budgets.read(settings)`, from
            this machine).
          judging: a `Judging` (default: by predicted step time, on the
            settings' hardware).
          target: the `target.Target` (default: `Target.of(settings)`).

        Raises:
          ValueError: bad filters or device (`classify`), or a bad
            ``TF_LMS_SIMULATOR_MEM_RATIO``.
          budget.NoGpuError: auto-tuning without a GPU or
            ``autotune_gpu_mem``.
        """
        if target is None:
            target = Target.of(settings)
        if roles is None:
            roles = classify(index, settings, target)
        if budgets is None:
            budgets = Budgets.read(settings, device=target.device)
        judging = judging or Judging()
        return cls(settings=settings, given_index=index, roles=roles,
                   log=log or Logger(), target=target, budgets=budgets,
                   judging=dataclasses.replace(
                       judging, extra_edges=tuple(judging.extra_edges)),
                   gpu=hardware.gpu_named(judging.gpu or settings.gpu),
                   interconnect=hardware.interconnect_named(
                       judging.interconnect or settings.interconnect))

    @property
    def offload(self):
        """With ``offload_optimizer``, the target's `tflms.offload.Offload`
        (its updates on the host, `offload.planning_index`): the step-time
        models time its copies and host compute, and the simulation models
        count the device buffer each write-back adds; None without."""
        return self.target.offload

    @property
    def batch_size(self):
        return self.settings.batch_size

    @property
    def budget_bytes(self):
        """Device bytes a tuned plan may use (`Budgets.device_bytes`)."""
        return self.budgets.device_bytes

    @property
    def requested(self):
        """The swap parameters as the user set them (-1: auto)."""
        s = self.settings
        return planner.SwapParams(s.swapout_threshold, s.swapin_ahead,
                                  s.swapin_groupby, s.sync_mode)

    def model(self, index):
        """The `simulator.SimulationModel` of `index` (made once)."""
        kept = self._models.get(id(index))
        if kept is None:
            kept = self._models[id(index)] = (index, simulator.SimulationModel(
                index, self.roles, self.batch_size,
                extra_edges=self.judging.extra_edges,
                landings=offload_rules.write_back_buffers(self.offload,
                                                          index)))
        return kept[1]

    def timer(self, index):
        """The `steptime.StepTimeModel` of `index` on the settings' GPU and
        link (made once, on first use)."""
        kept = self._timers.get(id(index))
        if kept is None:
            kept = self._timers[id(index)] = (index, steptime.StepTimeModel(
                index, self.roles, self.batch_size, gpu=self.gpu,
                interconnect=self.interconnect, offload=self.offload))
        return kept[1]
