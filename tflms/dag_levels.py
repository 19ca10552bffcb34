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

__all__ = ["GraphCycleError", "kahn_levels", "raise_levels", "group_by_level"]


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
