"""Ops TensorFlow merges into one node at run time, which LMS must not
come between.

Two passes merge ops after LMS has planned: oneDNN's layout pass
(`fusion_partners`: LMS never orders such ops apart, since the merged node
would close a cycle) and Grappler's arithmetic optimizer and remapper
(`grappler_groups`: LMS swaps nothing out of them and adds no control edge
to them, or the step would round differently). Both see through the
identities Grappler removes first (`graph_index.GRAPPLER_IDENTITY_TYPES`).
Pure: questions on a `GraphIndex`, no TensorFlow.
"""

from typing import NamedTuple

from tflms import graph_index as gi

__all__ = ["GrapplerGroups", "fusion_partners", "grappler_groups",
           "through_identities",
           "swishes", "pools_with_workspace", "folded_transposes",
           "power_gradients", "broadcast_gradients"]


class GrapplerGroups(NamedTuple):
    """What `grappler_groups` finds, as frozensets of op ids."""
    # Ops merged into their reader: their output is never swapped.
    inner: frozenset
    # Those and their readers: never triggers or waiters.
    members: frozenset
    # Readers that must read their inputs as the model wrote them, not
    # from a swap-in (a pattern matching the same tensor twice).
    direct_readers: frozenset


def through_identities(index, producer, output):
    """The tensor ``(producer, output)`` stands for once Grappler has
    removed the identities in front of it (and the arithmetic that changes
    nothing, `GraphIndex.forwards_input`)."""
    seen = 0
    while seen < 64:
        t = index.types[producer]
        if t in gi.GRAPPLER_IDENTITY_TYPES and index.inputs[producer]:
            producer, output = index.inputs[producer][0]
        elif t == "IdentityN" and output < len(index.inputs[producer]):
            producer, output = index.inputs[producer][output]
        elif output == 0 and index.forwards_input[producer] is not None:
            # x * 1, x + 0...: the arithmetic optimizer removes them too.
            producer, output = index.inputs[producer][
                index.forwards_input[producer]]
        else:
            break
        seen += 1
    return producer, output


def fusion_partners(index):
    """Ops that TensorFlow may merge into one node at run time.

    With oneDNN on (TF_ENABLE_ONEDNN_OPTS=1, the default on CPUs with
    AVX512_VNNI, AVX512_BF16 or AMX), TensorFlow's `MklLayoutRewritePass`
    merges, after Grappler and before the executor runs:

    * a `Conv2DBackpropFilter` and a `BiasAddGrad` that read the same
      gradient (into `_MklNativeConv2DBackpropFilterWithBias`),
    * a `Conv2D` and the `BiasAdd` reading its output,
    * a `Pad` and the `Conv2D` reading its output.

    The merged node takes over the control inputs and outputs of both ops
    and the pass does not check for cycles. So an LMS control edge from one
    of them to a swap-in read by the other (``BiasAddGrad -> swap-in ->
    Conv2DBackpropFilter``) becomes a cycle through the merged node: the
    executor never runs it nor anything after it, silently, and the step
    ends without the weight updates that depend on it (nor the global
    step's `AssignAdd`, which waits for all of them). Grappler's own
    remapper fusions decline ops with control edges, which would only
    change rounding; LMS leaves those alone too (`grappler_groups`).

    Identities in between count as absent (Grappler removes them first).

    Returns:
      dict op id -> frozenset of partner op ids (only ops with partners).
    """
    partners = {}

    def pair(a, b):
        partners.setdefault(a, set()).add(b)
        partners.setdefault(b, set()).add(a)

    types = index.types
    for op, t in enumerate(types):
        if t == "BiasAddGrad" and index.inputs[op]:
            grad = through_identities(index, *index.inputs[op][0])
            for c in _readers_of(index, grad):
                if types[c] == "Conv2DBackpropFilter":
                    pair(op, c)
        elif t in ("BiasAdd", "BiasAddV1") and index.inputs[op]:
            p, _ = through_identities(index, *index.inputs[op][0])
            if types[p] == "Conv2D":
                pair(p, op)
        elif t == "Conv2D" and index.inputs[op]:
            p, _ = through_identities(index, *index.inputs[op][0])
            if types[p] in ("Pad", "MirrorPad"):
                pair(p, op)
    return {k: frozenset(v) for k, v in partners.items()}


# Op kinds Grappler merges into their one reader: the arithmetic
# optimizer's AddOpsRewrite collapses trees of Add, AddV2 and AddN into an
# AddN per input shape and its MinimizeBroadcasts reorders chains of Mul;
# the remapper fuses a convolution or product with its BiasAdd, and a
# BiasAdd with its activation (one _FusedConv2D / _FusedMatMul kernel).
_ADD = ("Add", "AddV2", "AddN")
_MERGED_INTO = {
    **{t: _ADD for t in _ADD},
    "Mul": ("Mul",),
    # ConvertPow makes x * x (Square) and x * x * x of Pow(x, 2 or 3),
    # which then join the Mul chains MinimizeBroadcasts reorders (GELU's
    # 0.044715 * x ** 3; its gradient's x ** 2 is `power_gradients`').
    "Pow": ("Mul",),
    "Square": ("Mul",),
    **{t: ("BiasAdd",) for t in ("Conv2D", "Conv3D", "DepthwiseConv2dNative",
                                 "MatMul")},
    "BiasAdd": ("Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"),
}


def grappler_groups(index, onednn_cpu=False):
    """Ops Grappler merges with their reader, which LMS must leave alone.

    The arithmetic optimizer turns ``(a + b) + c`` into ``AddN(a, b, c)``
    (which rounds differently from the additions as written) and the
    remapper fuses a ``Conv2D`` with its ``BiasAdd`` (`_MERGED_INTO`), but
    only where the inner op has exactly one reader and no op of the group
    has a control edge in or out. LMS would change that: a swap-out is a
    second reader, a swap-in between the two ops hides the inner one, and
    a trigger or a waiter gets a control edge. The step would then round
    differently from the step without LMS. Identities in between count as
    absent (Grappler removes them first). So do ``IdentityN`` ops of more
    than one input (Keras 3's optimizer passes every gradient through one),
    but the dependency optimizer removes those only while no control edge
    goes in or out (each would become one per input): they are members, so
    that the gradients still meet the update's products once they are gone.

    A reader that only asks for a tensor's shape (``Shape``, ``Size``...)
    does not count: the gradient of an addition reads both operands'
    shapes, and Grappler's constant folding turns the broadcast of two
    symbolically equal shapes into a constant and drops those readers
    before the arithmetic optimizer counts them, even when the batch is
    unknown (a layer normalization's ``x * scale + (offset - mean * scale)``
    in a transformer fit with whole batches was left unmerged).

    The arithmetic optimizer also folds a transpose of the last two
    dimensions into the ``MatMul`` or ``BatchMatMul`` that reads it (one
    product with ``transpose_b``, a kernel that may sum in another order):
    only where
    the product reads the ``Transpose`` itself, so the transpose is never
    swapped (`folded_transposes`: GPT-2's logits against its tied token
    embedding, the attention's gradient products against the scores'
    gradient). The fold looks at each operand alone, so the product's
    other operand may be a swap-in (the attention's queries and keys,
    read again by the gradient's products).

    On oneDNN's CPU kernels (`onednn_cpu`: `target.Target.onednn_cpu`)
    two more: the remapper makes one ``_MklSwish`` of ``x * sigmoid(x)``
    (the Mul must read ``x`` itself, not a swap-in), and the layout pass
    gives a
    MaxPoolGrad its pool's workspace while it reads the pool's output
    (which is then not swapped).

    Returns:
      a `GrapplerGroups`: `inner` the ops merged into their reader (their
      output is not swapped), `members` those and their readers (never
      triggers or waiters; a folded transpose is inner, its product
      not), `direct_readers` the ops that read no swap-in (a swish's Mul
      must read the Sigmoid's own input).
    """
    types = index.types
    inner, members, direct_readers = set(), set(), set()
    shared = frozenset(power_gradients(index))
    for op, t in enumerate(types):
        into = _MERGED_INTO.get(t)
        if into is None or not index.consumers[op]:
            continue
        readers = _readers_of(index, (op, 0))
        if len(readers) == 1 and types[readers[0]] in into:
            members.update((op, readers[0]))
            if op not in shared:
                inner.add(op)
    members.update(op for op, t in enumerate(types)
                   if t == "IdentityN" and len(index.inputs[op]) > 1)
    inner.update(transpose for transpose, _ in folded_transposes(index))
    if onednn_cpu:
        for sigmoid, mul in swishes(index):
            inner.add(sigmoid)
            members.update((sigmoid, mul))
            direct_readers.add(mul)
        inner.update(pools_with_workspace(index))
    return GrapplerGroups(frozenset(inner), frozenset(members),
                          frozenset(direct_readers))


_PRODUCTS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2",
                       "BatchMatMulV3"})
_TRANSPOSES = frozenset({"Transpose", "ConjugateTranspose"})


def folded_transposes(index):
    """``(transpose, product)`` pairs where a ``MatMul`` or
    ``BatchMatMul`` reads a transpose of the last two dimensions of a
    tensor: Grappler's arithmetic optimizer folds it into the product
    (``FoldTransposeIntoMatMul``), for each product reading it directly.

    The permutation is a constant the index does not hold, so it is read
    from the shapes: every leading dimension kept, the last two swapped
    (an unknown dimension matches anything). Where the shapes cannot tell
    (a square matrix), the pair is taken: a product kept off swap-ins
    costs memory, a transpose not folded costs the same numbers."""
    types = index.types
    for op, t in enumerate(types):
        if t not in _TRANSPOSES or not index.inputs[op]:
            continue
        producer, output = index.inputs[op][0]
        if not _swaps_last_two(index.output_shapes[producer][output],
                               index.output_shapes[op][0]):
            continue
        for reader in _readers_of(index, (op, 0)):
            if types[reader] in _PRODUCTS:
                yield op, reader


def _swaps_last_two(before, after):
    """Whether shape `after` can be `before` with its last two dimensions
    swapped (None: an unknown dimension or rank)."""
    if before is None or after is None:
        return False
    if len(before) != len(after) or len(before) < 2:
        return False
    expected = tuple(before[:-2]) + (before[-1], before[-2])
    return all(a is None or b is None or a == b
               for a, b in zip(expected, after))


def pools_with_workspace(index):
    """MaxPool ops whose output a MaxPoolGrad reads: oneDNN's layout pass
    gives the gradient the forward pool's workspace (the positions of the
    maxima) only while it reads the pool's own output, and otherwise
    leaves TensorFlow's kernel, which places the gradient of tied maxima
    elsewhere (NASNet's pools of ReLU outputs)."""
    types = index.types
    for op, t in enumerate(types):
        if t == "MaxPoolGrad" and len(index.inputs[op]) > 1:
            pool, _ = through_identities(index, *index.inputs[op][1])
            if types[pool] == "MaxPool":
                yield pool


def swishes(index):
    """``(sigmoid, mul)`` pairs computing ``x * sigmoid(x)``, where the
    Sigmoid has that Mul as its one reader: with oneDNN on, the remapper
    makes one ``_MklSwish`` of them, which rounds differently from the two
    ops (``keras.activations.silu``: EfficientNet's activations)."""
    types = index.types
    for op, t in enumerate(types):
        if t != "Sigmoid" or not index.inputs[op]:
            continue
        readers = _readers_of(index, (op, 0))
        if len(readers) != 1 or types[readers[0]] != "Mul":
            continue
        x = through_identities(index, *index.inputs[op][0])
        operands = [through_identities(index, *tensor)
                    for tensor in index.inputs[readers[0]]]
        if x in operands:
            yield op, readers[0]


# Readers of a tensor's shape alone (`grappler_groups`).
_SHAPE_READERS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
# What Grappler removes between a tensor and its readers: its identities,
# and an IdentityN's slot k handing on its input k.
_GRAPPLER_PASSING = gi.GRAPPLER_IDENTITY_TYPES | {"IdentityN"}


def _readers_of(index, tensor):
    """Ops reading `tensor`'s value directly or through identities (not
    those that read its shape only)."""
    return index.readers_through(tensor, _GRAPPLER_PASSING,
                                 ignored=_SHAPE_READERS)


def power_gradients(index):
    """Gradient powers ``pow(x, y - 1)`` of a power ``pow(x, y)`` of the
    same tensor (TensorFlow's gradient of ``Pow``): `grappler_groups`
    keeps them members but not inner, so their output may be swapped.

    GELU's ``x ** 3`` and its gradient's ``x ** 2``: ConvertPow makes a
    Square of ``x`` for both and the deduplication shares it, so it has
    two readers already and joins no chain; a swap-out is one more reader
    (GPT-2's and Gemma's gradients train bit for bit with it swapped),
    and the gradient's power is no longer held from the forward pass to
    the backward one (96 MiB per layer of GPT-2 small at sequence 1024,
    batch 8). Reading ``x`` from a swap-in instead (a recompute) would
    split the shared Square, and Gemma's products round differently.

    Only where ``x`` is also read by a product of its own (GELU's ``0.5 *
    x``, `_read_by_a_product`): where it is not (``tanh(x + c * x ** 3)``,
    or the same under a ReLU or a scale), TensorFlow 2.15's and 2.21's
    Grappler, with oneDNN on or off, order the cube's product ``c * x *
    x ** 2`` otherwise once the Square has a third reader, and the numbers
    change (`tests/test_grappler_check.py` shows both). The exponent's
    value is not in the index: a power of 4 would have a gradient ``x **
    3``, which on oneDNN-less CPUs Grappler makes a product joining a
    chain (on a GPU it stays a Pow)."""
    types = index.types
    for op, t in enumerate(types):
        if t != "Pow" or len(index.inputs[op]) < 2:
            continue
        x, (sub, _) = index.inputs[op][0], index.inputs[op][1]
        if types[sub] != "Sub" or not index.inputs[sub] or \
                not _read_by_a_product(index, x):
            continue
        y = index.inputs[sub][0]
        for c, slot in index.consumers[x[0]][x[1]]:
            if (c != op and slot == 0 and types[c] == "Pow"
                    and len(index.inputs[c]) > 1
                    and index.inputs[c][1] == y):
                yield op
                break


def _read_by_a_product(index, tensor):
    """True if a ``Mul`` reads `tensor` itself (GELU's ``0.5 * x``): a
    condition found by trying the variants `power_gradients` names, not
    one read in Grappler's source."""
    return any(index.types[c] == "Mul"
               for c, _ in index.consumers[tensor[0]][tensor[1]])


def broadcast_gradients(index):
    """The ``Sum`` and ``Reshape`` that reduce a gradient to the shape of
    an operand of a broadcasting binary op, ``Reshape(Sum(g,
    BroadcastGradientArgs(...)), Shape(x))`` (TensorFlow's gradient of
    ``Add``, ``Mul``...). Where nothing was broadcast, Grappler's
    constant folding and arithmetic optimizer remove both, in a pass that
    a control edge on them delays: the sum of gradients they feed is then
    sorted (canonicalized) by its inputs' names before they go rather than
    after, and adds its terms in another order (Gemma's GELU gradient
    rounded differently)."""
    types = index.types
    for op, t in enumerate(types):
        if t != "Reshape" or not index.inputs[op]:
            continue
        total, _ = index.inputs[op][0]
        if (types[total] == "Sum" and len(index.inputs[total]) > 1
                and types[index.inputs[total][1][0]]
                == "BroadcastGradientArgs"):
            yield total
            yield op
