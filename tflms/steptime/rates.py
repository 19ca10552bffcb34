"""What an op achieves of its GPU's peak rates: the step-time model's
fractions (`Efficiency`; `PEAK`, the roofline; `ACHIEVED`, fitted to
published runs) and the op types it times apart."""

import dataclasses

from tflms.graph_index.index import (BUFFER_FORWARDING_TYPES,
                                     CONTROL_FLOW_V1_TYPES)

__all__ = ["LAUNCH_OVERHEAD_S", "Efficiency", "PEAK", "ACHIEVED",
           "CONVOLUTION_TYPES", "NO_KERNEL_TYPES", "ELEMENTWISE_TYPES",
           "REDUCTION_TYPES"]

# What launching one kernel costs beyond its work: CUDA's launch latency
# (a few microseconds) plus TensorFlow's executor bookkeeping per op. 5 us is
# a round figure in that range; set it per model with `launch_overhead_s`.
LAUNCH_OVERHEAD_S = 5e-6

@dataclasses.dataclass(frozen=True)
class Efficiency:
    """The fractions of the published peak rates kernels reach. Matrix
    products (`MatMul`, `BatchMatMul*`: cuBLAS) and convolutions
    (`CONVOLUTION_TYPES`: cuDNN) per precision (`PRECISIONS`), memory-bound
    work of the HBM bandwidth. One set for every GPU and model: what
    differs between GPUs is their peak rates, what differs between models
    is their ops. Every fraction defaults to 1 (the peak).

    Raises:
      ValueError: a fraction that is not in (0, 1].
    """

    memory: float = 1.0
    fp32: float = 1.0
    tf32: float = 1.0
    fp16: float = 1.0
    bf16: float = 1.0
    conv_fp32: float = 1.0
    conv_tf32: float = 1.0
    conv_fp16: float = 1.0
    conv_bf16: float = 1.0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not 0 < value <= 1:
                raise ValueError(
                    "Efficiency.%s must be a fraction of the peak in (0, 1]; "
                    "got %r" % (field.name, value))

    def of(self, precision, convolution=False):
        """The fraction for products in `precision`: a convolution's, or a
        matrix product's."""
        return getattr(self, ("conv_" if convolution else "") + precision)


# Every kernel at its peak rate: the roofline as the datasheets draw it.
PEAK = Efficiency()

# The fractions fitted to published single-GPU training throughput by
# `benchmarks/step_time.py` (docs/benchmarks.md, "Step-time model": which
# published runs they were fitted on, and how far off the model is on the
# runs held out). The products' fractions come from BERT-large, the
# convolutions' from ResNet50, memory from both. bfloat16 takes float16's
# fractions: no published run in bfloat16 was fitted or held out.
ACHIEVED = Efficiency(
    memory=0.98,
    fp32=0.77, tf32=0.71, fp16=0.515, bf16=0.515,
    conv_fp32=0.851, conv_tf32=0.447, conv_fp16=0.43, conv_bf16=0.43)

# Convolutions and their gradients (cuDNN's kernels; `Efficiency` gives
# them fractions of their own).
CONVOLUTION_TYPES = frozenset({
    "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D",
    "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter",
})

# Ops that run no GPU kernel in a step: they forward a buffer, hand out a
# variable, or were materialized before the step (constants, fed inputs).
NO_KERNEL_TYPES = BUFFER_FORWARDING_TYPES | frozenset({
    "Snapshot",
    "ReadVariableOp", "VarHandleOp", "VariableV2", "Variable",
    "VarHandleOpV2", "VarIsInitializedOp",
    "Const", "Placeholder", "PlaceholderWithDefault", "NoOp",
    "Shape", "ShapeN", "Size", "Rank",
}) | CONTROL_FLOW_V1_TYPES



# Ops that compute each output element from the elements at the same
# position of their inputs (broadcasting allowed), or draw them at random:
# what XLA's loop fusion merges into one kernel.
ELEMENTWISE_TYPES = frozenset({
    "Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Div", "DivNoNan",
    "Neg", "Abs", "Sign", "Maximum", "Minimum", "Pow", "Reciprocal",
    "ReciprocalGrad", "Square", "SquaredDifference", "Sqrt", "SqrtGrad",
    "Rsqrt", "RsqrtGrad", "Exp", "Log", "Log1p", "Erf", "Erfc", "Tanh",
    "TanhGrad", "Sigmoid", "SigmoidGrad", "Relu", "ReluGrad", "Relu6",
    "Relu6Grad", "Elu", "EluGrad", "Selu", "SeluGrad", "Softplus",
    "SoftplusGrad", "LeakyRelu", "LeakyReluGrad", "BiasAdd", "Cast",
    "Select", "SelectV2", "Greater", "GreaterEqual", "Less", "LessEqual",
    "Equal", "NotEqual", "LogicalAnd", "LogicalOr", "LogicalNot",
    "ZerosLike", "OnesLike", "Floor", "Ceil", "Round", "FloorDiv",
    "FloorMod", "ClipByValue", "RandomUniform", "RandomStandardNormal",
})

# Reductions, into which XLA fuses the elementwise ops that feed them.
REDUCTION_TYPES = frozenset({"Sum", "Mean", "Max", "Min", "Prod",
                             "BiasAddGrad"})
