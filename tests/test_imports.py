"""The modules of tflms import one another without a cycle, and each only
from its own layer or a lower one.

The graph is read from the source (`ast`), so it holds every import, also
those made inside functions (and a module-level ``__getattr__``): an import
deferred to a function still makes the two modules depend on each other,
and a cycle hidden that way is what this test exists to catch.

The layers, from the bottom: the pure core (every module outside the
others: no TensorFlow); the TensorFlow wing (`tflms.tf`, the oracle
included: it measures graphs with Grappler); `tflms.lms`; the command line and
the package's own ``__init__`` / ``__main__``.
"""

import ast
import os

import pytest

PACKAGE = "tflms"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), PACKAGE)


# What each stack imports: run on both (tools/run_tests.sh).
pytestmark = pytest.mark.both_stacks


def _modules():
    """tflms' modules by their names below the package: ``"dag_levels"``, a
    subpackage by its own name (``"planner"``, its ``__init__``) and its
    modules by dotted names (``"planner.swap_plan"``); tflms' own
    ``__init__`` is ``"__init__"``."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d.isidentifier())
        package = os.path.relpath(folder, ROOT).replace(os.sep, ".")
        for name in files:
            if not name.endswith(".py"):
                continue
            stem = name[:-3]
            if package == ".":
                found.append(stem)
            elif stem == "__init__":
                found.append(package)
            else:
                found.append(package + "." + stem)
    return sorted(found)


def _path(module):
    parts = module.split(".")
    if module != "__init__" and os.path.isdir(os.path.join(ROOT, *parts)):
        parts.append("__init__")
    return os.path.join(ROOT, *parts) + ".py"


def _module_of(name, modules, package=PACKAGE):
    """The module of `package` a dotted import name is in (the longest
    prefix that is one), or None."""
    parts = name.split(".")
    if parts[0] != package:
        return None
    for end in range(len(parts), 1, -1):
        module = ".".join(parts[1:end])
        if module in modules:
            return module
    return None


def _imported(tree, modules, package=PACKAGE):
    """The modules of `package` (tflms) `tree` imports, wherever the import
    is."""
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                raise AssertionError("relative import of %s; tflms imports "
                                     "absolutely" % node.module)
            # `from tflms.stages import timed` imports the module timed,
            # `from tflms.planner import make_plan` the package planner.
            names = ["%s.%s" % (node.module, a.name) for a in node.names]
        for name in names:
            module = _module_of(name, modules, package)
            if module is not None:
                found.add(module)
    return found


def import_graph():
    """Module name -> the tflms modules it imports (``__init__`` included)."""
    modules = set(_modules())
    graph = {}
    for module in sorted(modules):
        with open(_path(module), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        graph[module] = sorted(_imported(tree, modules) - {module})
    return graph


def find_cycle(graph):
    """One cycle of `graph` as a list of nodes (first == last), or None."""
    state = {}  # node -> 1 on the current path, 2 done
    path = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_tflms_imports_have_no_cycle():
    graph = import_graph()
    assert {"graph_index", "settings", "tf.reader", "planner",
            "planner.swap_plan", "autotune", "autotune.search"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_benchmarks_imports_have_no_cycle():
    """The benchmarks (a flat folder) import one another without a cycle
    either: what two of them need sits in a module both import."""
    folder = os.path.join(os.path.dirname(ROOT), "benchmarks")
    modules = {name[:-3] for name in os.listdir(folder)
               if name.endswith(".py") and name != "__init__.py"}
    graph = {}
    for module in sorted(modules):
        with open(os.path.join(folder, module + ".py"),
                  encoding="utf-8") as f:
            tree = ast.parse(f.read())
        graph[module] = sorted(
            _imported(tree, modules, "benchmarks") - {module})
    assert {"common", "measure"} <= set(graph["capacity"])
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("graph, cycle", [
    ({"a": ["b"], "b": ["c"], "c": ["a"]}, ["a", "b", "c", "a"]),
    ({"a": ["b", "c"], "b": [], "c": ["c"]}, ["c", "c"]),
    ({"a": ["b", "c"], "b": ["c"], "c": []}, None),
])
def test_find_cycle(graph, cycle):
    assert find_cycle(graph) == cycle


def test_deferred_imports_and_forwarders_count():
    tree = ast.parse(
        "from tflms import dag_levels\n"
        "def f():\n"
        "    from tflms.planner import make_plan\n"
        "def __getattr__(name):\n"
        "    from tflms.tf import reader\n")
    assert _imported(tree, {"dag_levels", "planner", "tf", "tf.reader"}) == {
        "dag_levels", "planner", "tf.reader"}


def test_a_subpackage_module_is_its_own_node():
    tree = ast.parse(
        "from tflms.stages import timed\n"
        "from tflms.planner import make_plan\n"
        "from tflms.autotune.search import Simulations\n"
        "import tflms.oracle.trace\n")
    modules = {"stages", "stages.timed", "planner", "planner.swap_plan",
               "autotune", "autotune.search", "oracle", "oracle.trace"}
    assert _imported(tree, modules) == {
        "stages.timed", "planner", "autotune.search", "oracle.trace"}


# The settings and the log sit below the planning and the graph editing:
# what they import must not pull those in.
LOW_LEVEL = {
    "settings": {"_argparse_types", "hardware", "validation", "devices",
                 "errors"},
    "_logging": {"ranks"},
}


@pytest.mark.parametrize("module", sorted(LOW_LEVEL))
def test_low_level_modules_import_only_low_level_ones(module):
    graph = import_graph()
    reached, stack = set(), [module]
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                stack.append(nxt)
    assert reached <= LOW_LEVEL[module], sorted(reached - LOW_LEVEL[module])


def layer(module):
    """0: the pure core; 1: the TensorFlow wing (the oracle included); 2: the
    LMS object; 3: the command line and the package's entry files."""
    top = module.split(".")[0]
    if top in ("cli", "__init__", "__main__"):
        return 3
    if top == "lms":
        return 2
    if top == "tf":
        return 1
    return 0


def upward_imports(graph):
    """``(module, imported)`` pairs where a module imports a higher layer."""
    return sorted((module, other) for module, imported in graph.items()
                  for other in imported if layer(other) > layer(module))


def test_no_module_imports_a_higher_layer():
    graph = import_graph()
    assert {layer("planner.types"), layer("tf.adapters.keras3"),
            layer("lms"), layer("cli.planning")} == {0, 1, 2, 3}
    assert upward_imports(graph) == []


def test_an_upward_import_is_found():
    graph = {"analysis": ["tf.reader"], "tf.reader": ["graph_index"],
             "lms": ["tf.adapters"], "cli.commands": ["lms"]}
    assert upward_imports(graph) == [("analysis", "tf.reader")]


def test_the_command_line_imports_are_plain_imports():
    """The command line loads TensorFlow only once a command runs, by
    imports inside its functions, which this test's graph sees: no
    stand-in modules named by strings."""
    graph = import_graph()
    cli_imports = {m for name, imported in graph.items()
                   if name.startswith("cli") for m in imported}
    assert {"tf.reader", "pipeline", "lms"} <= cli_imports
    for module in graph:
        if module.startswith("cli"):
            with open(_path(module), encoding="utf-8") as f:
                assert "Lazy(" not in f.read(), module


# ---- a test file per module -------------------------------------------------
# Modules no test file is named after: the package's own entry points
# (tests/test_cli.py runs them) and the TensorFlow wing's __init__, which
# only registers the device lister (tests/test_budget.py).
# The planning stages' modules (`tflms.stages.STAGES`); what they share
# (records, contract, timed, tuning) is not a stage.
STAGE_MODULES = ("serialize", "reduce_first", "defer", "swaps", "order",
                 "fewer_waits", "recompute", "prefetch", "host")


def stage_of(module):
    """The stage a tflms module belongs to (``"order"`` for
    ``stages.order.peaks``), or None."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "stages" and \
            parts[1] in STAGE_MODULES:
        return parts[1]
    return None


def cross_stage_imports(graph):
    """``(module, imported)`` pairs where one stage imports another."""
    return sorted((m, i) for m, imported in graph.items() for i in imported
                  if stage_of(m) and stage_of(i)
                  and stage_of(m) != stage_of(i))


def test_no_stage_imports_another():
    assert cross_stage_imports(import_graph()) == []


def test_a_cross_stage_import_is_found():
    graph = {"stages.order": ["stages.order.peaks", "stages.records"],
             "stages.prefetch": ["stages.fewer_waits", "stages.timed"],
             "stages.order.peaks": ["stages.timed"]}
    assert cross_stage_imports(graph) == [
        ("stages.prefetch", "stages.fewer_waits")]


UNNAMED = {"__init__", "__main__", "tf"}


def covering_test_names(module):
    """The names of tests/test_<name>.py that cover `module`: its own
    (without a leading underscore), or one of its packages'; `tf` is the
    wing, not a package of the rule (``tf.reader`` is test_reader.py)."""
    parts = module.split(".")
    names = {parts[-1].lstrip("_")}
    names.update(p for p in parts[:-1] if p != "tf")
    return names


def modules_without_tests(modules, test_files):
    """The modules none of whose `covering_test_names` is in `test_files`
    (``test_x.py`` names)."""
    have = {f[len("test_"):-len(".py")] for f in test_files
            if f.startswith("test_") and f.endswith(".py")}
    return sorted(m for m in modules
                  if m not in UNNAMED and not covering_test_names(m) & have)


def test_every_module_has_its_test_file():
    tests = os.listdir(os.path.dirname(os.path.abspath(__file__)))
    missing = modules_without_tests(_modules(), tests)
    assert not missing, (
        "these tflms modules have no tests/test_<module>.py (or "
        "test_<package>.py for a module of a package other than tf): %s"
        % ", ".join(missing))


def test_a_module_without_its_test_file_is_found():
    modules = ["ranks", "_gc", "planner", "planner.swaps",
               "tf.reader", "tf.adapters.keras2", "tf", "__main__"]
    assert modules_without_tests(
        modules, ["test_gc.py", "test_planner.py", "test_adapters.py",
                  "_graphs.py", "test_tf.py"]) == ["ranks", "tf.reader"]
