"""Literal graphs (`graph_index.from_edges`) the stage tests plan on: no
TensorFlow graph is built, so each plan takes milliseconds."""

from tflms import budget
from tflms import graph_index as gi
from tflms.context import Budgets, PlanningContext
from tflms.settings import Settings

U = 1 << 20  # bytes of one activation
# The budget is autotune_gpu_mem exactly.
EXACT = {budget.MEM_RATIO_ENV: "1"}


def chain(depth=6):
    """x -> f1 .. f{depth} (Relu, U bytes each), then the mirrored backward
    pass: g{depth} = Relu(f{depth}), g{k} = Mul(g{k+1}, f{k}) down to g1.

    Every f{k} is read again by g{k}, 2 * (depth - k) + 1 levels after it
    was made, so the far ones are swap candidates. Without LMS the peak is
    at g{depth}'s level: every f and g{depth}, (depth + 1) U.
    """
    ops = [("x", "Placeholder", {"outputs": [U]})]
    edges = []
    prev = "x"
    for k in range(1, depth + 1):
        ops.append(("f%d" % k, "Relu", {"outputs": [U]}))
        edges.append((prev, "f%d" % k))
        prev = "f%d" % k
    ops.append(("g%d" % depth, "Relu", {"outputs": [U]}))
    edges.append((prev, "g%d" % depth))
    for k in range(depth - 1, 0, -1):
        ops.append(("g%d" % k, "Mul", {"outputs": [U]}))
        edges += [("g%d" % (k + 1), "g%d" % k), ("f%d" % k, "g%d" % k)]
    return gi.from_edges(ops, edges=edges)


def context(index, **settings):
    """The `PlanningContext` of `index` with `settings`; a budget in units
    of `U` is given as ``budget_units``."""
    units = settings.pop("budget_units", None)
    if units is not None:
        settings["autotune_gpu_mem"] = units * U / float(1 << 30)
    settings = Settings(**settings)
    return PlanningContext.create(index, settings,
                                  budgets=Budgets.read(settings, EXACT))


def ids(index):
    return {name: k for k, name in enumerate(index.names)}
