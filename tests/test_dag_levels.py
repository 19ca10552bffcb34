"""The categorized topological sort against independent implementations."""

import random

import networkx as nx
import pytest
import toposort

from tflms import dag_levels


def random_dag(n, p, seed):
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)  # ids are not a topological order
    succ = [[] for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < p:
                succ[order[i]].append(order[j])
    return succ


@pytest.mark.parametrize("seed", range(25))
def test_levels_equal_toposort(seed):
    n = 5 + seed * 7
    succ = random_dag(n, 0.08, seed)
    deps = {v: set() for v in range(n)}
    for v, ws in enumerate(succ):
        for w in ws:
            deps[w].add(v)
    expected = list(toposort.toposort(deps))
    levels = dag_levels.kahn_levels(n, succ)
    assert [set(g) for g in dag_levels.group_by_level(levels)] == expected


@pytest.mark.parametrize("seed", range(10))
def test_levels_equal_networkx_generations(seed):
    n = 200
    succ = random_dag(n, 0.03, 100 + seed)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from((v, w) for v, ws in enumerate(succ) for w in ws)
    expected = [sorted(x) for x in nx.topological_generations(g)]
    levels = dag_levels.kahn_levels(n, succ)
    assert dag_levels.group_by_level(levels) == expected
    # Invariant: every edge goes to a strictly higher level.
    assert all(levels[w] > levels[v] for v, ws in enumerate(succ) for w in ws)


def test_parallel_edges_and_isolated_nodes():
    succ = [[1, 1], [], [], [1]]
    assert dag_levels.kahn_levels(4, succ) == [0, 1, 0, 0]


def test_cycle_is_reported():
    with pytest.raises(dag_levels.GraphCycleError, match="2 of 3 nodes"):
        dag_levels.kahn_levels(3, [[1], [2], [1]])


def test_empty_graph():
    assert dag_levels.kahn_levels(0, []) == []
    assert dag_levels.group_by_level([]) == []


@pytest.mark.parametrize("seed", range(20))
def test_raise_levels_equals_kahn_after_additions(seed):
    """New nodes and forward edges added to a DAG: pushing increases from
    the new edges' tails gives the levels Kahn computes from scratch."""
    rng = random.Random(1000 + seed)
    n = 60 + seed * 5
    succ = random_dag(n, 0.05, 1000 + seed)
    old = dag_levels.kahn_levels(n, succ)
    new_succ = [list(s) for s in succ]
    seeds = set()
    # Forward edges between old nodes (from a lower level to a higher one,
    # as LMS adds them) and new nodes between old ones.
    for _ in range(rng.randrange(1, 12)):
        a, b = rng.randrange(n), rng.randrange(n)
        if old[a] < old[b]:
            new_succ[a].append(b)
            seeds.add(a)
    for _ in range(rng.randrange(0, 6)):
        a, b = rng.randrange(n), rng.randrange(n)
        if old[a] < old[b]:
            v = len(new_succ)
            new_succ.append([b])
            new_succ[a].append(v)
            seeds.update((a, v))
    got = dag_levels.raise_levels(old, new_succ, seeds, max_steps=10 * n)
    assert got == dag_levels.kahn_levels(len(new_succ), new_succ)


@pytest.mark.parametrize("seed", range(20))
def test_risen_levels_equal_kahn_after_additions(seed):
    """New nodes between old ones (the only heads of new edges, as a
    replay adds swap and clone nodes) and old nodes' edges into them:
    Kahn's algorithm on what the new nodes reach, from the old levels,
    gives the levels Kahn computes from scratch, whether the new nodes
    fit between their ends' old levels or push later ops up."""
    rng = random.Random(2000 + seed)
    n = 60 + seed * 5
    succ = random_dag(n, 0.05, 2000 + seed)
    old = dag_levels.kahn_levels(n, succ)
    new_succ = [list(s) for s in succ]
    tails, heads = set(), []
    for _ in range(rng.randrange(1, 8)):
        a, b = rng.randrange(n), rng.randrange(n)
        if old[a] < old[b]:
            v = len(new_succ)
            # A chain of one or two new nodes from a to b (a swap-out and
            # its swap-in), and sometimes a second tail into the last.
            new_succ.append([])
            new_succ[a].append(v)
            tails.add(a)
            heads.append(v)
            if rng.random() < 0.5:
                new_succ.append([])
                new_succ[v].append(v + 1)
                heads.append(v + 1)
                v += 1
            c = rng.randrange(n)
            if old[c] < old[b]:
                new_succ[c].append(v)
                tails.add(c)
            new_succ[v].append(b)
    got = dag_levels.risen_levels(old, new_succ, tails, heads)
    assert got == dag_levels.kahn_levels(len(new_succ), new_succ)


def test_risen_levels_gives_up_on_a_cycle():
    """A new node whose edge leads back to its tail's ancestor."""
    succ = [[1], [2], []]
    old = dag_levels.kahn_levels(3, succ)
    succ[2].append(3)
    succ.append([0])  # 2 -> new 3 -> 0 closes a cycle
    assert dag_levels.risen_levels(old, succ, {2}, [3]) is None
    with pytest.raises(dag_levels.GraphCycleError):
        dag_levels.kahn_levels(4, succ)


def test_raise_levels_gives_up_on_a_cycle():
    succ = [[1], [2], []]
    old = dag_levels.kahn_levels(3, succ)
    succ[2].append(0)  # closes a cycle
    assert dag_levels.raise_levels(old, succ, {2}, max_steps=50) is None
    with pytest.raises(dag_levels.GraphCycleError):
        dag_levels.kahn_levels(3, succ)
