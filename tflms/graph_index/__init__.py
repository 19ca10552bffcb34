"""One read-only index of a graph, built once, queried everywhere.

A `GraphIndex` records, per operation id (ids are positions in creation
order): names, types, devices, data inputs and consumers per tensor,
control inputs and outputs, static output shapes and element sizes,
variable sizes, the floating-point operations of matrix products and
convolutions (for the step-time model), and the few control-flow facts LMS
needs. Levels of the categorized topological sort are computed from it.
Every analysis (planning, simulation, tuning) answers its questions from
this index with integer ids, which keeps the analysis pure, deterministic
and O(V + E).

This module imports no TensorFlow (`tests/test_pure_core.py`), and nor do
the modules that query the index. Two constructors make an index:
`tflms.tf.reader.build_index` reads the training step of a `tf.Graph` (the
one reader of TensorFlow before the rewriter: whatever `analysis`,
`planner` and `simulator` need beyond the graph's structure, such as
collections, function libraries, control-flow contexts and op defs, it
reads once into plain per-op fields), and `from_edges` builds the same kind
of index from literal names and edges, with no graph behind it. Both end in
`assemble`.

The index holds the `tf.Operation` objects only so that the rewriter can map
ids back to ops (an index from `from_edges` has none, and the rewriter
refuses it); nothing here mutates the graph.

The modules:

  index.py    `GraphIndex` and the op types its users share
  build.py    `Columns` and `assemble`, where both constructors end;
              `with_planned_edges`, `acyclic_edges`
  literal.py  `from_edges`
  sizes.py    `tensor_bytes`, `op_flops`, `contraction_flops`
  unbatched.py  `unbatched_elements`: shape vectors and data-dependent
              counts, whose unknown first dimension is not the batch
"""

from tflms.devices import DeviceKey, is_cpu_device, parse_device
from tflms.graph_index.build import acyclic_edges, with_planned_edges
from tflms.graph_index.index import (ALLOCATING_REF_TYPES, APPLY_PREFIXES,
                                     BACK_EDGE_TYPES, BUFFER_FORWARDING_TYPES,
                                     COLLECTIVE_TYPES, CONTROL_FLOW_V1_TYPES,
                                     DEFAULT_DEVICE, FUNCTION_CALL_TYPES,
                                     GRAPPLER_IDENTITY_TYPES,
                                     NEUTRAL_OPERANDS, PARTITIONED_CALL_TYPES,
                                     GraphIndex)
from tflms.graph_index import unbatched
from tflms.graph_index.literal import from_edges
from tflms.graph_index.sizes import (FLOP_TYPES, contraction_flops, op_flops,
                                     tensor_bytes)

__all__ = [
    "GraphIndex",
    "from_edges",
    "with_planned_edges",
    "acyclic_edges",
    "DEFAULT_DEVICE",
    "GRAPPLER_IDENTITY_TYPES",
    "BUFFER_FORWARDING_TYPES",
    "NEUTRAL_OPERANDS",
    "ALLOCATING_REF_TYPES",
    "APPLY_PREFIXES",
    "tensor_bytes",
    "unbatched",
    "op_flops",
    "contraction_flops",
    "FLOP_TYPES",
    "is_cpu_device",
    "DeviceKey",
    "parse_device",
    "CONTROL_FLOW_V1_TYPES",
    "BACK_EDGE_TYPES",
    "COLLECTIVE_TYPES",
    "FUNCTION_CALL_TYPES",
    "PARTITIONED_CALL_TYPES",
]

