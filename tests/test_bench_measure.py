"""benchmarks/measure.py: the shared measurements (the graph the oracle
replays, the oracle's runtime peak)."""

from benchmarks import measure


def _node(graph_def, name, op, inputs=(), device="/device:GPU:0"):
    node = graph_def.node.add(name=name, op=op, device=device)
    node.input.extend(inputs)
    return node


def test_forward_identities_reroutes_consumers_and_keeps_swaps():
    gd = measure.tf.compat.v1.GraphDef()
    _node(gd, "x", "Placeholder")
    _node(gd, "c", "NoOp")
    _node(gd, "a", "Identity", ["x", "^c"])
    _node(gd, "b", "StopGradient", ["a"])           # a chain: b -> a -> x
    _node(gd, "y", "Mul", ["b", "a:0", "^a"])
    _node(gd, "out", "Identity", ["y"])             # kept: fetched
    _node(gd, "swap", "Identity", ["x"], device="/cpu:0")  # crosses devices
    _node(gd, "z", "Neg", ["swap"])
    result, removed = measure.forward_identities(gd, keep={"out"})
    nodes = {n.name: list(n.input) for n in result.node}
    assert removed == 2 and "a" not in nodes and "b" not in nodes
    assert nodes["y"] == ["x", "x", "^c"]
    assert nodes["out"] == ["y"] and nodes["z"] == ["swap"]
    assert "swap" in nodes


def test_oracle_peaks_reports_the_runtime_peak():
    """x -> a1 = sin(x) -> flat = Reshape(a1) -> b = cos(flat); out = b *
    Reshape(v), v a resource variable; every large tensor is S bytes.

    At run time the Reshapes and the variable read hand on their input's
    buffer, v is resident, and sin, cos and the product write into their
    input's buffer (each is its last reader; v's buffer is never written
    over): a1, flat, b and out are all x's buffer. The peak is x and v,
    plus the two 8-byte shape constants, 2 S + 16; its largest buffers are
    v, x and flat's shape. ``InferFromTrace``'s rules (the corrected count)
    give the read and both Reshapes buffers of their own, count no
    variable, and keep x, a1 and the read 1 ns into the microsecond where
    flat, vflat and b start: 6 S + 16, three times the runtime peak. The
    benchmark's GPU peak must be the runtime one.
    """
    S = 4 << 20
    tf = measure.tf
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1024, 1024], name="x")
        v = tf.Variable(tf.zeros([1024, 1024]), name="v")
        a1 = tf.math.sin(x, name="a1")
        b = tf.math.cos(tf.reshape(a1, [512, 2048], name="flat"), name="b")
        out = tf.multiply(b, tf.reshape(v, [512, 2048], name="vflat"),
                          name="out")
    peaks = measure.oracle_peaks(graph, out.op)
    assert peaks["gpu_peak"] == 2 * S + 16
    assert sorted(peaks["top"]) == ["flat/shape:0", "v", "x:0"]
    assert peaks["corrected_peak"] == peaks["raw_gpu_peak"] == 6 * S + 16
