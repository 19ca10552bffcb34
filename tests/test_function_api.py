"""tflms.tf.function_api: what tflms needs of TensorFlow's internal function
APIs, on this TensorFlow version.

A `tf.function` runs in eager mode, and this test process has eager
execution off (conftest.py), so the functions are traced and called in one
subprocess (this file run as a script), which prints one JSON line of
facts; each test checks some of them.
"""

import json
import os
import subprocess
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _text(name):
    return name.decode() if isinstance(name, bytes) else name


def _facts():
    """Traces, rebuilds and calls small functions with `function_api`; what
    it found, as plain values."""
    import numpy as np
    import tensorflow as tf
    from tflms.tf import function_api

    v = tf.Variable(tf.ones([4, 4]), name="w")

    @tf.function
    def step(x):
        v.assign_add(x)
        return tf.reduce_sum(tf.matmul(v, v))

    concrete = step.get_concrete_function(tf.TensorSpec([4, 4], tf.float32))
    graph = concrete.graph
    variables = function_api.captured_variables(graph)
    fetches = function_api.fetch_ops(graph)
    order = [op.name for op in graph.get_operations()]

    # The rebuilt function runs the same graph: the assignment too.
    rebuilt = function_api.rebuild(concrete, graph)
    x = tf.fill([4, 4], 0.5)
    by_original = float(step(x))
    after_original = v.numpy().copy()
    by_rebuilt = float(rebuilt(x))
    v.assign(tf.ones([4, 4]))

    # XLA: the option of a tf.function, the attribute of its concrete
    # function, and the context its graph is traced in.
    seen = {}

    def probe(kind):
        def traced(x):
            seen[kind] = function_api.in_xla_context(
                tf.compat.v1.get_default_graph())
            return x * 2.0
        return traced
    jit = tf.function(probe("jit"), jit_compile=True)
    plain = tf.function(probe("plain"))
    jit_concrete = jit.get_concrete_function(tf.TensorSpec([2], tf.float32))
    plain_concrete = plain.get_concrete_function(
        tf.TensorSpec([2], tf.float32))

    # `call` takes what the tf.function takes: NumPy arrays, Python values
    # by keyword, default values.
    w = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))

    @tf.function
    def scaled(x, scale=2.0, square=False):
        y = tf.matmul(x, w) * scale
        return {"out": y * y if square else y}
    x2 = np.ones([1, 2], np.float32)
    scaled_concrete = scaled.get_concrete_function(x2, square=True)
    called = function_api.call(scaled, scaled_concrete, (x2,),
                               {"square": True})["out"].numpy().tolist()
    wanted = scaled(x2, square=True)["out"].numpy().tolist()

    # The partition graphs of a function first run inside the block.
    @tf.function
    def fresh(x):
        return tf.nn.relu(x, name="fresh_relu")
    with function_api.partition_graphs_made() as graph_defs:
        fresh(tf.ones([3]))
    partition_ops = sorted({n.op for g in graph_defs for n in g.node})

    return dict(
        variables={k: val.name for k, val in variables.items()},
        placeholder_types=sorted(graph.get_operation_by_name(k).type
                                 for k in variables),
        fetch_types=[op.type for op in fetches],
        fetches_in_graph_order=[op.name for op in fetches] == sorted(
            (op.name for op in fetches), key=order.index),
        rebuilt_name=_text(rebuilt.name),
        original_name=_text(concrete.name),
        by_original=by_original, by_rebuilt=by_rebuilt,
        rebuilt_sum=float(np.sum(np.matmul(after_original + 0.5,
                                           after_original + 0.5))),
        jit_function=function_api.is_jit_compiled(jit),
        jit_concrete=function_api.is_jit_compiled(concrete=jit_concrete),
        plain_function=function_api.is_jit_compiled(plain),
        plain_concrete=function_api.is_jit_compiled(concrete=plain_concrete),
        xla_context=seen,
        called=called, wanted=wanted,
        partition_graphs=len(graph_defs), partition_ops=partition_ops)


@pytest.fixture(scope="module")
def facts():
    env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, os.path.abspath(__file__)],
                         env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, out.stdout + out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_captured_variables_are_the_resource_placeholders(facts):
    assert list(facts["variables"].values()) == ["w:0"]
    assert facts["placeholder_types"] == ["Placeholder"]


def test_fetch_ops_are_the_outputs_and_the_stateful_updates(facts):
    # The loss's op and the assignment automatic control dependencies run.
    assert "AssignAddVariableOp" in facts["fetch_types"]
    assert facts["fetches_in_graph_order"]


def test_rebuild_runs_the_same_graph_under_a_new_name(facts):
    assert facts["rebuilt_name"] != facts["original_name"]
    assert "_tflms_" in facts["rebuilt_name"]
    # The rebuilt function assigned again, then multiplied: the same
    # number as the graph computes from the values the original left.
    assert facts["by_rebuilt"] == pytest.approx(facts["rebuilt_sum"])
    assert facts["by_rebuilt"] != facts["by_original"]


def test_jit_compile_is_read_from_the_function_and_its_concrete(facts):
    assert facts["jit_function"] and facts["jit_concrete"]
    assert not facts["plain_function"] and not facts["plain_concrete"]
    assert facts["xla_context"] == {"jit": True, "plain": False}


def test_call_binds_arguments_as_the_tf_function_does(facts):
    # ones(1, 2) @ [[0, 1, 2], [3, 4, 5]] = [3, 5, 7], scaled by the
    # default 2.0 and squared.
    assert facts["called"] == facts["wanted"] == [[36.0, 100.0, 196.0]]


def test_partition_graphs_of_a_function_run_in_the_block(facts):
    assert facts["partition_graphs"] >= 1
    assert "Relu" in facts["partition_ops"]


if __name__ == "__main__":
    sys.path.insert(0, _ROOT)
    print("RESULT " + json.dumps(_facts()))
