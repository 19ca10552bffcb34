"""The ops that only initialize variables (`tflms.initializers`), on a
literal graph."""

from tflms import graph_index as gi
from tflms import initializers


def names_of(index, op_ids):
    return {index.names[i] for i in op_ids}


def test_initializer_ops():
    """v/Initializer/random and v/Assign are seeds; stddev feeds only a
    seed, so it is initializer-only too; v is read by training as well."""
    index = gi.from_edges(
        [("v", "VariableV2"), ("stddev", "Const"),
         ("v/Initializer/random", "RandomNormal"), ("v/Assign", "Assign"),
         ("x", "Placeholder"), ("v/read", "Identity"), ("mm", "MatMul"),
         ("init", "NoOp")],
        edges=[("stddev", "v/Initializer/random"), ("v", "v/Assign"),
               ("v/Initializer/random", "v/Assign"), ("v", "v/read"),
               ("x", "mm"), ("v/read", "mm")],
        control_edges=[("v/Assign", "init")])
    assert names_of(index, initializers.initializer_seeds(index)) == {
        "v/Initializer/random", "v/Assign"}
    assert names_of(index, initializers.initializer_only_ops(index)) == {
        "stddev", "v/Initializer/random", "v/Assign"}
    assert names_of(index, initializers.initializer_inputs(index)) == {
        "stddev", "v/Initializer/random", "v/Assign", "v"}
