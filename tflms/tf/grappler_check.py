"""What Grappler does to a training step with LMS's edits and without.

LMS promises that its edits leave Grappler's rewrites as they were: the
same ops fused into the same kernels, the same nodes removed or merged,
the same operands in the same order (`tflms.fusions.grappler_groups` holds
the rules planning follows to keep that promise). `check` tests the
promise on the step itself instead of on rules: it runs Grappler's meta
optimizer (``tf_optimizer.OptimizeGraph``, the pass a Session or a
`tf.function` call runs before the executor) on the step before and after
the rewrite, with the configuration the runtime would use (the eager
context's for a function graph, a Session's default for a graph), and
compares the two optimized graphs with LMS's own ops taken out:

* every LMS op (swap-out, swap-in, recompute clone) is dropped and each
  input that read one reads what it stands for: a swap-in the tensor
  swapped out, a clone the output of the op it copies;
* what changes no number is not compared: pass-through nodes
  (``Identity``, ``IdentityN``, ``Snapshot``: their readers read what they
  read; the ``IdentityN`` nodes kept are counted, since one kept changes
  which products the arithmetic optimizer sees together), ``NoOp`` nodes,
  constants (read by value: which of two equal constants Grappler keeps
  depends on the graph), the order of a two-operand commutative op's
  operands, and a node common-subexpression elimination kept under its
  twin's name;
* then, node by node (Grappler keeps the names of the nodes it keeps and
  names the nodes it makes after the ones they replace): a node in one
  graph only (``removed`` / ``added``: merged, fused or folded in one
  graph and not the other), the same node as another op (``op``: a fused
  kernel in one, its parts in the other; ``_Fused*`` ops are told apart by
  what they fused), the same operands in another order (``order``: an
  ``AddN`` of three or more sums in another order), or other operands
  (``inputs``: a chain of ``Mul`` or ``Add`` grouped otherwise). Control
  inputs are not compared: LMS adds its own by design, and a control edge
  that stops a fusion shows as the fusion missing.

Each `Difference` names the ops of the step involved and the LMS ops and
control edges next to them in the rewritten graph (`Difference.swaps`,
`Difference.edges`): what planning would have to leave out for Grappler
to do what it did without LMS. Grappler passes that run outside the meta
optimizer (oneDNN's layout pass, `fusions.fusion_partners`) are not seen.

The report also lists the ``AddN`` nodes Grappler's memory optimizer
turned into accumulations in each optimized step
(`GrapplerReport.accumulated`): which ones follows from Grappler's
estimate of the whole step's memory, which LMS's swaps move, and no rule
of planning's keeps it (docs/tf2.md, "Grappler's memory optimizer").

The graphs are not modified: both are converted to `GraphDef` first (a
function graph with its captured variables as variable ops,
`tflms.tf.oracle.functions.graph_def`, and its inputs with their shapes:
`OptimizeGraph` would take them for feeds, whose shapes the memory
optimizer does not trust, and the runtime does not), and each node
without a device is placed on this process's CPU, as the runtime places
it here before Grappler runs.
"""

import collections
import dataclasses
import hashlib
import time

from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.eager import context as eager_context
from tensorflow.python.grappler import tf_optimizer

from tflms.tf import rewriter
from tflms.tf.oracle import functions

__all__ = ["Difference", "GrapplerReport", "LMS_NAME_MARKERS",
           "CLONE_MARKER", "accumulated_addns", "check", "clone_original",
           "config_for", "graph_def_of", "is_lms_name", "optimize",
           "optimize_original"]

# Every swap op, recompute clone and offload op LMS adds has one of these
# in its name (the rewriter's names for them).
LMS_NAME_MARKERS = rewriter.OP_NAME_MARKERS
# What names a recompute clone (`rewriter.clone_op_name`).
CLONE_MARKER = "-" + rewriter.swap_op_name("recompute", "")
_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def is_lms_name(name):
    """True if an op named `name` is one LMS added."""
    return any(marker in name for marker in LMS_NAME_MARKERS)


@dataclasses.dataclass(frozen=True)
class Difference:
    """One node Grappler treated otherwise with LMS's edits.

    Attributes:
      kind: ``removed`` (the node is in the optimized step without LMS
        only), ``added`` (with LMS only), ``op`` (another op: fused in one
        and not the other), ``order`` (the same operands in another order)
        or ``inputs`` (other operands).
      node: the node's name in the optimized graphs.
      without / with_lms: the node as ``op(input, ...)`` in each optimized
        graph (LMS's ops taken out), "" where it is absent.
      ops: the ops of the step involved: the node and the producers of its
        operands, as named in the graph.
      swaps: the LMS ops of the rewritten graph reading or feeding those
        ops, or joined to them by a control edge.
      edges: control edges ``(from, to)`` LMS added between two of the
        step's ops where one is among `ops`.
    """

    kind: str
    node: str
    without: str
    with_lms: str
    ops: tuple
    swaps: tuple = ()
    edges: tuple = ()

    def describe(self):
        """One line: what differs and what LMS put next to it."""
        line = "%s %s: without LMS %s, with LMS %s" % (
            self.kind, self.node, self.without or "(none)",
            self.with_lms or "(none)")
        if self.swaps:
            line += "; LMS ops next to it: %s" % ", ".join(self.swaps)
        if self.edges:
            line += "; LMS control edges: %s" % ", ".join(
                "%s -> %s" % e for e in self.edges)
        return line


@dataclasses.dataclass(frozen=True)
class GrapplerReport:
    """What `check` found.

    Attributes:
      differences: the `Difference` of every node Grappler treated
        otherwise, sorted by node name.
      kernels_differ: ``{op type: (without, with)}`` of the op types whose
        count differs between the optimized steps (LMS's ops taken out):
        ``_FusedConv2D``, ``AddN``... made or not.
      nodes: nodes of the optimized steps ``(without, with)``, LMS's ops
        of the second taken out.
      seconds: the time the check took (both optimizations included).
      accumulated: ``(without, with)``: the names of the ``AddN`` nodes
        Grappler's memory optimizer turned into accumulations into a
        temporary variable in each optimized step (docs/tf2.md,
        "Grappler's memory optimizer"), sorted.
      identity_n_kept: the step's ``IdentityN`` nodes Grappler kept with
        LMS's edits and removed without them, sorted (compared as read
        through, they are no `Difference`; Keras 3's ``IdentityN`` of the
        gradients kept changes how the products after it are grouped).
    """

    differences: tuple
    kernels_differ: dict
    nodes: tuple
    seconds: float
    accumulated: tuple = ((), ())
    identity_n_kept: tuple = ()

    @property
    def same(self):
        """True if Grappler did the same with LMS's edits as without."""
        return not self.differences and not self.kernels_differ

    def swaps(self):
        """The LMS ops next to any difference, each once, sorted."""
        return sorted({s for d in self.differences for s in d.swaps})

    def lines(self, limit=20):
        """Lines for a log or a report: a summary, then up to `limit`
        differences."""
        if self.same:
            return ["Grappler optimized the step the same with LMS's edits "
                    "as without (%d nodes; checked in %.2f s)"
                    % (self.nodes[0], self.seconds)]
        out = ["Grappler optimized the step differently with LMS's edits: "
               "%d nodes differ (%d and %d nodes; checked in %.2f s)"
               % (len(self.differences), self.nodes[0], self.nodes[1],
                  self.seconds)]
        if self.accumulated[0] != self.accumulated[1]:
            out.append("  AddNs accumulated by the memory optimizer: "
                       "without LMS %s, with LMS %s" % tuple(
                           ", ".join(names) or "none"
                           for names in self.accumulated))
        if self.identity_n_kept:
            out.append("  IdentityN kept with LMS only: %s"
                       % ", ".join(self.identity_n_kept[:3])
                       + (" and %d more" % (len(self.identity_n_kept) - 3)
                          if len(self.identity_n_kept) > 3 else ""))
        if self.kernels_differ:
            out.append("  op counts (without, with): " + ", ".join(
                "%s %d -> %d" % (k, a, b)
                for k, (a, b) in sorted(self.kernels_differ.items())))
        for d in self.differences[:limit]:
            out.append("  " + d.describe())
        if len(self.differences) > limit:
            out.append("  ... and %d more"
                       % (len(self.differences) - limit))
        return out


def graph_def_of(graph, function_inputs=None):
    """A `GraphDef` of `graph` (a `tf.Graph`, a `FuncGraph` or a
    `GraphDef`, copied) as Grappler sees it here: a function graph's
    captured variables as variable ops and its inputs with their shapes
    (`_inputs_with_shapes`), every node without a device on this
    process's CPU.

    `function_inputs`: whether to give the graph's input placeholders
    their shapes as a function's; None: where `graph` is a `FuncGraph`.
    False makes the GraphDef a copy of the step can be imported from
    (`rewriter.apply_plan_to_copy`); True, that copy's once edited."""
    if isinstance(graph, graph_pb2.GraphDef):
        result = graph_pb2.GraphDef()
        result.CopyFrom(graph)
    else:
        result = functions.graph_def(graph)
    if function_inputs is None:
        function_inputs = (not isinstance(graph, graph_pb2.GraphDef)
                           and functions.is_function_graph(graph))
    if function_inputs:
        _inputs_with_shapes(result)
    for node in result.node:
        if not node.device:
            node.device = _CPU
    return result


# A function's inputs are `_Arg` nodes when the runtime optimizes it, and
# Grappler knows their shapes. `OptimizeGraph` takes every `Placeholder` of
# a graph for a feed instead, and the passes that ask for shapes "without
# trusting the feeds" (the memory optimizer's `AddN` rewrite:
# `GraphProperties::InferStatically(false)`) see none: so each input
# placeholder becomes a `PlaceholderWithDefault` (no feed) with the input's
# shape, over a placeholder without one that stands for the value.
_FEED_SUFFIX = "/grappler_check_feed"
_OPAQUE = (types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT)


def _inputs_with_shapes(graph_def):
    for node in list(graph_def.node):
        if node.op != "Placeholder" or (
                node.attr["dtype"].type in _OPAQUE):
            continue
        feed = graph_def.node.add()
        feed.CopyFrom(node)
        feed.name = node.name + _FEED_SUFFIX
        feed.attr["shape"].shape.Clear()
        feed.attr["shape"].shape.unknown_rank = True
        node.op = "PlaceholderWithDefault"
        node.input.append(feed.name)


def config_for(graph):
    """The configuration the runtime optimizes `graph` with: the eager
    context's for a function graph (what a `tf.function` call uses), a
    Session's default otherwise."""
    config = config_pb2.ConfigProto()
    if not isinstance(graph, graph_pb2.GraphDef) and (
            functions.is_function_graph(graph)):
        config.CopyFrom(eager_context.context().config)
    return config


def optimize(graph_def, fetch_names, config=None):
    """`graph_def` optimized by Grappler's meta optimizer with `config` (a
    ``ConfigProto``; default a Session's), keeping the nodes named in
    `fetch_names` (the step's fetches): a new `GraphDef`."""
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    keep = meta.collection_def["train_op"].node_list.value
    for name in fetch_names:
        keep.append(name)
    return tf_optimizer.OptimizeGraph(
        config if config is not None else config_pb2.ConfigProto(), meta,
        verbose=False)


def _split(ref):
    """``(op name, output)`` of a NodeDef data input."""
    name, _, output = ref.partition(":")
    return name, int(output) if output else 0


def clone_original(name):
    """The op a recompute clone named `name` copies (its name starts with
    that op's, `tflms.tf.rewriter.clone_op_name`)."""
    prefix = name.split(CLONE_MARKER)[0]
    return prefix.split(">")[0]


# Nodes that hand a tensor on unchanged (their readers are compared as
# reading what they read) and nodes that compute nothing or a constant:
# Grappler keeps, removes or shares them as control edges allow, which
# changes no number.
_PASS_THROUGH = frozenset({"Identity", "IdentityN", "Snapshot"})
_NOT_COMPARED = _PASS_THROUGH | {"Const", "NoOp"}
# Ops of two operands whose order changes no bit of the result (an AddN of
# two too); the order of three or more summands does.
_COMMUTATIVE = frozenset({"Add", "AddV2", "Mul", "Maximum", "Minimum",
                          "SquaredDifference", "Equal", "NotEqual",
                          "LogicalAnd", "LogicalOr"})


def _const_key(node):
    """A constant's reference by its value (Grappler shares equal
    constants, and which one stays depends on the graph)."""
    value = node.attr["value"].SerializeToString(deterministic=True)
    return "Const(%s)" % hashlib.sha1(value).hexdigest()[:12]


def _normalized(graph_def, lms_names):
    """``{name: (op, data inputs)}`` of the nodes of `graph_def` that
    compute (not LMS's, `lms_names`, nor `_NOT_COMPARED`), each input that
    read an LMS op or a pass-through node reading what it stands for, a
    constant by its value, the operands of a commutative op sorted."""
    nodes = {n.name: n for n in graph_def.node}

    def resolve(ref):
        name, output = _split(ref)
        for _ in range(256):
            node = nodes.get(name)
            if node is None:
                break
            if name in lms_names and CLONE_MARKER in name:
                name = clone_original(name)
                break
            if name in lms_names and rewriter.offloaded_variable(name):
                # The host copy an offloaded update runs on stands for
                # its variable.
                name, output = rewriter.offloaded_variable(name), 0
                break
            data = [i for i in node.input if not i.startswith("^")]
            if name in lms_names or (node.op in _PASS_THROUGH
                                     and node.op != "IdentityN"):
                if not data:
                    break
                name, output = _split(data[0])
            elif node.op == "IdentityN" and output < len(data):
                name, output = _split(data[output])
            else:
                break
        node = nodes.get(name)
        if node is not None and node.op == "Const":
            return _const_key(node)
        return "%s:%d" % (name, output)

    out = {}
    for node in graph_def.node:
        if node.name in lms_names or node.op in _NOT_COMPARED:
            continue
        op = node.op
        fused = node.attr.get("fused_ops")
        if fused is not None and fused.list.s:
            op += "[%s]" % ",".join(s.decode() for s in fused.list.s)
        inputs = tuple(resolve(i) for i in node.input
                       if not i.startswith("^"))
        out[node.name] = (op, _ordered(op, inputs))
    return out


def _ordered(op, inputs):
    """`inputs` sorted where their order changes nothing (`_COMMUTATIVE`,
    an AddN of two)."""
    if op in _COMMUTATIVE or (op == "AddN" and len(inputs) == 2):
        return tuple(sorted(inputs))
    return inputs


def _counts(compared, graph_def, lms_names=()):
    """Op types of the `compared` nodes, and the ``IdentityN`` nodes of
    `graph_def` not LMS's: one kept (the dependency optimizer removes
    Keras 3's gradient IdentityN only while no control edge or device
    crossing holds it) changes which products the arithmetic optimizer
    sees together."""
    counts = collections.Counter(e[0] for e in compared.values())
    counts["IdentityN"] += sum(1 for n in graph_def.node
                               if n.op == "IdentityN"
                               and n.name not in lms_names)
    if not counts["IdentityN"]:
        del counts["IdentityN"]
    return counts


def _text(entry):
    if entry is None:
        return ""
    return "%s(%s)" % (entry[0], ", ".join(entry[1]))


def _renamed(without, with_lms):
    """`with_lms` with each node that is a node of `without` under another
    name (the same op of the same operands: common-subexpression
    elimination kept the other of two twins) named as in `without`, and
    its readers reading that name."""
    for _ in range(8):
        by_entry = {}
        for name, entry in without.items():
            if name not in with_lms:
                by_entry.setdefault(entry, name)
        rename = {}
        for name, entry in with_lms.items():
            twin = by_entry.get(entry)
            if name not in without and twin is not None:
                rename[name] = twin
        if not rename:
            break
        with_lms = {rename.get(name, name):
                    (op, _ordered(op, _renamed_inputs(ins, rename)))
                    for name, (op, ins) in with_lms.items()}
    return with_lms


def _renamed_inputs(inputs, rename):
    """`inputs` (``name:k`` each) with the names in `rename` replaced."""
    out = []
    for ref in inputs:
        name, output = _split(ref)
        out.append("%s:%d" % (rename[name], output) if name in rename
                   else ref)
    return tuple(out)


def _differences(without, with_lms):
    """``(kind, node)`` of every node that differs."""
    found = []
    for name in sorted(set(without) | set(with_lms)):
        a, b = without.get(name), with_lms.get(name)
        if b is None:
            found.append(("removed", name))
        elif a is None:
            found.append(("added", name))
        elif a[0] != b[0]:
            found.append(("op", name))
        elif a[1] != b[1]:
            same_operands = sorted(a[1]) == sorted(b[1])
            found.append(("order" if same_operands else "inputs", name))
    return found


class _Neighbours:
    """The rewritten graph's LMS ops and edges by the step's ops next to
    them (built once per check)."""

    def __init__(self, rewritten, lms_names, original=None):
        self.swaps = collections.defaultdict(set)
        self.edges = collections.defaultdict(set)
        before = ({n.name: set(n.input) for n in original.node}
                  if original is not None else {})
        for node in rewritten.node:
            for ref in node.input:
                name = ref.lstrip("^").partition(":")[0]
                if node.name in lms_names and name not in lms_names:
                    self.swaps[name].add(node.name)
                elif name in lms_names and node.name not in lms_names:
                    self.swaps[node.name].add(name)
                elif (ref.startswith("^") and node.name in before
                      and ref not in before[node.name]):
                    self.edges[name].add((name, node.name))
                    self.edges[node.name].add((name, node.name))

    def of(self, ops):
        swaps, edges = set(), set()
        for op in ops:
            swaps |= self.swaps.get(op, set())
            edges |= self.edges.get(op, set())
        return tuple(sorted(swaps)), tuple(sorted(edges))


def _kept(graph_def, fetch_names):
    """`fetch_names`, or where it is empty (the whole graph is the step)
    every node of `graph_def` nothing reads."""
    if fetch_names:
        return list(fetch_names)
    read = {ref.lstrip("^").partition(":")[0]
            for n in graph_def.node for ref in n.input}
    return [n.name for n in graph_def.node if n.name not in read]


def optimize_original(original, fetch_names, config):
    """`optimize` of the step before the rewrite, as `check` makes it:
    what a caller checking several rewrites of one step passes to each
    `check` as `optimized_original`, so that it is made once."""
    before = graph_def_of(original)
    return optimize(before, _kept(before, fetch_names), config)


def check(original, rewritten, fetch_names, config=None,
          optimized_original=None):
    """Grappler's optimization of the step `fetch_names` in `original`
    (before LMS's rewrite) and in `rewritten` (after it), compared.

    Args:
      original: the step before the rewrite: a `tf.Graph`, a `FuncGraph`
        or a `GraphDef` (`graph_def_of` made from one before the rewrite
        edited it in place).
      rewritten: the step after the rewrite, the same kinds.
      fetch_names: names of the ops one step runs (kept by Grappler);
        empty: the whole graph is the step.
      config: the ``ConfigProto`` Grappler runs with; default the one the
        runtime would use for `rewritten` (`config_for`).
      optimized_original: `optimize_original` of `original` with the same
        fetches and config, when the caller has it; None: made here.

    Returns:
      A `GrapplerReport`.
    """
    start = time.perf_counter()
    if config is None:
        config = config_for(rewritten)
    before, after = graph_def_of(original), graph_def_of(rewritten)
    fetch_names = _kept(before, fetch_names)
    lms_names = {n.name for n in after.node if is_lms_name(n.name)}
    optimized = (optimized_original if optimized_original is not None
                 else optimize(before, fetch_names, config),
                 optimize(after, fetch_names, config))
    without = _normalized(optimized[0], set())
    with_lms = _renamed(without, _normalized(optimized[1], lms_names))
    neighbours = _Neighbours(after, lms_names, before)
    differences = []
    for kind, name in _differences(without, with_lms):
        a, b = without.get(name), with_lms.get(name)
        ops = {name}
        for entry in (a, b):
            if entry is not None:
                ops.update(_split(ref)[0] for ref in entry[1]
                           if not ref.startswith("Const("))
        swaps, edges = neighbours.of(ops)
        differences.append(Difference(
            kind=kind, node=name, without=_text(a), with_lms=_text(b),
            ops=tuple(sorted(ops)), swaps=swaps, edges=edges))
    counts = (_counts(without, optimized[0]),
              _counts(with_lms, optimized[1], lms_names))
    kernels = {k: (counts[0][k], counts[1][k])
               for k in set(counts[0]) | set(counts[1])
               if counts[0][k] != counts[1][k]}
    kept = [{n.name for n in g.node if n.op == "IdentityN"
             and n.name not in lms_names} for g in optimized]
    return GrapplerReport(
        differences=tuple(differences), kernels_differ=kernels,
        nodes=(len(without), len(with_lms)),
        seconds=time.perf_counter() - start,
        accumulated=tuple(accumulated_addns(g) for g in optimized),
        identity_n_kept=tuple(sorted(kept[1] - kept[0])))


def accumulated_addns(graph_def):
    """The names of the ``AddN`` nodes Grappler's memory optimizer turned
    into accumulations in `graph_def` (an optimized step), sorted: each
    became a ``DestroyTemporaryVariable`` of the same name."""
    return tuple(sorted(n.name for n in graph_def.node
                        if n.op == "DestroyTemporaryVariable"))
