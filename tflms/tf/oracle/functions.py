"""A `tf.function`'s graph as the oracle measures it.

A concrete function's graph (`FuncGraph`) does not hold its variables: it
reads each through a resource `Placeholder` fed with the variable's handle
at every call (a *capture*). The virtual cluster would see placeholders of
unknown contents: no variable bytes, and reads of unknown size. `graph_def`
hands it the graph with each captured variable's placeholder made the
`VarHandleOp` a Session graph has for a resource variable (the same name,
the variable's dtype and shape; on request its device), so that the graph
is measured like a graph-mode training step: variables resident on the
GPU for the whole step (`tflms.tf.oracle.runtime`), their reads and
updates sized. Nothing else changes; the function graph itself is not
modified.
"""

import tensorflow as tf
from tensorflow.python.framework import func_graph as func_graph_module

from tflms.tf import function_api

__all__ = ["graph_def", "is_function_graph"]


def is_function_graph(graph):
    """True for the graph of a `tf.function` (a `FuncGraph`)."""
    return isinstance(graph, func_graph_module.FuncGraph)


def graph_def(graph, variable_devices=False):
    """`graph.as_graph_def()`, with the variables a function graph captures
    as `VarHandleOp` nodes in place of their resource placeholders (any
    other graph: as it is).

    Args:
      graph: a `tf.Graph`; a `FuncGraph` is converted.
      variable_devices: each captured variable's node placed on the
        variable's own device where its placeholder has none, as
        TensorFlow places every op on a resource where the resource
        lives: a Keras 3 optimizer's slots moved to the host
        (`tflms.tf.host_slots`) are measured there. False: unplaced, as
        traced (the oracle puts them on its GPU).

    Returns:
      A new `GraphDef`.
    """
    result = graph.as_graph_def()
    if not is_function_graph(graph):
        return result
    variables = function_api.captured_variables(graph)
    for node in result.node:
        v = variables.get(node.name)
        if v is None or node.op != "Placeholder":
            continue
        node.op = "VarHandleOp"
        node.ClearField("attr")
        node.attr["dtype"].type = v.dtype.base_dtype.as_datatype_enum
        node.attr["shape"].shape.CopyFrom(tf.TensorShape(v.shape).as_proto())
        node.attr["container"].s = b""
        node.attr["shared_name"].s = node.name.encode()
        if variable_devices and not node.device:
            node.device = v.device or ""
    return result
