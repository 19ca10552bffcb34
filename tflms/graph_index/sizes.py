"""Sizes and costs of an index's ops: `tensor_bytes` of a static shape
(the first unknown dimension is the batch, but for the shape vectors and
data-dependent counts of `tflms.graph_index.unbatched`), and the
floating-point operations of matrix products and convolutions
(`contraction_flops` for a reader, `op_flops` of an indexed op).
"""

from tflms.graph_index.unbatched import DATA_DEPENDENT

# Contractions whose floating-point operations the index counts, each a
# function of (attr, input shapes, output shapes) with every dimension known,
# where attr(name) is the op's attribute (the reader passes
# `tf.Operation.get_attr`). A multiply-add is two operations, as in
# TensorFlow's registered "flops" statistics (``tf.compat.v1``
# ``ops.get_stats_for_node_def``), which cover the forward ops only, and need
# fully known shapes; the gradients here cost what their forward op does (the
# same multiply-adds in another order).
def prod(dims):
    """The product of a sequence of ints (1 for none)."""
    total = 1
    for d in dims:
        total *= d
    return total


def _matmul_flops(attr, ins, outs):
    a = ins[0]
    k = a[0] if attr("transpose_a") else a[1]
    return 2 * k * prod(outs[0])


def _batch_matmul_flops(attr, ins, outs):
    a = ins[0]
    k = a[-2] if attr("adj_x") else a[-1]
    return 2 * k * prod(outs[0])


def _conv_flops(attr, ins, outs):
    # filter (..., in_depth, out_depth): each output element is a dot
    # product over the window and the input depth.
    return 2 * prod(outs[0]) * prod(ins[1][:-1])


def _conv_backprop_input_flops(attr, ins, outs):
    # (input_sizes, filter, out_backprop)
    return 2 * prod(ins[2]) * prod(ins[1][:-1])


def _conv_backprop_filter_flops(attr, ins, outs):
    # (input, filter_sizes, out_backprop); the output is the filter.
    return 2 * prod(ins[2]) * prod(outs[0][:-1])


def _depthwise_flops(attr, ins, outs):
    return 2 * prod(outs[0]) * prod(ins[1][:-2])


def _depthwise_backprop_input_flops(attr, ins, outs):
    return 2 * prod(ins[2]) * prod(ins[1][:-2])


def _depthwise_backprop_filter_flops(attr, ins, outs):
    return 2 * prod(ins[2]) * prod(outs[0][:-2])


_FLOP_RULES = {
    "MatMul": _matmul_flops,
    "BatchMatMul": _batch_matmul_flops,
    "BatchMatMulV2": _batch_matmul_flops,
    "BatchMatMulV3": _batch_matmul_flops,
    "Conv2D": _conv_flops,
    "Conv3D": _conv_flops,
    "Conv2DBackpropInput": _conv_backprop_input_flops,
    "Conv3DBackpropInputV2": _conv_backprop_input_flops,
    "Conv2DBackpropFilter": _conv_backprop_filter_flops,
    "Conv3DBackpropFilterV2": _conv_backprop_filter_flops,
    "DepthwiseConv2dNative": _depthwise_flops,
    "DepthwiseConv2dNativeBackpropInput": _depthwise_backprop_input_flops,
    "DepthwiseConv2dNativeBackpropFilter": _depthwise_backprop_filter_flops,
}
FLOP_TYPES = frozenset(_FLOP_RULES)


def _with_batch(shape, batch_size):
    """A static shape with its first unknown dimension set to `batch_size`
    (the convention of `tensor_bytes`); None if it stays unknown."""
    if shape is None:
        return None
    dims = list(shape)
    for k, d in enumerate(dims):
        if d is None:
            dims[k] = batch_size
            break
    return None if None in dims else dims


def contraction_flops(op_type, attr, input_shapes, output_shapes):
    """``(fixed, per_example)`` FLOPs of a `FLOP_TYPES` op
    (`GraphIndex.flops`); (0, 0) when a shape it needs is unknown beyond the
    batch dimension.

    Every count here is linear in the batch dimension (it enters one factor
    of a product), so two evaluations, at batch sizes 1 and 2, give both
    parts.

    Args:
      op_type: a type of `FLOP_TYPES`.
      attr: ``attr(name)`` -> the op's attribute `name` (``transpose_a``,
        ``adj_x``).
      input_shapes, output_shapes: per tensor, None (unknown rank) or a
        tuple of dims with None for unknown dims.
    """
    rule = _FLOP_RULES[op_type]

    def at(batch_size):
        i = [_with_batch(s, batch_size) for s in input_shapes]
        o = [_with_batch(s, batch_size) for s in output_shapes]
        try:
            return rule(attr, i, o)
        except (TypeError, IndexError, ValueError):
            return None  # an unknown shape (None) or an unexpected rank

    one, two = at(1), at(2)
    if one is None or two is None:
        return (0, 0)
    return (int(2 * one - two), int(two - one))


def tensor_bytes(index, op_id, output, batch_size=None):
    """Static size in bytes of an output tensor.

    The first unknown dimension is taken as the batch size; any further
    unknown dimension makes the size unknown. Not so for the tensors
    `GraphIndex.unbatched_elements` names: a shape vector of unknown length
    has the elements given there, whatever the batch size, and a
    data-dependent count of rows has no static size (None).

    Args:
      index: a `GraphIndex`.
      op_id: producer id.
      output: output index.
      batch_size: value for the first unknown dimension, or None.

    Returns:
      The size in bytes, or None if it cannot be known statically.
    """
    itemsize = index.output_itemsizes[op_id][output]
    if itemsize == 0:
        return 0
    if index.unbatched_elements:
        elements = index.unbatched_elements[op_id][output]
        if elements is not None:
            if elements == DATA_DEPENDENT:
                return None
            return elements * itemsize
    shape = index.output_shapes[op_id][output]
    if shape is None:
        return None
    elements = 1
    batch_used = False
    for dim in shape:
        if dim is None:
            if batch_used or batch_size is None:
                return None
            dim = batch_size
            batch_used = True
        elements *= dim
    return elements * itemsize


def op_flops(index, op_id, batch_size=None):
    """Floating-point operations of one run of an op (`GraphIndex.flops`).

    Args:
      index: a `GraphIndex`.
      op_id: the op.
      batch_size: the batch size, for counts that grow with it.

    Returns:
      ``fixed + per_example * batch_size`` as an int, or None when the
      count grows with the batch and no batch size is given.
    """
    fixed, per_example = index.flops[op_id]
    if not per_example:
        return fixed
    if batch_size is None:
        return None
    return fixed + per_example * batch_size
