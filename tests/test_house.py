"""The rooms of tflms/ stay small enough to read, and each name says one thing.

Walks the package with `ast` (nothing is imported) and checks:

* no module over `MAX_MODULE_LINES` lines, no class over
  `MAX_CLASS_LINES`, no function over `MAX_FUNCTION_LINES` lines or with
  more than `MAX_PARAMETERS` parameters (``self`` and ``cls`` not counted;
  ``*args`` and ``**kwargs`` count one each), except the signatures in
  `EXEMPT_SIGNATURES`, each with its reason;
* module names unique across the package (``__init__.py`` and
  ``__main__.py`` aside), so a name says which module it is;
* each set of op types defined once: no module-level ``*_TYPES`` name
  assigned in two modules, and no two ``*_TYPES`` literals of the package
  holding the same set under two names.

A failure lists every offender with its path and line.
"""

import ast
import collections
import os

from _doc_blocks import ROOT

PACKAGE = os.path.join(ROOT, "tflms")

MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 120
MAX_PARAMETERS = 8

# "path:qualified name" -> why the signature may take more parameters.
EXEMPT_SIGNATURES = {
    "tflms/lms.py:LMS.__init__": (
        "the constructor takes the settings as keyword arguments, as "
        "TFLMSv2's does (swapout_threshold, swapin_groupby, swapin_ahead, "
        "sync_mode, serialization, debug...), so that the original's "
        "programs run unchanged; each is a `Settings` field"),
}

_UNNAMED = ("__init__.py", "__main__.py")


def _modules():
    """``(path relative to ROOT, source, tree)`` of every module."""
    found = []
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    source = f.read()
                found.append((os.path.relpath(path, ROOT), source,
                              ast.parse(source, path)))
    return found


def _lines(node):
    return node.end_lineno - node.lineno + 1


def _parameters(function):
    args = function.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + bool(args.vararg) + bool(args.kwarg)


def _definitions(tree):
    """``(qualified name, node)`` of every class and function, nested ones
    included."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef,
                                  ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append((name, child))
                visit(child, name + ".")
            else:
                visit(child, prefix)
    visit(tree, "")
    return found


def size_offenders(modules):
    """Lines naming each module, class and function over its limit."""
    offenders = []
    for rel, source, tree in modules:
        lines = source.count("\n")
        if lines > MAX_MODULE_LINES:
            offenders.append("%s: module of %d lines (at most %d)"
                             % (rel, lines, MAX_MODULE_LINES))
        for name, node in _definitions(tree):
            where = "%s:%d %s" % (rel, node.lineno, name)
            if isinstance(node, ast.ClassDef):
                if _lines(node) > MAX_CLASS_LINES:
                    offenders.append("%s: class of %d lines (at most %d)" % (
                        where, _lines(node), MAX_CLASS_LINES))
                continue
            if _lines(node) > MAX_FUNCTION_LINES:
                offenders.append("%s: function of %d lines (at most %d)" % (
                    where, _lines(node), MAX_FUNCTION_LINES))
            count = _parameters(node)
            if (count > MAX_PARAMETERS
                    and "%s:%s" % (rel, name) not in EXEMPT_SIGNATURES):
                offenders.append("%s: %d parameters (at most %d)" % (
                    where, count, MAX_PARAMETERS))
    return offenders


def duplicate_module_names(modules):
    """Lines naming each module name used more than once."""
    paths = collections.defaultdict(list)
    for rel, _, _ in modules:
        name = os.path.basename(rel)
        if name not in _UNNAMED:
            paths[name].append(rel)
    return ["%s: %s" % (name, ", ".join(found))
            for name, found in sorted(paths.items()) if len(found) > 1]


def _literal_set(node):
    """The strings of a ``frozenset({...})``, ``{...}`` or
    ``frozenset((...))`` literal, or None for anything else."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "frozenset" and len(node.args) == 1):
        node = node.args[0]
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str)
            for e in node.elts):
        return frozenset(e.value for e in node.elts)
    return None


def type_set_definitions(modules):
    """``(name without a leading underscore, path, line, literal set or
    None)`` of every module-level assignment to a ``*_TYPES`` name."""
    found = []
    for rel, _, tree in modules:
        for node in tree.body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for target in targets:
                if (isinstance(target, ast.Name)
                        and target.id.endswith("_TYPES")):
                    found.append((target.id.lstrip("_"), rel, node.lineno,
                                  _literal_set(value)))
    return found


def duplicate_type_sets(modules):
    """Lines naming each op-type set defined more than once: one name in
    two modules, or one set of types under two names."""
    definitions = type_set_definitions(modules)
    offenders = []
    by_name = collections.defaultdict(list)
    by_set = collections.defaultdict(list)
    for name, rel, line, types in definitions:
        by_name[name].append("%s:%d" % (rel, line))
        if types:
            by_set[types].append("%s (%s:%d)" % (name, rel, line))
    for name, places in sorted(by_name.items()):
        if len(places) > 1:
            offenders.append("%s defined %d times: %s" % (
                name, len(places), ", ".join(places)))
    for places in by_set.values():
        names = {place.split(" ")[0] for place in places}
        if len(places) > 1 and len(names) > 1:
            offenders.append("one set of types, %d definitions: %s" % (
                len(places), ", ".join(sorted(places))))
    return offenders


def _report(what, offenders):
    return "%d %s:\n  %s" % (len(offenders), what, "\n  ".join(offenders))


def test_rooms_are_small():
    offenders = size_offenders(_modules())
    assert not offenders, _report("rooms over the limits", offenders)


def test_module_names_are_unique():
    offenders = duplicate_module_names(_modules())
    assert not offenders, _report("module names used twice", offenders)


def test_each_set_of_op_types_is_defined_once():
    offenders = duplicate_type_sets(_modules())
    assert not offenders, _report("op-type sets defined twice", offenders)


# The checks themselves, on literal modules: each must be able to fail.
def _literal(rel, source):
    return (rel, source, ast.parse(source))


def test_the_size_check_names_what_is_too_large():
    body = "".join("    x%d = %d\n" % (i, i) for i in range(120))
    long_function = "def long():\n" + body
    many = "def many(a, b, c, d, e, f, g, h, *i):\n    pass\n"
    method = ("class C:\n    def m(self, a, b, c, d, e, f, g, h):\n"
              "        pass\n")
    offenders = size_offenders([
        _literal("tflms/a.py", long_function + many + method),
        _literal("tflms/lms.py", "class LMS:\n    def __init__(self, a, b, "
                                 "c, d, e, f, g, h, i):\n        pass\n"),
        _literal("tflms/b.py", "x = 1\n" * 601)])
    assert offenders == [
        "tflms/a.py:1 long: function of 121 lines (at most 120)",
        "tflms/a.py:122 many: 9 parameters (at most 8)",
        "tflms/b.py: module of 601 lines (at most 600)"]


def test_the_name_checks_name_both_places():
    modules = [_literal("tflms/a/model.py", ""),
               _literal("tflms/b/model.py", ""),
               _literal("tflms/a/__init__.py", ""),
               _literal("tflms/__init__.py", ""),
               _literal("tflms/x.py", 'FORWARDING_TYPES = frozenset({"Id"})\n'
                                      'OTHER = {"Id"}\n'),
               _literal("tflms/y.py", '_FORWARDING_TYPES = {"Id", "Snap"}\n'
                                      'ALIAS_TYPES = frozenset(("Snap", '
                                      '"Id"))\n')]
    assert duplicate_module_names(modules) == [
        "model.py: tflms/a/model.py, tflms/b/model.py"]
    assert duplicate_type_sets(modules) == [
        "FORWARDING_TYPES defined 2 times: tflms/x.py:1, tflms/y.py:1",
        "one set of types, 2 definitions: ALIAS_TYPES (tflms/y.py:2), "
        "FORWARDING_TYPES (tflms/y.py:1)"]
