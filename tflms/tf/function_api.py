"""TensorFlow's internal function APIs, behind one small module.

`tflms.tf.lms_function` rewrites the graph of a `tf.function`'s concrete
function and runs the result as a new function. Everything it needs from
TensorFlow beyond the public API is here, so the next TensorFlow release
breaks one place (`tests/test_lms_function.py` runs it on every supported
version):

* `is_jit_compiled`: the ``jit_compile`` option of a `tf.function`
  (``Function._jit_compile``) and the ``_XlaMustCompile`` attribute of a
  concrete function (``ConcreteFunction._attrs``).
* `in_xla_context`: whether the graph being built belongs to a function
  that XLA will compile (``control_flow_util.GraphOrParentsInXlaContext``:
  `tf.function` traces a ``jit_compile=True`` function inside an
  ``XLAControlFlowContext``), such as a Keras 3 train function compiled
  with ``jit_compile``.
* `rebuild`: a new concrete function from an edited `FuncGraph`:
  ``atomic_function.from_func_graph`` turns the graph into a FunctionDef
  registered in the eager context under a new name, and
  ``concrete_function.ConcreteFunction(atomic_fn)`` wraps it; the flat
  signature (``_arg_keywords``, ``_num_positional_args``) is copied from the
  original, as ``tracing_compilation`` sets it on the functions it traces.
* `retraced`: a new `tf.function` of the same Python function and
  options (``Function._clone``), whose traces start afresh: after LMS
  moved an optimizer's slots, the next trace captures the moved ones.
* `call`: a concrete function called with the arguments of the
  `tf.function` it was traced from (NumPy arrays, Python values, default
  values), as ``Function._call`` and ``tracing_compilation.call_function``
  call it: ``function_type_utils.canonicalize_function_inputs`` with the
  `tf.function`'s ``_function_type``, ``_default_values`` and
  ``_is_pure``, then bind to the concrete function's ``function_type``,
  unpack the flat tensors, ``_call_flat``.

Both supported stacks (TensorFlow 2.15 and 2.16+, tried on 2.21) have the
same signatures for these; a release that differs gets its branch here,
keyed on `compat.TF_VERSION`. The `FuncGraph` attributes read
(``outputs``, ``control_outputs``, ``captures``, ``variables``, ``name``)
are the ones `tf.function` itself documents on its graphs.
"""

import contextlib
import itertools

from tensorflow.python.eager import context as eager_context
from tensorflow.python.eager.polymorphic_function import atomic_function
from tensorflow.python.ops import control_flow_util
from tensorflow.python.eager.polymorphic_function import concrete_function
from tensorflow.python.eager.polymorphic_function import function_type_utils

from tflms.tf import compat

__all__ = ["is_jit_compiled", "in_xla_context", "fetch_ops",
           "captured_variables", "retraced", "rebuild", "call",
           "partition_graphs_made",
           "XLA_COMPILE_ATTR"]

TF_VERSION = compat.TF_VERSION

# The function attribute tf.function(jit_compile=True) sets
# (tensorflow/python/eager/polymorphic_function/attributes.py XLA_COMPILE).
XLA_COMPILE_ATTR = "_XlaMustCompile"

_names = itertools.count()


def is_jit_compiled(function=None, concrete=None):
    """True if `function` (a `tf.function`) was made with
    ``jit_compile=True`` or `concrete` (a concrete function) carries the
    attribute that makes TensorFlow compile it with XLA."""
    if function is not None and getattr(function, "_jit_compile", None):
        return True
    if concrete is not None:
        attrs = getattr(concrete, "_attrs", None) or {}
        value = attrs.get(XLA_COMPILE_ATTR)
        if value is not None and getattr(value, "b", value) is True:
            return True
    return False


def in_xla_context(graph):
    """True if ops built in `graph` now will be compiled with XLA: it is
    the graph of a ``jit_compile=True`` function being traced, or inside
    one."""
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def fetch_ops(graph):
    """What one call of the function graph `graph` runs: the ops of its
    outputs and its control outputs (the stateful ops `tf.function`'s
    automatic control dependencies make run: the optimizer's updates,
    the batch-norm statistics' assignments), in graph order."""
    found = {}
    for t in graph.outputs:
        found[t.op.name] = t.op
    for op in graph.control_outputs:
        found[op.name] = op
    order = {op.name: i for i, op in enumerate(graph.get_operations())}
    return tuple(sorted(found.values(), key=lambda op: order[op.name]))


def captured_variables(graph):
    """``{placeholder op name: variable}`` of the variables `graph` reads
    through captured resource handles: inside a function graph a variable
    is a resource `Placeholder` fed with the handle at each call."""
    by_handle = {}
    for v in graph.variables:
        handle = getattr(v, "handle", None)
        if handle is not None:
            by_handle[id(handle)] = v
    found = {}
    for external, internal in graph.captures:
        v = by_handle.get(id(external))
        if v is not None:
            found[internal.op.name] = v
    return found


def retraced(function):
    """A `tf.function` like `function` (same Python function, signature
    and options) with no trace yet."""
    return function._clone(None)


def rebuild(concrete, graph):
    """A new concrete function running the (edited) function graph
    `graph` of `concrete`, with its signature and attributes.

    The graph is registered under a new name (``__inference_<graph
    name>_tflms_<n>``): the original function stays as it was, and
    TensorFlow's function optimizations (Grappler) run on the new one when
    it is first called.
    """
    name = "__inference_%s_tflms_%d" % (graph.name, next(_names))
    attrs = dict(getattr(concrete, "_attrs", None) or {})
    atomic = atomic_function.from_func_graph(
        name, graph, attrs, concrete.function_type)
    rebuilt = concrete_function.ConcreteFunction(atomic)
    # The flat signature, as tracing_compilation sets it on what it traces.
    rebuilt._arg_keywords = concrete._arg_keywords
    rebuilt._num_positional_args = concrete._num_positional_args
    return rebuilt


def call(function, concrete, args, kwargs):
    """Call `concrete`, traced from the `tf.function` `function`, with
    `args` and `kwargs` as `function` is called (a concrete function's own
    ``__call__`` takes tensors only and knows no default values)."""
    bound = function_type_utils.canonicalize_function_inputs(
        args, kwargs, function._function_type, function._default_values,
        function._is_pure)
    bound = concrete.function_type.bind(*bound.args, **bound.kwargs)
    flat = concrete.function_type.unpack_inputs(bound)
    return concrete._call_flat(flat, captured_inputs=concrete.captured_inputs)


@contextlib.contextmanager
def partition_graphs_made():
    """Context manager yielding a list that, when the block ends, holds the
    per-device partition `GraphDef`s of every function TensorFlow
    instantiated inside it (the eager context's graph collection, which
    ``tf.summary.trace_on(graph=True)`` also uses). What was collected
    before the block is dropped."""
    ctx = eager_context.context()
    graphs = []
    ctx.export_run_metadata()
    ctx.enable_graph_collection()
    try:
        yield graphs
    finally:
        metadata = ctx.export_run_metadata()
        ctx.disable_graph_collection()
        for function in (metadata.function_graphs if metadata is not None
                         else ()):
            graphs.extend(function.partition_graphs)
