"""The pure core imports no TensorFlow, directly or through another module.

`tflms.graph_index` and the modules that answer questions from a
`GraphIndex` (analysis, planner, simulator, step-time model, ordering) and
the settings with their checks are plain Python: one module,
`tflms.tf.reader`, reads a `tf.Graph` into an index. An AST check of each
file's own imports cannot see a TensorFlow import two modules away, so this
test imports the core in a fresh interpreter in which TensorFlow (and both
Kerases) cannot be imported at all, and plans and simulates a literal graph
there.
"""

import os
import subprocess
import sys
import textwrap

CORE = ("graph_index", "graph_index.index", "graph_index.build",
        "graph_index.literal", "graph_index.sizes", "graph_index.unbatched",
        "step", "dag_levels",
        "devices", "worker_devices", "analysis", "fusions", "planner",
        "planner.types", "planner.triggers", "planner.swap_plan",
        "planner.recompute_plan", "planner.edges", "planner.prune",
        "simulator",
        "simulator.simulation_model", "simulator.buffers", "simulator.levels",
        "simulator.additions", "simulator.simulation_result", "inplace",
        "steptime", "steptime.rates", "steptime.op_costs",
        "steptime.host_updates",
        "steptime.step_time_model", "steptime.planned", "floor", "capacity",
        "hardware",
        "settings", "validation", "budget",
        "context", "autotune", "autotune.tuner", "autotune.search",
        "autotune.selection", "autotune.choice", "autotune.report",
        "stages", "stages.serialize", "stages.defer", "stages.swaps",
        "stages.order", "stages.fewer_waits", "stages.recompute",
        "stages.prefetch", "stages.timed", "stages.host", "stages.records",
        "stages.contract", "stages.tuning", "stages.order.peaks",
        "stages.order.broadcast", "stages.order.updates",
        "planner.reductions", "stages.reduce_first",
        "pipeline", "plots", "_logging", "results", "ranks", "offload",
        "offload_elementwise")

_BLOCKED = ("tensorflow", "keras", "tf_keras")

# Run with `python -c`: the finder is installed before anything imports, so
# even an import made while loading `tflms` itself is refused.
_PROGRAM = textwrap.dedent("""
    import importlib
    import sys

    BLOCKED = %(blocked)r

    class NoTensorFlow:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError("the pure core imported %%s" %% name)
            return None

    sys.meta_path.insert(0, NoTensorFlow())

    for module in %(core)r:
        importlib.import_module("tflms." + module)

    from tflms import analysis, graph_index, planner, simulator, steptime
    from tflms import settings

    # A chain of device ops read again at the end, as a forward pass is by
    # its gradients: x -> a -> b -> c -> d -> e, and e reads a and x (a
    # placeholder, fed, so never swapped). b and c are the large ones:
    # swapping a out lowers the peak they make by its 1000 bytes. Matrix
    # products, so that no op writes into its input's buffer.
    sizes = {"x": 1000, "a": 1000, "b": 5000, "c": 5000, "d": 100, "e": 10}
    names = list(sizes)
    index = graph_index.from_edges(
        [(n, "Placeholder" if n == "x" else "MatMul",
          {"outputs": [sizes[n]]})
         for n in names],
        edges=[(p, c) for p, c in zip(names, names[1:])]
        + [("a", "e"), ("x", "e")])
    roles = analysis.classify_ops(index)
    assert roles.device_ops, roles
    plan = planner.make_plan(index, roles, planner.SwapParams(
        swapout_threshold=2, swapin_ahead=1, swapin_groupby=0, sync_mode=0))
    swapped = sorted(index.names[s.producer] for s in plan.swaps)
    assert swapped == ["a"], swapped
    model = simulator.SimulationModel(index, roles)
    without, with_lms = model.replay(None), model.replay(plan)
    assert without.peak_device_bytes - with_lms.peak_device_bytes == 1000, (
        without.peak_device_bytes, with_lms.peak_device_bytes)
    steptime.StepTimeModel(index, roles).predict(plan)
    settings.Settings(gpu_device="/device:GPU:0", cpu_device="/cpu:0")

    # The whole pipeline, auto-tuned and logging, as LMS.run plans: the
    # budget leaves room for everything but a's 1000 bytes.
    from tflms import pipeline
    from tflms._logging import Logger
    budget = without.peak_device_bytes - 1000
    planned = pipeline.plan(index, settings.Settings(
        autotune_gpu_mem=budget / float(1 << 30), interconnect="instant"),
        env={"TF_LMS_SIMULATOR_MEM_RATIO": "1"}, log=Logger(debug=True))
    assert planned.autotuned and planned.plan is not None
    assert planned.with_lms.peak_device_bytes <= budget

    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("pure core ok")
""")


def test_core_plans_and_simulates_without_tensorflow():
    program = _PROGRAM % {"blocked": _BLOCKED, "core": CORE}
    # `python -c` puts its working directory first on sys.path: run it in
    # this checkout, so its tflms is the one imported.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", program], cwd=root,
                          capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("pure core ok"), done.stdout


def test_core_lists_every_module_of_its_packages():
    """A module added to a core package is imported above too."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), "tflms")
    for package in CORE:
        folder = os.path.join(root, package.replace(".", os.sep))
        if not os.path.isdir(folder):
            continue
        modules = {"%s.%s" % (package, name[:-3])
                   for name in os.listdir(folder)
                   if name.endswith(".py") and name != "__init__.py"}
        assert modules <= set(CORE), sorted(modules - set(CORE))
