"""Categorized topological sort over plain adjacency lists.

A *categorized* topological sort groups the operations of a DAG into levels
(Kahn layers): level 0 holds the ops with no inputs, level k the ops whose
inputs all lie in levels < k, at least one of them in level k-1. An edge
therefore always goes from a lower level to a strictly higher one, and the
level of an op is the length of the longest path that reaches it.

Everything here works on integer node ids ``0..n-1`` and lists of successor
ids, so the analysis modules can call it without TensorFlow. The work is
O(V + E); ``toposort.toposort`` (which rebuilds its dependency dict at every
level) is only used in the tests as an independent cross-check.
"""

from tflms.errors import LMSError

__all__ = ["GraphCycleError", "kahn_levels", "raise_levels", "risen_levels",
           "group_by_level"]


class GraphCycleError(LMSError, ValueError):
    """The graph given to `kahn_levels` has a cycle."""


def kahn_levels(num_nodes, successors):
    """Levels of a DAG by Kahn's algorithm, layer by layer.

    Args:
      num_nodes: number of nodes; nodes are ``0..num_nodes-1``.
      successors: sequence, indexed by node, of iterables of successor ids.
        Parallel edges are allowed (they are counted once per occurrence on
        both sides, so they cancel out).

    Returns:
      A list ``levels`` with ``levels[v]`` the level of node ``v``.

    Raises:
      GraphCycleError: if some nodes are on or behind a cycle.
    """
    indegree = [0] * num_nodes
    for succ in successors:
        for w in succ:
            indegree[w] += 1
    levels = [0] * num_nodes
    frontier = [v for v in range(num_nodes) if indegree[v] == 0]
    placed = 0
    level = 0
    while frontier:
        placed += len(frontier)
        next_frontier = []
        for v in frontier:
            levels[v] = level
            for w in successors[v]:
                indegree[w] -= 1
                if indegree[w] == 0:
                    next_frontier.append(w)
        frontier = next_frontier
        level += 1
    if placed != num_nodes:
        stuck = [v for v in range(num_nodes) if indegree[v] > 0]
        raise GraphCycleError(
            "the graph has a cycle: %d of %d nodes could not be ordered "
            "(first few: %s)" % (len(stuck), num_nodes, stuck[:5]))
    return levels


def raise_levels(levels, successors, seeds, max_steps):
    """Kahn levels after nodes and edges were added to a DAG, from the old
    levels, or None when that would take more than `max_steps` updates.

    Adding an edge can only lengthen longest paths, so the new levels are
    found by pushing increases forward from the tails of the new edges:
    cheap when the additions move few nodes (a swap-in between ops many
    levels apart moves nothing but itself). Removed edges are not seen; the
    caller must know they shortened no longest path.

    Args:
      levels: old levels of nodes ``0..len(levels)-1``; nodes past the end
        (new ones) start at level 0.
      successors: the new successor lists, indexed by node.
      seeds: the nodes with new outgoing edges, new nodes included.
      max_steps: bound on level updates; a cycle also ends here.

    Returns:
      A new list of levels, or None (use `kahn_levels`, which also reports
      a cycle).
    """
    new = list(levels)
    new.extend([0] * (len(successors) - len(levels)))
    stack = sorted(seeds, key=lambda v: new[v], reverse=True)
    steps = 0
    while stack:
        v = stack.pop()
        nxt = new[v] + 1
        for w in successors[v]:
            if new[w] < nxt:
                new[w] = nxt
                stack.append(w)
                steps += 1
                if steps > max_steps:
                    return None
    return new


def risen_levels(levels, successors, tails, heads):
    """Kahn levels after nodes and edges were added to a DAG, from the old
    levels, when every new edge's head is in `heads`; or None when the
    additions close a cycle.

    Only `heads` and what they reach may rise, so Kahn's algorithm runs
    on that region alone, each op placed once, from the old levels
    (`raise_levels` pushes along every path instead, and an op many new
    paths reach is raised once per path). As for `raise_levels`, removed
    edges are not seen: the caller must know they shortened no longest
    path.

    Args:
      levels: old levels of nodes ``0..len(levels)-1``; nodes past the end
        (new ones) start at level 0.
      successors: the new successor lists, indexed by node.
      tails: the old nodes with new outgoing edges.
      heads: the nodes new edges lead to, new nodes included.

    Returns:
      A new list of levels, or None (use `kahn_levels`, which also reports
      the cycle).
    """
    new = list(levels)
    new.extend([0] * (len(successors) - len(levels)))
    region = set(heads)
    stack = list(region)
    while stack:
        for w in successors[stack.pop()]:
            if w not in region:
                region.add(w)
                stack.append(w)
    # New edges from outside the region: their tails keep their levels.
    for v in tails:
        if v not in region:
            nxt = new[v] + 1
            for w in successors[v]:
                if new[w] < nxt:
                    new[w] = nxt
    indegree = dict.fromkeys(region, 0)
    for v in region:
        for w in successors[v]:
            indegree[w] += 1
    frontier = [v for v in region if indegree[v] == 0]
    placed = 0
    while frontier:
        v = frontier.pop()
        placed += 1
        nxt = new[v] + 1
        for w in successors[v]:
            if new[w] < nxt:
                new[w] = nxt
            indegree[w] -= 1
            if indegree[w] == 0:
                frontier.append(w)
    if placed != len(region):
        return None
    return new


def group_by_level(levels):
    """Node ids grouped by level, each group in increasing id order.

    Args:
      levels: list of levels as returned by `kahn_levels`.

    Returns:
      A list whose entry ``k`` is the sorted list of nodes at level ``k``.
    """
    num_levels = (max(levels) + 1) if levels else 0
    groups = [[] for _ in range(num_levels)]
    for v, lvl in enumerate(levels):
        groups[lvl].append(v)
    return groups
