"""Ordering edges that apply an optimizer's updates one variable after
another.

Keras 3's optimizers apply the gradients after the whole backward pass:
every gradient goes through one ``IdentityN``, and each variable's update
is a short chain of element-wise ops, reads and writes of its own
(momentum SGD: ``m * momentum``, ``grad * lr``, their difference written
to ``m``, ``m`` read again and added to the variable). Kahn levels (and
TensorFlow's executor) run all the chains side by side: every variable's
products at the same levels, and ``m * momentum``, which reads nothing
but a slot, at the start of the step, held (or swapped out and back)
through the whole of it. That is about two more copies of the parameter
bytes at the end of the step beside the weights and the slots.

`update_chains` finds the chains: for each write to a variable
(``Assign*``, ``*Apply*``), the ops of its fan-in that only it needs
(element-wise ops, ``Cast``, ``ReadVariableOp`` and the other writes of the
same update, which read each other's variable through control edges),
kept when the chain reads a gradient (made by an op in a ``gradients`` or
``gradient_tape`` name scope, directly or through ops that hand on a
buffer) and computes something (one ``*Apply*`` op per variable, as a
Session graph's optimizers make, allocates nothing to order).
`chain_edges` orders them: the ops that start a chain (its members with
no predecessor in it) wait for the latest op of the chain before that may
carry a control edge, and for their own gradient, so each
variable's products are made, and its swapped-out inputs brought in, just
before its own writes, and freed after them. The chains run in the order
their gradients are ready: as the backward pass makes them, or, where
they all meet first (Keras 3's ``IdentityN``), the gradient made last
first.

What is left at the end of the step is the weights, the slots, every
gradient (the ``IdentityN`` reads them all at once) and one variable's
products: about three times the parameter bytes plus the largest
variable's, not two, as long as the ``IdentityN`` stands in the graph
LMS plans (Grappler's dependency optimizer removes it only at run time).

A control edge changes when an op runs, never what it computes: each
chain reads only its own variables, the shared read-only tensors
(learning rate, constants, the gradients) and its own products, and in a
`tf.function` automatic control dependencies already order every read and
write of one variable, so no op reads another version of any variable
than it did. Each edge goes between a trigger and a waiter of
`analysis.OpRoles`, on one device, never from or to an op Grappler merges
with a neighbour (`fusions.grappler_groups`), and none that would close a
cycle is made.

Pure: reads a `GraphIndex`, imports no TensorFlow.
"""

import dataclasses

from tflms import analysis
from tflms import fusions
from tflms import graph_index as gi
from tflms import step
from tflms.inplace import INPLACE_INPUTS

__all__ = ["UpdateChain", "CHAIN_TYPES", "update_chains", "chain_edges"]

# Ops a chain may hold besides its writes: element-wise arithmetic (as
# optimizers compute an update), casts and variable reads. A chain never
# reaches into the backward pass (a gradient's ``Conv2DBackpropFilter``,
# ``MatMul``, ``BiasAddGrad`` or ``Reshape`` stops it).
CHAIN_TYPES = frozenset(INPLACE_INPUTS) | frozenset({
    "ReadVariableOp", "Cast", "Neg", "Sqrt", "Rsqrt", "Square",
    "Reciprocal", "Sign", "Abs"})


@dataclasses.dataclass(frozen=True)
class UpdateChain:
    """The ops that update one variable (and its optimizer slots).

    Attributes:
      writes: the ops writing a variable, increasing ids.
      ops: every op of the chain, writes included, increasing ids.
      heads: the ops of the chain with no predecessor in it, increasing
        ids: what waits for the chain before.
      gradients: the ops that made the gradients the chain reads,
        increasing ids.
    """

    writes: tuple
    ops: tuple
    heads: tuple
    gradients: tuple


def _is_write(t):
    return t in step.ASSIGN_TYPES or t.startswith(step.APPLY_PREFIXES)


def _grow(index, roles, write, taken):
    """The ops of `write`'s fan-in that only it (and what it absorbs) needs:
    added while every successor of an op is already in the chain or only
    waits for it (a ``NoOp``: a `tf.function` ends on one that waits for
    every stateful op, variable reads included)."""
    members = {write}
    # An op is checked again each time one of its successors joins: it
    # joins with the last of them (the chain is the same in any order).
    stack = list(index.predecessors(write))
    while stack:
        op = stack.pop()
        t = index.types[op]
        if (op in members or op in taken
                or not (t in CHAIN_TYPES or _is_write(t))
                or not roles.orderable(index, op)):
            continue
        if all(s in members or index.types[s] == "NoOp"
               for s in index.successors(op)):
            members.add(op)
            stack.extend(index.predecessors(op))
    return members


def _gradients_read(index, members):
    """The gradients the chain reads, as ``(reads, producers)``: the ops
    whose outputs its ops read, and the ops that made those outputs, found
    through ops that hand on their input's buffer (Keras 3 passes every
    gradient through one ``IdentityN``), in a gradient name scope
    (`analysis.in_gradient_scope`)."""
    reads, producers = set(), set()
    for op in members:
        for producer, out in index.inputs[op]:
            read = producer
            while (index.types[producer] in gi.BUFFER_FORWARDING_TYPES
                   and index.inputs[producer]):
                slot = out if index.types[producer] == "IdentityN" else 0
                producer, out = index.inputs[producer][slot]
            if (producer not in members
                    and analysis.in_gradient_scope(index.names[producer])):
                reads.add(read)
                producers.add(producer)
    return reads, producers


def update_chains(index, roles):
    """The `UpdateChain` of every variable update that reads a gradient,
    in the order they are to run: the chain whose gradient tensors are
    ready first, so that each update runs as soon as its gradient is made
    (the last layer's first, in a backward pass). Where the gradients meet
    first (Keras 3's ``IdentityN``: every chain's are ready at once), the
    chain whose gradient was made last goes first: it waits the least for
    its gradient, and every other one waits for the chain before it.
    Then by the chain's first op id."""
    taken = {}
    groups = []
    writes = [op for op, t in enumerate(index.types)
              if _is_write(t) and roles.orderable(index, op)]
    for write in sorted(writes, key=lambda op: (-index.levels[op], -op)):
        if write in taken:
            continue
        members = _grow(index, roles, write, taken)
        for op in members:
            taken[op] = len(groups)
        groups.append(members)
    chains = []
    for members in groups:
        reads, gradients = _gradients_read(index, members)
        # A chain that only reads and writes variables (a Session graph's
        # ``*Apply*`` op) makes no buffer: ordering it frees nothing.
        if not gradients or all(
                _is_write(index.types[op])
                or index.types[op] == "ReadVariableOp" for op in members):
            continue
        heads = tuple(sorted(
            op for op in members
            if not any(p in members for p in index.predecessors(op))))
        key = (max(index.levels[r] for r in reads),
               -max(index.levels[g] for g in gradients), min(members))
        chains.append((key, UpdateChain(
            writes=tuple(sorted(op for op in members
                                if _is_write(index.types[op]))),
            ops=tuple(sorted(members)), heads=heads,
            gradients=tuple(sorted(gradients)))))
    chains.sort(key=lambda c: c[0])
    return [c for _, c in chains]


def _latest_trigger(index, roles, candidates, merged):
    """Of `candidates`, the latest op (by level, then id) that may carry a
    control edge out, or None."""
    ops = [op for op in candidates
           if op in roles.triggers and op not in merged]
    return max(ops, key=lambda op: (index.levels[op], op), default=None)


def chain_edges(index, roles, onednn_cpu=False):
    """Control edges ``(first, then)`` that run the `update_chains` one
    after the other: each head of a chain (that may wait) after the latest
    op of the chain before it that may trigger, and after the latest op
    that made one of its own gradients (so that no product of the chain,
    ``m * momentum`` reading only a slot, is made long before its gradient
    and held until it). `onednn_cpu`: the step runs on oneDNN's CPU
    kernels (`target.Target.onednn_cpu`: more ops merge,
    `fusions.grappler_groups`).

    Returns:
      A tuple of edges, possibly empty.
    """
    chains = update_chains(index, roles)
    merged = fusions.grappler_groups(index, onednn_cpu).members
    edges = []

    def wait(first, chain):
        if first is None:
            return
        for head in chain.heads:
            # A head reading `first` already waits for it (an ``*Apply*``
            # op of a Session graph's optimizer reads its gradient).
            if (head in roles.waiters and head not in merged
                    and first not in index.predecessors(head)
                    and analysis.same_device(index.devices[first],
                                             index.devices[head])):
                edges.append((first, head))

    for k, chain in enumerate(chains):
        wait(_latest_trigger(index, roles, chain.gradients, merged), chain)
        if k:
            wait(_latest_trigger(index, roles, chains[k - 1].ops, merged),
                 chain)
    return gi.acyclic_edges(index, edges)
