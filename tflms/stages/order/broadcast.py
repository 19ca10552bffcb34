"""Ordering edges for sums of broadcast terms, such as the input gradient of
an unfused batch normalization.

Keras 3 computes batch normalization with element-wise ops (its moments
and ``tf.nn.batch_normalization``), so the gradient of each layer's input
is an ``AddN`` of three activation-sized terms: the incoming gradient
scaled, the mean's gradient (``Tile`` of a per-channel vector, divided by
the count) and the variance's (another ``Tile``, divided, doubled and
multiplied by ``x - mean``). The two ``Tile`` chains need nothing but
per-channel vectors, so Kahn levels (and TensorFlow's executor, which runs
an op as soon as its inputs are ready) make both broadcasts at once, beside
``x - mean``, and, in a block with a projection shortcut, beside the two
broadcasts of the other branch's batch norm, which reads the same incoming
gradient: eight activation-sized buffers where one layer at a time needs
three or four.

`broadcast_sums` finds such sums: an ``AddN`` with two or more terms of its
own size that each start at a broadcast (``Tile``, ``BroadcastTo``) of a
tensor at most 1/64 of its size, through ops of that size. `sum_edges`
orders them: within a sum, a broadcast chain starts after the chain before
it (its broadcast waits for that chain's latest op that may carry an edge:
the variance's chain, which ends in ops Grappler merges, goes first, and
the mean's ``Tile`` waits for its ``truediv``), so one broadcast buffer at a
time is made beside ``x - mean``; between sums whose chains run at the
same levels, the second sum's earliest broadcast waits for the first sum.
A control edge
changes when an op runs, never what it computes; each edge goes between a
trigger and a waiter of `analysis.OpRoles` (ops Grappler merges with a
neighbour are neither), on one device, and none that would close a cycle is
made.

Pure: reads a `GraphIndex`, imports no TensorFlow.
"""

import dataclasses

from tflms import analysis
from tflms import graph_index as gi

__all__ = ["BroadcastSum", "BROADCAST_TYPES", "broadcast_sums", "sum_edges"]

# Ops that make a tensor by repeating a smaller one.
BROADCAST_TYPES = frozenset({"Tile", "BroadcastTo"})

# A broadcast's input is at most this share of its output: the repeated
# tensor is per channel, not another activation.
_SMALL_SHARE = 1.0 / 64

# Ops between a broadcast and the sum at most (the variance's chain:
# divide, double, multiply by ``x - mean``).
_CHAIN_DEPTH = 4


@dataclasses.dataclass(frozen=True)
class BroadcastSum:
    """An ``AddN`` whose terms start at broadcasts of small tensors.

    Attributes:
      total: the ``AddN`` op.
      chains: per broadcast term, in the order the terms are to be made,
        its ops from the term (an input of `total`) back to the broadcast.
    """

    total: int
    chains: tuple

    @property
    def heads(self):
        """The broadcast of each chain."""
        return tuple(chain[-1] for chain in self.chains)


def _size(index, op, out, batch_size):
    return gi.tensor_bytes(index, op, out, batch_size) or 0


def _chain(index, op, size, depth, batch_size):
    """The ops from `op` back to the broadcast of a small tensor its output
    is made from, through ops whose outputs are `size` bytes; None if there
    is none within `depth` ops."""
    if index.types[op] in BROADCAST_TYPES:
        if not index.inputs[op]:
            return None
        src, out = index.inputs[op][0]
        small = _size(index, src, out, batch_size)
        return (op,) if small <= size * _SMALL_SHARE else None
    if depth == 0:
        return None
    for producer, out in index.inputs[op]:
        if _size(index, producer, out, batch_size) == size:
            chain = _chain(index, producer, size, depth - 1, batch_size)
            if chain is not None:
                return (op,) + chain
    return None


def broadcast_sums(index, roles, batch_size=None):
    """The `BroadcastSum` of every ``AddN`` with two or more broadcast
    terms, in the order of the sums' levels (then ids).

    Chains whose last op may not trigger (`OpRoles.triggers`: Grappler
    merges it with its neighbour) come first: the next chain then waits
    for the latest op of it that may."""
    sums = []
    for op, t in enumerate(index.types):
        if t != "AddN" or not roles.orderable(index, op):
            continue
        size = _size(index, op, 0, batch_size)
        if not size:
            continue
        chains = []
        for producer, out in index.inputs[op]:
            if _size(index, producer, out, batch_size) != size:
                continue
            chain = _chain(index, producer, size, _CHAIN_DEPTH, batch_size)
            if chain is not None and roles.orderable(index, chain[-1]):
                chains.append((producer in roles.triggers, len(chain),
                               chain))
        if len(chains) < 2:
            continue
        chains.sort()
        sums.append(BroadcastSum(total=op,
                                 chains=tuple(c for _, _, c in chains)))
    sums.sort(key=lambda s: (index.levels[s.total], s.total))
    return sums


def _may_order(index, roles, first, then):
    return (first in roles.triggers and then in roles.waiters
            and analysis.same_device(index.devices[first],
                                     index.devices[then]))


def _reaches(index, src, dst, extra_preds):
    """True if `dst` is an ancestor of `src` (through data, control and
    `extra_preds` edges): an edge ``src -> dst`` would close a cycle."""
    lowest = index.levels[dst]
    if index.levels[src] <= lowest:
        return src == dst
    return dst in analysis.ancestors_within(index, src, lowest,
                                            extra_preds=extra_preds)


def _latest_trigger(roles, chain):
    """The op of `chain` nearest its end that may trigger, or None."""
    for op in chain:
        if op in roles.triggers:
            return op
    return None


def sum_edges(index, roles, batch_size=None):
    """Control edges ``(first, then)`` that make the broadcast terms of
    each `broadcast_sums` sum one after the other (each chain's broadcast
    waits for the latest op of the chain before it that may trigger), and,
    for sums whose terms run at the same levels, the later sum's earliest
    broadcast after the earlier sum.

    Returns:
      A tuple of edges, possibly empty.
    """
    sums = broadcast_sums(index, roles, batch_size)
    edges = []
    preds = {}
    for a, b in index.planned_edges:
        preds.setdefault(b, []).append(a)

    def add(first, then):
        if first is None or not _may_order(index, roles, first, then):
            return
        if _reaches(index, first, then, preds):
            return
        edges.append((first, then))
        preds.setdefault(then, []).append(first)

    for s in sums:
        for k in range(1, len(s.chains)):
            add(_latest_trigger(roles, s.chains[k - 1]), s.chains[k][-1])
    levels = index.levels
    for earlier, later in zip(sums, sums[1:]):
        # Only the later sum's earliest broadcast waits: its ``x - mean``,
        # whose swap-in can start no later than the incoming gradient (the
        # latest data ancestor of its first reader, `planner.find_trigger`),
        # is then consumed beside the earlier sum instead of held through
        # it (the whole later sum waiting fits 5 buffers, not 4, at the
        # largest sizes).
        first_head = min(later.heads, key=lambda h: (levels[h], h))
        if levels[first_head] <= levels[earlier.total]:
            add(earlier.total, first_head)
    # The checks above read the levels before these edges.
    return gi.acyclic_edges(index, edges)
