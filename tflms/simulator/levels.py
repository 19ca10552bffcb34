"""The levels of the graph a replay counts: the graph's own (with the
planned and extra control edges) made once per model, and those of the
rewritten graph, made from them for each plan.
"""

import numpy as np

from tflms import dag_levels


class GraphLevels:
    """The graph's successor lists and levels, and a plan's levels.

    Args:
      index: a `GraphIndex`; its planned edges (`index.planned_edges`)
        count with the graph's own.
      extra_edges: more ``(from_id, to_id)`` control edges.

    Raises:
      ValueError: if the index's levels do not follow from its edges (an
        index re-levelled by hand instead of by
        `graph_index.with_planned_edges`).
    """

    def __init__(self, index, extra_edges=()):
        n = index.num_ops
        self.num_ops = n
        succ = []
        for i in range(n):
            s = [c for per_out in index.consumers[i] for c, _ in per_out]
            s.extend(index.control_outputs[i])
            succ.append(s)
        for a, b in tuple(index.planned_edges) + tuple(extra_edges):
            succ[a].append(b)
        levels = dag_levels.kahn_levels(n, succ)
        if not extra_edges and any(a < b for a, b in zip(levels,
                                                         index.levels)):
            # Some level is higher than every edge explains: the index was
            # re-levelled with edges it does not hold, and a replay could
            # not put those ops where the plan expects them.
            raise ValueError(
                "the index's levels do not follow from its edges (e.g. %s is "
                "at level %d, its edges put it at %d); add planned control "
                "edges with graph_index.with_planned_edges(index, edges)"
                % next((index.names[i], b, a) for i, (a, b) in enumerate(
                    zip(levels, index.levels)) if a < b))
        self.succ = succ
        self.num_nodes = len(succ)
        self.levels = levels
        # The same levels as an array: a replay that moves no original op
        # appends the swap nodes' levels to it instead of converting the
        # whole list again.
        self.level_array = np.asarray(levels, dtype=np.int64)
        # (control edges, successor lists, levels): `_with_control_edges`.
        self._edges_cache = (None, None, None)

    def replayed(self, added, control_edges):
        """Levels of every node of the graph rewritten with `control_edges`
        and what `added` (an `additions.Additions`) holds."""
        base_levels = self.levels
        for a, b in control_edges:
            if base_levels[b] <= base_levels[a]:
                added.moved = True
        if not (added.shortened or added.moved):
            # No original op moves: the levels are the graph's, plus the
            # swap nodes' computed above (what `raise_levels` would find).
            return np.concatenate((self.level_array,
                                   np.asarray(added.new_levels,
                                              dtype=np.int64)))
        return np.asarray(
            self._levels_with(added.swap_nodes, control_edges, added.node,
                              added.clone_nodes, added.clone_reroutes),
            dtype=np.int64)

    def _with_control_edges(self, control_edges):
        """``(successor lists, levels)`` of the graph with `control_edges`
        added, made once for the edges of the plans replayed last: every
        plan of a search shares its control edges (serialization,
        deferral), and deferral edges alone move thousands of ops (GPT-2's
        dropout noise), which each replay would otherwise move again.
        The lists are shared: copy one before changing it."""
        if not control_edges:
            return self.succ, self.levels
        cached_edges, succ, levels = self._edges_cache
        if cached_edges != control_edges:
            succ = list(self.succ)
            changed = set()
            for a, b in control_edges:
                if a not in changed:
                    succ[a] = list(succ[a])
                    changed.add(a)
                succ[a].append(b)
            levels = dag_levels.kahn_levels(self.num_nodes, succ)
            self._edges_cache = (tuple(control_edges), succ, levels)
        return succ, levels

    def _levels_with(self, swap_nodes, control_edges, num_nodes,
                     clone_nodes=(), clone_reroutes=()):
        """Levels of the graph with the control edges, swap nodes, clone
        nodes (after the swap nodes, ``(node, predecessors)``) and the
        clones' rerouted readers (``(producer, last clone, consumers)``)
        added, when some original op may move: pushed forward from the
        levels of the graph with the control edges, or by Kahn's
        algorithm when an edge a clone's reroute removed may have held up
        its reader."""
        n = self.num_ops
        base_succ, base_levels = self._with_control_edges(control_edges)
        succ = list(base_succ)
        copied = set()
        # (producer, reader) edges a clone's reroute takes away. A swap-in's
        # reroute takes one away too, but its reader then waits for the
        # producer through the swap-out and swap-in, longer than before.
        removed = []

        def own(v):
            if v < n and v not in copied:
                succ[v] = list(succ[v])
                copied.add(v)
            return succ[v]

        for p, so, waiters, ins in swap_nodes:
            p_succ = own(p)
            p_succ.append(so)
            succ.append([])
            for si, sin in ins:
                succ.append([c for c, _ in sin.consumers])
                succ[so].append(si)
                for t in sin.triggers:
                    own(t).append(si)
                for c, _ in sin.consumers:
                    p_succ.remove(c)
            succ[so].extend(waiters)
        for cn, preds in clone_nodes:
            assert cn == len(succ)
            succ.append([])
            for v in preds:
                own(v).append(cn)
        for p, last, consumers in clone_reroutes:
            p_succ = own(p)
            for c, _ in consumers:
                succ[last].append(c)
                p_succ.remove(c)
                removed.append((p, c))
        assert len(succ) == num_nodes
        levels = None
        # A removed edge into an op from a producer one level below may
        # have set that op's level (its clone may run earlier than the
        # producer): only rising is followed from the levels of the graph
        # with the control edges, so then they are made afresh. Every new
        # edge leads to a new node (the control edges are in those levels).
        if all(base_levels[c] - base_levels[p] >= 2 for p, c in removed):
            levels = dag_levels.risen_levels(
                base_levels, succ, copied,
                range(self.num_nodes, len(succ)))
        if levels is None:
            levels = dag_levels.kahn_levels(len(succ), succ)
        return levels
