"""GPU kernels that write their output into one of their inputs' buffers.

Many element-wise kernels ask TensorFlow for their output with
``forward_input_or_allocate_output`` (or try
``forward_input_to_output_with_shape`` input by input, as ``AddN`` does):
the runtime hands them an input's buffer as output 0 instead of allocating
a new one when, at the kernel's launch,

* the input is not a reference (a v1 variable) and has the output's dtype
  and number of elements, on the same memory type, and
* nothing else holds the buffer: its reference count is one. The executor
  gives every reader its own reference to a tensor and drops it when the
  reader has been launched, so the count is one only for the buffer's last
  reader, and only if no other reference is held: a variable's buffer, a
  tensor still being copied to the host, a tensor read twice by the same
  op (``x * x``) are never forwarded.

The kernel tries its candidate inputs in order and takes the first one that
can be forwarded. Both the simulator (`tflms.simulator.buffers`) and the
oracle's runtime replay (`tflms.tf.oracle.runtime`) apply this rule; this
module only says which op types do it and from which inputs. Sources:
TensorFlow's ``cwise_ops_common.h`` (``BinaryOpShared``, ``UnaryOp``),
``numeric_op.h`` (``UnaryElementWiseOp``, ``BinaryElementWiseOp``: the
activations and their gradients), ``aggregate_ops.h`` (``AddN``),
``bias_op.cc``, ``softmax_op.cc``, ``fused_batch_norm_op.cc``,
``cwise_op_select.cc`` and ``op_kernel.cc``
(``OpKernelContext::forward_input``). TensorFlow 2.21's GPU build runs some
of these ops (``AddV2``, ``Mul``, ``Relu``...) with generated kernels that
forward under the same rule. Left out, as not checked: ``Softplus``,
``Softsign``, ``Cast`` (which changes the dtype in any case),
``AccumulateNV2``, and the second output of
``SoftmaxCrossEntropyWithLogits``.
"""

__all__ = ["ALL_INPUTS", "INPLACE_INPUTS", "inplace_candidates"]

# The candidate slots of an op type that may take any of its inputs.
ALL_INPUTS = None

_BINARY = (0, 1)
_UNARY = (0,)

# op type -> the input slots the kernel may forward to output 0, in the
# order it tries them (`ALL_INPUTS`: every input, in slot order).
INPLACE_INPUTS = {
    # Element-wise binary arithmetic (BinaryOpShared): the output takes
    # input 0's or input 1's buffer when that input has the output's shape
    # (no broadcasting on its side) and dtype. Comparisons and logical ops
    # have a bool output and never forward a float input.
    **{t: _BINARY for t in (
        "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan",
        "MulNoNan", "Maximum", "Minimum", "SquaredDifference", "Pow",
        "FloorDiv", "FloorMod", "TruncateDiv", "TruncateMod", "Xdivy",
        "Xlogy", "Xlog1py", "Atan2",
        # Gradients registered as binary element-wise ops.
        "SigmoidGrad", "TanhGrad", "RsqrtGrad", "SqrtGrad",
        "ReciprocalGrad", "InvGrad",
        # Activation gradients (BinaryElementWiseOp): gradients, features.
        "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad",
    )},
    # Element-wise unary ops (UnaryOp, UnaryElementWiseOp). Abs of a
    # complex number changes the element size and never forwards.
    **{t: _UNARY for t in (
        "Neg", "Exp", "Expm1", "Log", "Log1p", "Sqrt", "Rsqrt", "Square",
        "Tanh", "Sigmoid", "Abs", "Reciprocal", "Inv", "Sin", "Cos", "Tan",
        "Erf", "Erfc", "Floor", "Ceil", "Round", "Rint", "Sign",
        "Relu", "Relu6", "Elu", "Selu", "LeakyRelu",
    )},
    # Bias, softmax and batch normalization's output y (from x).
    **{t: _UNARY for t in (
        "BiasAdd", "BiasAddV1", "Softmax", "LogSoftmax",
        "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3",
    )},
    # Selections: the then and else inputs.
    "Select": (1, 2), "SelectV2": (1, 2),
    # Sums of gradients: the first input that can be forwarded.
    "AddN": ALL_INPUTS,
}


def inplace_candidates(op_type, num_inputs):
    """The input slots an op of `op_type` with `num_inputs` data inputs may
    forward to its output 0, in the order its kernel tries them; () if
    none."""
    slots = INPLACE_INPUTS.get(op_type, ())
    if slots is ALL_INPUTS:
        return tuple(range(num_inputs))
    return tuple(s for s in slots if s < num_inputs)
