"""rewriter.apply_plan's checks before its first edit: an index that does not
describe the graph any more (or never did) is refused, and the graph is left
as it was. (`test_rewrite.py` checks the rewrites themselves.)"""

import pytest
import tensorflow as tf

from tflms.tf import reader
from tflms import analysis
from tflms import graph_index as gi
from tflms import planner
from tflms.tf import rewriter

CPU = "/cpu:0"


def u_graph(n=4):
    """f_i = sin(f_{i-1}), g_n = cos(f_n), g_i = g_{i+1} * f_i; f1 is read
    by g1 2n - 1 levels later."""
    graph = tf.Graph()
    with graph.as_default():
        f = [tf.compat.v1.placeholder(tf.float32, [8, 8], name="x")]
        for i in range(1, n + 1):
            f.append(tf.math.sin(f[-1], name="f%d" % i))
        g = tf.math.cos(f[n], name="g%d" % n)
        for i in range(n - 1, 0, -1):
            g = tf.math.multiply(g, f[i], name="g%d" % i)
    return graph


def indexed_plan(graph):
    index = reader.build_index(graph)
    roles = analysis.classify_ops(index)
    plan = planner.make_plan(index, roles, planner.SwapParams(5, 1, 0, 0))
    assert len(plan.swaps) == 1  # f1 -> g1
    return index, plan


def signature(graph):
    return graph.as_graph_def().SerializeToString(deterministic=True)


def test_unchanged_graph_is_rewritten():
    graph = u_graph()
    index, plan = indexed_plan(graph)
    result = rewriter.apply_plan(graph, index, plan, CPU)
    assert result.swapout_ops == ("lms/swapout_f1_0",)
    assert result.swapin_ops == ("f1-lms/swapin_f1_0",)
    assert result.rerouted_inputs == 1
    assert graph.get_operation_by_name("g1").inputs[1].op.name == \
        "f1-lms/swapin_f1_0"


def test_an_op_added_after_indexing_is_refused():
    graph = u_graph()
    index, plan = indexed_plan(graph)
    with graph.as_default():
        tf.math.sin(graph.get_tensor_by_name("g1:0"), name="late")
    before = signature(graph)
    with pytest.raises(ValueError, match=r"^the graph has 10 ops but was "
                       r"indexed with 9; index it again before applying "
                       r"a plan$"):
        rewriter.apply_plan(graph, index, plan, CPU)
    assert signature(graph) == before


def test_an_input_rerouted_after_indexing_is_refused():
    graph = u_graph()
    index, plan = indexed_plan(graph)
    g1 = graph.get_operation_by_name("g1")
    # Same number of ops, but g1 reads f2 where the plan expects f1.
    g1._update_input(1, graph.get_tensor_by_name("f2:0"))
    before = signature(graph)
    with pytest.raises(ValueError, match=r"^input 1 of g1 is not f1:0 any "
                       r"more; index the graph again$"):
        rewriter.apply_plan(graph, index, plan, CPU)
    assert signature(graph) == before


def test_an_index_of_another_graph_is_refused():
    graph, other = u_graph(), u_graph()
    index, plan = indexed_plan(other)
    before = signature(graph)
    with pytest.raises(ValueError, match=r"^the index was built from another "
                       r"graph than the one to edit; index this graph with "
                       r"tflms.tf.reader.build_index\(graph\)$"):
        rewriter.apply_plan(graph, index, plan, CPU)
    assert signature(graph) == before


def test_a_literal_index_is_refused():
    graph = u_graph()
    literal = gi.from_edges(
        [(op.name, op.type) for op in graph.get_operations()],
        edges=[(t.name, op.name) for op in graph.get_operations()
               for t in op.inputs])
    _, plan = indexed_plan(graph)
    before = signature(graph)
    with pytest.raises(ValueError, match=r"^the index has no tf.Operations "
                       r"\(it was built from literal edges by "
                       r"graph_index.from_edges\), so there is nothing to "
                       r"rewrite; index the graph with "
                       r"tflms.tf.reader.build_index\(graph\)$"):
        rewriter.apply_plan(graph, literal, plan, CPU)
    assert signature(graph) == before


def test_offload_op_names_and_the_variable_of_a_host_copy():
    name = rewriter.offload_op_name("dense/kernel", "host")
    assert name == "lms/offload/dense/kernel/host"
    assert rewriter.offloaded_variable(name) == "dense/kernel"
    # Imported under a scope, the variable is under it too.
    assert rewriter.offloaded_variable(
        "import/lms/offload/dense/kernel/host") == "import/dense/kernel"
    assert rewriter.offloaded_variable(
        rewriter.offload_op_name("dense/kernel", "write_back")) is None
    assert rewriter.offloaded_variable("dense/kernel") is None
    assert rewriter.OFFLOAD_SCOPE in rewriter.OP_NAME_MARKERS
