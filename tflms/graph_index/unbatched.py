"""Tensors whose unknown first dimension is not the batch
(`GraphIndex.unbatched_elements`, which `tensor_bytes` reads).

`tensor_bytes` takes the first unknown dimension of a static shape for the
batch size. Two kinds of tensors have an unknown first dimension that is
not the batch, and would be sized (or ask for a batch size, raising
`BatchSizeError` when none is given) as if it were:

* Shape vectors: int32/int64 vectors of unknown length that hold a
  tensor's shape, broadcast shape or reduction axes (`Shape` of a tensor
  of unknown rank, `BroadcastGradientArgs`, which TensorFlow's gradients
  of broadcasting ops compute even when every shape is static, and the
  arithmetic, slicing and concatenation of such vectors). Their length
  is a rank, never the batch size: each gets the number of elements its
  inputs bound it to (the longer input of a broadcast, the sum of a
  concatenation's pieces), and a vector of an unknown rank the largest
  rank of the graph's tensors (at least 1). A few dozen bytes at most.
* Data-dependent counts: the outputs of ops whose output length is
  decided by the values they read (`Where`, `Unique`, `ListDiff`,
  `DynamicPartition`...), and what gathers rows by such a list of indices
  (`tf.boolean_mask` is `Where`, a reshape and a `GatherV2`). The number of
  rows is known only when the step runs: a `Where` over a [batch, time]
  mask selects up to batch x time rows, so the batch size is no bound,
  and asking the user for it would not make the size known. Their size
  stays unknown: they count 0 bytes and are listed with the other tensors
  of unknown size (`SimulationModel.unknown_tensors`, logged by the
  auto-tuner), as tensors of unknown rank already are.

Every other tensor keeps the batch rule, including those of the types
above that the rules here do not recognise (a `Range` whose length is a
tensor: ``tf.range(tf.shape(x)[0])`` is as long as the batch) and dynamic
reshapes (``tf.reshape(x, [-1, d])``: the first dimension of a reshape of
a batch is usually the batch or a multiple of it, which the index cannot
tell apart).

No TensorFlow here: the rules read op types, inputs and static shapes.
"""

# `unbatched_elements` of a data-dependent count: its size is unknown.
DATA_DEPENDENT = -1

# Ops whose outputs are shape vectors: their length is a rank.
_SHAPE_TYPES = frozenset({"Shape", "ShapeN", "BroadcastGradientArgs",
                          "BroadcastArgs"})
# Element-wise ops on shape vectors (and scalars or static vectors): the
# output is as long as the longest input (broadcasting).
_SHAPE_ARITHMETIC_TYPES = frozenset({
    "Add", "AddV2", "Sub", "Mul", "FloorDiv", "FloorMod", "Maximum",
    "Minimum", "Neg", "Abs", "Cast", "Identity", "StopGradient",
    "Snapshot", "RealDiv", "TruncateDiv", "TruncateMod",
})
# A part of input 0 (its own length bounds it); a gather of input 0 by the
# indices of input 1 is as long as the indices.
_SLICE_TYPES = frozenset({"StridedSlice", "Slice", "Reshape", "Squeeze",
                          "ExpandDims"})
_GATHER_TYPES = frozenset({"Gather", "GatherV2"})
# Concatenations: the sum of the pieces (the axis is input 0 of Concat,
# the last input of ConcatV2).
_CONCAT_AXIS_SLOT = {"Concat": 0, "ConcatV2": -1}

# Ops whose output length the values they read decide (every output with
# an unknown first dimension but those listed in _COUNTED_OUTPUTS).
_DATA_DEPENDENT_TYPES = frozenset({
    "Where", "Unique", "UniqueV2", "UniqueWithCounts",
    "UniqueWithCountsV2", "ListDiff", "DynamicPartition",
    "NonMaxSuppression", "NonMaxSuppressionV2", "NonMaxSuppressionV3",
    "NonMaxSuppressionV4", "NonMaxSuppressionV5", "SparseSegmentSum",
    "SparseSegmentMean", "SparseSegmentSqrtN", "SegmentSum", "SegmentMean",
    "SegmentMax", "SegmentMin", "SegmentProd", "RaggedTensorToTensor",
})
# The outputs of a unique op that the data decides: the unique values (and
# their counts); the index of each input element is as long as the input.
_COUNTED_OUTPUTS = {"Unique": (0,), "UniqueV2": (0,),
                    "UniqueWithCounts": (0, 2), "UniqueWithCountsV2": (0, 2)}
# Ops that gather rows of input 0 at the indices of input 1 (a
# data-dependent list of indices makes a data-dependent count of rows).
_ROW_GATHER_TYPES = frozenset({"Gather", "GatherV2", "ResourceGather",
                               "GatherNd"})
# Ops whose output 0 has the rows of their input 0 (a data-dependent
# count stays one through them).
_ROW_KEEPING_TYPES = frozenset({
    "Identity", "StopGradient", "Snapshot", "Reshape", "Squeeze",
    "ExpandDims", "Cast",
})


def _is_vector_of_unknown_length(shape):
    return shape is not None and len(shape) == 1 and shape[0] is None


def _static_length(shape):
    """Elements of a scalar or a vector of known length, else None."""
    if shape is None or len(shape) > 1:
        return None
    if not shape:
        return 1
    return shape[0]


def _vector_bound(op_type, inputs, length_of, max_rank):
    """Elements of a shape vector made by an op of `op_type` from
    `inputs`, or None if the op's output is not one. `length_of(p, k)`:
    the elements of an input that is a shape vector, a scalar or a static
    vector, else None."""
    lengths = [length_of(p, k) for p, k in inputs]
    if op_type in _SHAPE_TYPES:
        # Shape(x) of an unknown rank: the graph's largest rank. The
        # reduction axes of a broadcast: at most the longer shape.
        known = [n for n in lengths if n is not None]
        if op_type in ("Shape", "ShapeN") or not known:
            return max_rank
        return max(known)
    if None in lengths or not lengths:
        return None
    if op_type in _SHAPE_ARITHMETIC_TYPES:
        return max(lengths)
    if op_type in _SLICE_TYPES:
        return lengths[0]
    if op_type in _GATHER_TYPES and len(lengths) >= 2:
        return lengths[1]
    if op_type in _CONCAT_AXIS_SLOT:
        pieces = list(lengths)
        del pieces[_CONCAT_AXIS_SLOT[op_type]]
        return sum(pieces)
    return None


def unbatched_elements(types, inputs, output_shapes, ops_by_level):
    """`GraphIndex.unbatched_elements`: per op, a tuple with one entry per
    output: None where the first unknown dimension is the batch
    (`tensor_bytes`' rule), else the elements a shape vector is given or
    `DATA_DEPENDENT` (see the module docstring).

    Args:
      types, inputs, output_shapes: the index's per-op fields.
      ops_by_level: op ids per level: each op comes after its inputs (but
        for a v1 loop's back edge, whose input then counts as neither kind).
    """
    max_rank = max([len(s) for shapes in output_shapes for s in shapes
                    if s is not None] + [1])
    out = [[None] * len(shapes) for shapes in output_shapes]
    shape_vectors = {}  # (op, output) -> elements

    def length_of(p, k):
        if (p, k) in shape_vectors:
            return shape_vectors[(p, k)]
        return _static_length(output_shapes[p][k])

    for level_ops in ops_by_level:
        for i in level_ops:
            op_type, shapes = types[i], output_shapes[i]
            unknown_first = [s is not None and len(s) > 0 and s[0] is None
                             for s in shapes]
            if not any(unknown_first):
                continue
            if any(_is_vector_of_unknown_length(s) for s in shapes):
                bound = _vector_bound(op_type, inputs[i], length_of,
                                      max_rank)
                if bound is not None:
                    for k, s in enumerate(shapes):
                        if _is_vector_of_unknown_length(s):
                            out[i][k] = shape_vectors[(i, k)] = bound
                    continue
            if op_type in _DATA_DEPENDENT_TYPES or _reads_a_count(
                    op_type, inputs[i], out):
                counted = _COUNTED_OUTPUTS.get(op_type, range(len(shapes)))
                for k in counted:
                    if unknown_first[k]:
                        out[i][k] = DATA_DEPENDENT
    return tuple(tuple(o) for o in out)


def _reads_a_count(op_type, inputs, out):
    """True if an op's rows are a data-dependent count: it gathers by
    data-dependent indices or passes such rows on."""
    if op_type in _ROW_GATHER_TYPES and len(inputs) >= 2:
        p, k = inputs[1]
        return out[p][k] == DATA_DEPENDENT
    if op_type in _ROW_KEEPING_TYPES and inputs:
        p, k = inputs[0]
        return out[p][k] == DATA_DEPENDENT
    return False
