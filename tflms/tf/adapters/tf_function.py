"""The `tf.function` entry point: `FunctionStep`, the graph adapter of a
concrete function's `FuncGraph` (``lms.function(step)``, Keras 3's train
step, `tflms plan` of a Keras 3 model), reached through
`rewrite.rewrite_function_graph`.

The step is the function's outputs and control outputs (its updates);
the variables it reads through captured handles are resident for the
whole step, as variable ops are in a Session graph. A step whose ops sit on
two or more compute devices (a tf.distribute strategy's replicas, each on
its own device) is planned one device at a time, each for its own memory
and with its own copies of the variables.
"""

import dataclasses
import time

from tflms import analysis
from tflms import step as step_rules
from tflms.results import RunResult
from tflms.tf import function_api as _tf_function
from tflms.tf import offload_rewrite
from tflms.tf import reader
from tflms.tf.adapters.graph_step import (GraphAdapter, TrainingStep,
                                          plan_and_rewrite)

__all__ = ["FunctionStep", "step_fetches", "step_of"]


class FunctionStep(GraphAdapter):
    """The training step of a function graph (see the module docstring).

    `target`: the `target.Target` to plan for (its device and worker are
    each step's own); None: the one the step runs on here
    (`graph_step.step_target`, as every graph's)."""

    # A Keras 3 optimizer's element-wise updates move once its slots are
    # on the host (`check_offload_ready`; `lms_function` moves them).
    offload_supported = True
    offload_instead = (
        "keep the step's optimizer state on the device "
        "(offload_optimizer=False): a step planned one device at a time "
        "(a tf.distribute strategy's replicas) cannot offload it yet")

    def check_offload_ready(self, index, offload):
        offload_rewrite.check_slots_on_host(self.graph, index, offload)

    def describe_entry(self):
        return ("a tf.function step (lms.function, and Keras 3 fit, "
                "which calls it)")

    @classmethod
    def accepts(cls, graph):
        return bool(getattr(graph, "_building_function", False))

    def worker(self):
        """The `worker_devices.WorkerDevices` of the step's worker; None
        outside a multi-worker strategy."""
        return None

    def find_step(self):
        return TrainingStep(self.graph, step_fetches(self.graph),
                            worker=self.worker())

    def index(self, found):
        return step_of(found.graph, variable_devices=found.gpu_device
                       is not None)[1]

    def rewrite(self, start=None):
        """Plan and rewrite the step; a step on two or more compute devices
        one device at a time (`RunResult.of_replicas`)."""
        start = time.perf_counter() if start is None else start
        found = self.find_step()
        index = self.index(found)
        target = self.target(found)
        devices = (analysis.compute_devices(index, target)
                   if target.device is None else ())
        if len(devices) < 2:
            return plan_and_rewrite(self, found, start, index)
        return self._rewrite_per_device(found, devices, index, start)

    def _rewrite_per_device(self, found, devices, index, start):
        """Each replica's device planned for its own budget, as an LMS with
        ``gpu_device`` set to that device would plan it."""
        self.offload_supported = False  # each replica's slots: not yet
        by_device = []
        # The index as found, with each captured variable on its replica's
        # device: nothing else differs, so it is not built again.
        index = _with_captured_variables(index, found.graph,
                                         variable_devices=True)
        for device in devices:
            self.log.info(
                "Planning the replica on %s (%d of %d devices)"
                % (device, len(by_device) + 1, len(devices)))
            replica = dataclasses.replace(found, gpu_device=device)
            result = plan_and_rewrite(self, replica, time.perf_counter(),
                                      index)
            by_device.append((device, result))
            if result.rewritten:
                # The next replica is planned on the graph as now
                # rewritten.
                index = None
        return RunResult.of_replicas(by_device, time.perf_counter() - start)


def step_fetches(graph):
    """The `step.StepFetches` of the function graph `graph`: its outputs
    and control outputs."""
    ops = _tf_function.fetch_ops(graph)
    return step_rules.StepFetches(
        ops, "the function's outputs and control outputs (%d ops)"
        % len(ops))


def step_of(graph, variable_devices=False):
    """``(fetches, index)`` of the training step of the function graph
    `graph`: `step_fetches`, and the `GraphIndex` of their fan-in with the
    variables it captures resident (as `LMSFunction` plans each concrete
    function; `tflms plan` and the benchmarks plan a Keras 3 train step
    with it).

    `variable_devices`: the placeholder of a captured variable takes the
    variable's device when it has none of its own, so that a plan for
    one device of several counts on it the variables it holds (each
    replica of a tf.distribute strategy has its own copies).

    Planned on `graph_step.step_target`'s target, as `FunctionStep` plans
    it."""
    fetches = step_fetches(graph)
    return fetches, _with_captured_variables(
        reader.build_index(graph, fetches), graph, variable_devices)


def _with_captured_variables(index, graph, variable_devices=False):
    """`index` with the bytes of the variables the function graph reads
    through captured handles on their placeholders: resident for the
    whole step, as variable ops are in a Session graph
    (`GraphIndex.variable_bytes`, `trainable_bytes`); with
    `variable_devices`, each unplaced placeholder on its variable's
    device (`step_of`)."""
    variables = _tf_function.captured_variables(graph)
    if not variables:
        return index
    variable_bytes = list(index.variable_bytes)
    trainable_bytes = list(index.trainable_bytes)
    devices = list(index.devices)
    for name, v in variables.items():
        op_id = index.id_of.get(name)
        if op_id is None or not v.shape.is_fully_defined():
            continue
        nbytes = v.shape.num_elements() * v.dtype.base_dtype.size
        variable_bytes[op_id] = nbytes
        if getattr(v, "trainable", False):
            trainable_bytes[op_id] = nbytes
        if variable_devices and not devices[op_id]:
            devices[op_id] = v.device or ""
    return dataclasses.replace(index, variable_bytes=tuple(variable_bytes),
                               trainable_bytes=tuple(trainable_bytes),
                               devices=tuple(devices))
