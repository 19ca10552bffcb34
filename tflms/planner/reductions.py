"""Ordering edges that run a chain reducing a large tensor before that
tensor's other reader makes a large output.

A tensor ``x`` read by two branches: one op ``a`` that makes an output as
large as ``x`` (a loss's gradient, read much later), and a chain of
element-wise ops of ``x``'s size that ends in a reduction (an ``ArgMax``,
a ``Sum``): a metric computed from the logits, a statistic of an
activation. Nothing orders the branches, so Kahn levels (and TensorFlow's
executor, which runs an op as soon as its inputs are ready) make ``a``'s
output beside the chain's temporaries. Keras 3's sparse categorical
accuracy on a language model's logits is such a chain: its ``argmax``
checks for NaNs with ``Bitcast``, ``BitwiseAnd``, ``Less``, ``Equal``,
``LogicalAnd`` and ``SelectV2`` over ``[batch, sequence, vocabulary]``,
while ``SparseSoftmaxCrossEntropyWithLogits`` makes the logits' gradient:
at GPT-2's sequence 2048, batch 8, four 3 GiB buffers where two are
needed.

`reduction_edges` makes ``a`` wait for the chain's reductions: the chain
then runs while ``x`` is live anyway (``a`` reads it), and its temporaries
are gone before ``a`` allocates. A chain qualifies when it starts at an op
of at least 1/8 of ``x``'s bytes (a direct reduction such as
``BiasAddGrad`` holds nothing to free), goes on through such ops (at least
two, at most `_CHAIN_OPS`), and every path of it ends in an op whose outputs
are at most 1/64 of ``x``: a chain that stays large (the model's next
layer) is not a side chain. ``a`` must make at least half of ``x``'s bytes.

A control edge changes when an op runs, never what it computes; each edge
goes from a trigger to a waiter of `analysis.OpRoles` (ops Grappler merges
with a neighbour are neither), on one device, and none that closes a cycle
is made (a chain that needs ``a``'s output is never ordered before it).

Pure: reads a `GraphIndex`, imports no TensorFlow.
"""

from tflms import analysis
from tflms import graph_index as gi

__all__ = ["reduction_edges", "side_chains"]

# A chain's ops are at least this share of the shared tensor's bytes.
_LARGE_SHARE = 1.0 / 8
# A reduction's outputs are at most this share.
_SMALL_SHARE = 1.0 / 64
# The reader that waits makes at least this share.
_ALLOCATOR_SHARE = 0.5
# Ops of one chain at most (GPT-2's accuracy: 5 before its ArgMax), and
# at least: one large op and its reduction (a gradient's ``x * g`` summed
# for a scale's gradient) hold one temporary, and are left to the
# replays of `peaks.order_peaks`; several hold several.
_CHAIN_OPS = 12
_MIN_CHAIN_OPS = 2
# The shared tensor is at least this many bytes: smaller ones do not move
# a peak worth a search.
_MIN_BYTES = 1 << 20
# Ops whose output is their input's buffer, read through to the readers
# (an IdentityN, which hands on many buffers, counts as a reader).
_FORWARDING = gi.BUFFER_FORWARDING_TYPES - {"IdentityN"}


def _out_bytes(index, op, batch_size):
    return sum(gi.tensor_bytes(index, op, k, batch_size) or 0
               for k in range(len(index.output_shapes[op])))


def _root(index, op, out):
    """The tensor whose buffer output `out` of `op` forwards."""
    while (index.types[op] in gi.BUFFER_FORWARDING_TYPES
           and index.types[op] != "IdentityN" and out == 0
           and index.inputs[op]):
        op, out = index.inputs[op][0]
    return op, out


def _readers(index, op, out):
    """The ops that read output `out` of `op`, through ops that forward
    their input's buffer (`gi.BUFFER_FORWARDING_TYPES`: a reshape of the
    logits is the same buffer); an IdentityN counts as a reader."""
    return index.readers_through((op, out), _FORWARDING)


def _chain(index, roles, start, size, batch_size):
    """``(chain ops, reductions)`` of the side chain that starts at reader
    `start` of a tensor of `size` bytes, or None if it is not one."""
    large, small = size * _LARGE_SHARE, size * _SMALL_SHARE
    if _out_bytes(index, start, batch_size) < large:
        return None
    chain, reductions, stack = set(), set(), [start]
    while stack:
        op = stack.pop()
        if op in chain or op in reductions:
            continue
        if not roles.orderable(index, op):
            return None
        nbytes = _out_bytes(index, op, batch_size)
        if nbytes <= small:
            reductions.add(op)
            continue
        if nbytes < large or len(chain) >= _CHAIN_OPS:
            return None
        chain.add(op)
        readers = [c for k in range(len(index.output_shapes[op]))
                   for c in _readers(index, op, k)]
        if not readers:
            return None
        stack.extend(readers)
    return chain, reductions


def side_chains(index, roles, batch_size=None):
    """``(allocator, shared tensor, chain ops, reductions)`` for every
    large reader of a large tensor beside a side chain of that tensor, in
    (level, id) order of the allocators."""
    found = []
    tensors = set()
    for op in range(index.num_ops):
        if op in roles.waiters and \
                index.types[op] not in gi.BUFFER_FORWARDING_TYPES:
            tensors.update(_root(index, *t) for t in index.inputs[op])
    for p, k in sorted(tensors):
        size = gi.tensor_bytes(index, p, k, batch_size) or 0
        if size < _MIN_BYTES:
            continue
        readers = sorted(_readers(index, p, k))
        if len(readers) < 2:
            continue
        chains = []
        for reader in readers:
            chain = _chain(index, roles, reader, size, batch_size)
            if chain is not None and len(chain[0]) >= _MIN_CHAIN_OPS:
                chains.append(chain)
        if not chains:
            continue
        in_chains = set().union(*(c[0] | c[1] for c in chains))
        for op in readers:
            if (op in in_chains or op not in roles.waiters
                    or _out_bytes(index, op, batch_size)
                    < size * _ALLOCATOR_SHARE):
                continue
            found.extend((op, (p, k), tuple(sorted(c[0])),
                          tuple(sorted(c[1]))) for c in chains)
    found.sort(key=lambda f: (index.levels[f[0]], f[0], f[1], f[2]))
    return found


def reduction_edges(index, roles, batch_size=None):
    """Control edges ``(reduction, allocator)``: every `side_chains`
    allocator waits for the reductions of the chains beside it.

    Returns:
      A tuple of edges, possibly empty.
    """
    edges = []
    preds = {}
    for a, b in index.planned_edges:
        preds.setdefault(b, []).append(a)
    for op, _, _, reductions in side_chains(index, roles, batch_size):
        for r in reductions:
            if (r not in roles.triggers or (r, op) in edges
                    or not analysis.same_device(index.devices[r],
                                                index.devices[op])):
                continue
            if index.levels[r] < index.levels[op] and r in \
                    analysis.ancestors_within(index, op, index.levels[r],
                                              extra_preds=preds):
                # Already after it (a softmax gradient's ``g - sum``).
                continue
            edges.append((r, op))
    return gi.acyclic_edges(index, edges)
