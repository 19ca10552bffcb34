"""The one code path both constructors of an index end in: the per-op
facts they gather (`Columns`), restricted to the training step's fan-in
and completed by `assemble` (consumers, fan-outs, control outputs,
levels); and `with_planned_edges`, the index re-levelled with the control
edges LMS plans to add.
"""

import collections
import dataclasses

from tflms import dag_levels
from tflms.graph_index import unbatched
from tflms.graph_index.index import BACK_EDGE_TYPES, GraphIndex


# What a constructor gathers about one op: the `GraphIndex` field each
# becomes is the plural (name -> names, type -> types, device -> devices),
# or the same name. A named tuple: made once per op of graphs of hundreds of
# thousands of ops, it costs no more than the tuple it is.
OpFacts = collections.namedtuple("OpFacts", (
    "name", "type", "device", "inputs", "control_inputs", "output_shapes",
    "output_itemsizes", "variable_bytes", "is_stateful", "bn_is_training",
    "forwards_input", "in_v1_cond", "in_v1_loop", "calls_collective",
    "trainable_bytes", "flops"))


class Columns:
    """The per-op facts both constructors (`from_edges`,
    `reader.build_index`) gather, one list per field, for `assemble`."""

    FIELDS = ("names", "types", "devices", "inputs", "control_inputs",
              "output_shapes", "output_itemsizes", "variable_bytes",
              "is_stateful", "bn_is_training", "forwards_input",
              "in_v1_cond", "in_v1_loop",
              "calls_collective", "trainable_bytes", "flops")

    def __init__(self):
        for f in self.FIELDS:
            setattr(self, f, [])
        # The lists in `OpFacts` order, for `add`'s per-op loop.
        self._columns = tuple(getattr(self, f) for f in self.FIELDS)

    def add(self, facts):
        """Append one op's `OpFacts`."""
        for column, value in zip(self._columns, facts):
            column.append(value)


def _fan_in_ids(cols, roots):
    """Ids of the ops `roots` read through data and control inputs, with
    the roots, in increasing order."""
    seen = set(roots)
    stack = list(seen)
    inputs, control_inputs = cols.inputs, cols.control_inputs
    while stack:
        v = stack.pop()
        for p, _ in inputs[v]:
            if p not in seen:
                seen.add(p)
                stack.append(p)
        for p in control_inputs[v]:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return sorted(seen)


def _restricted(ops, cols, keep):
    """`ops`, `cols` and the name -> id map of the ops `keep` (increasing
    ids closed under inputs), renumbered in that order."""
    new_id = {old: new for new, old in enumerate(keep)}
    out = Columns()
    for f in Columns.FIELDS:
        column = getattr(cols, f)
        setattr(out, f, [column[i] for i in keep])
    out.inputs = [tuple((new_id[p], k) for p, k in ins) for ins in out.inputs]
    out.control_inputs = [tuple(new_id[c] for c in ctrl)
                          for ctrl in out.control_inputs]
    kept_ops = None if ops is None else tuple(ops[i] for i in keep)
    return kept_ops, out, {name: i for i, name in enumerate(out.names)}


def assemble(ops, cols, id_of, roots=(), step_rule="the whole graph"):
    """The derived fields (consumers, fan-outs, control outputs, levels) and
    the `GraphIndex` of the fan-in of `roots` (op ids; none: every op): one
    code path for `reader.build_index` and `from_edges`, whose per-op
    facts `cols` (`Columns`) holds, with the ops (None for a literal graph)
    and the name -> id map."""
    graph_num_ops = len(cols.names)
    fetches = ()
    if roots:
        names = {cols.names[r] for r in roots}
        keep = _fan_in_ids(cols, roots)
        if len(keep) < graph_num_ops:  # else the ids stay as they are
            ops, cols, id_of = _restricted(ops, cols, keep)
        fetches = tuple(sorted(id_of[name] for name in names))
    n = len(cols.names)
    types = cols.types
    inputs = cols.inputs
    consumers = [[[] for _ in shapes] for shapes in cols.output_shapes]
    control_outputs = [[] for _ in range(n)]
    # Consumers come in increasing id order, so each fanout list is sorted
    # and a repeated consumer is its last entry.
    fanouts = [[] for _ in range(n)]
    for i in range(n):
        for slot, (producer, out) in enumerate(inputs[i]):
            consumers[producer][out].append((i, slot))
            fanout = fanouts[producer]
            if not fanout or fanout[-1] != i:
                fanout.append(i)
        for c in cols.control_inputs[i]:
            control_outputs[c].append(i)

    successors = [
        [] if types[i] in BACK_EDGE_TYPES
        else list(fanouts[i]) + control_outputs[i]
        for i in range(n)
    ]
    levels = dag_levels.kahn_levels(n, successors)
    ops_by_level = tuple(tuple(g) for g in dag_levels.group_by_level(levels))

    return GraphIndex(
        ops=ops,
        names=tuple(cols.names),
        types=tuple(types),
        devices=tuple(cols.devices),
        inputs=tuple(inputs),
        consumers=tuple(tuple(tuple(c) for c in per_op)
                        for per_op in consumers),
        control_inputs=tuple(cols.control_inputs),
        control_outputs=tuple(tuple(c) for c in control_outputs),
        fanins=tuple(tuple(sorted({p for p, _ in ins})) for ins in inputs),
        fanouts=tuple(tuple(f) for f in fanouts),
        output_shapes=tuple(cols.output_shapes),
        output_itemsizes=tuple(cols.output_itemsizes),
        variable_bytes=tuple(cols.variable_bytes),
        is_stateful=tuple(cols.is_stateful),
        bn_is_training=tuple(cols.bn_is_training),
        in_v1_cond=tuple(cols.in_v1_cond),
        forwards_input=tuple(cols.forwards_input),
        in_v1_loop=tuple(cols.in_v1_loop),
        calls_collective=tuple(cols.calls_collective),
        trainable_bytes=tuple(cols.trainable_bytes),
        flops=tuple(cols.flops),
        unbatched_elements=unbatched.unbatched_elements(
            types, inputs, cols.output_shapes, ops_by_level),
        levels=tuple(levels),
        ops_by_level=ops_by_level,
        id_of=id_of,
        fetches=fetches,
        step_rule=step_rule,
        graph_num_ops=graph_num_ops,
    )


def with_planned_edges(index, edges):
    """The index with control edges ``(from_id, to_id)`` LMS plans to add
    (serialization) recorded in `planned_edges` and counted in its levels.

    The graph is not touched: the rewriter adds the edges (they travel in
    `planner.Plan.serialization_edges`), and the simulator replays them
    from the index.

    Raises:
      dag_levels.GraphCycleError: if the edges close a cycle.
    """
    edges = tuple((int(a), int(b)) for a, b in edges)
    if not edges:
        return index
    planned = index.planned_edges + edges
    extra = [[] for _ in range(index.num_ops)]
    for a, b in planned:
        extra[a].append(b)
    successors = [list(index.level_successors(i)) + extra[i]
                  for i in range(index.num_ops)]
    levels = dag_levels.kahn_levels(index.num_ops, successors)
    return dataclasses.replace(
        index, planned_edges=planned, levels=tuple(levels),
        ops_by_level=tuple(
            tuple(g) for g in dag_levels.group_by_level(levels)))


def acyclic_edges(index, edges):
    """`edges` (control edges ``(from_id, to_id)``), less any that closes a
    cycle with the index's edges and the ones kept before it, as a tuple.

    An edge ``a -> b`` closes a cycle exactly when ``b`` already reaches
    ``a``. That is asked of one graph kept up to date edge by edge (its
    successor lists and a topological numbering), so each edge costs a
    search among the ops between ``b`` and ``a`` instead of levelling the
    whole graph again: the order stage offers hundreds of edges at once on
    graphs of tens of thousands of ops (GPT-2's step)."""
    edges = tuple(edges)
    n = index.num_ops
    successors = [list(index.level_successors(i)) for i in range(n)]
    for a, b in index.planned_edges:
        successors[a].append(b)
    try:
        # Levels made here, not the index's: they must number every edge
        # forward, whoever made the index.
        levels = dag_levels.kahn_levels(n, successors)
    except dag_levels.GraphCycleError:
        return ()  # a cycle already: every edge would be refused
    kept = []
    for edge in edges:
        a, b = int(edge[0]), int(edge[1])
        if _reaches(successors, levels, b, a):
            continue
        kept.append(edge)
        successors[a].append(b)
        if levels[b] <= levels[a]:
            levels = (dag_levels.raise_levels(levels, successors, (a,),
                                              max_steps=n)
                      or dag_levels.kahn_levels(n, successors))
    return tuple(kept)


def _reaches(successors, levels, source, goal):
    """True if `goal` is `source` or a path of `successors` leads from
    `source` to it. Every edge rises in `levels`, so only ops below
    `goal`'s level can be on such a path."""
    if source == goal:
        return True
    ceiling = levels[goal]
    if levels[source] >= ceiling:
        return False
    seen = {source}
    stack = [source]
    while stack:
        for w in successors[stack.pop()]:
            if w == goal:
                return True
            if w not in seen and levels[w] < ceiling:
                seen.add(w)
                stack.append(w)
    return False
