"""Tests for the Grappler-based GPU memory oracle.

The closed-form numbers follow Grappler's interval model (see the
``tflms.tf.oracle`` docstring): a tensor is live from the microsecond its
producer starts until 1 ns after its last consumer ends, and the peak is
sampled after all events of one timestamp. For a chain x -> a1 -> a2 -> ...
of element-wise ops on equal tensors of S bytes, at the start of a_k the
tensors a_{k-2} (freed 1 ns later), a_{k-1} and a_k are live: 3 S, or 2 S
for a chain of one op.

The runtime peak (``runtime_gpu_peak_bytes``) replays the same schedule
with TensorFlow's buffer rules: a GPU op's inputs are released when it is
launched, after its outputs are allocated, so such a chain holds 2 S; a
swapped-in copy is allocated when the host sends it; forwarding ops
(Identity, Reshape, ...) and variable reads allocate nothing; variables
are resident for the whole step; tensors are sized by their static shapes;
zero-length ops of one microsecond take turns in execution order.
"""

import pytest
import tensorflow as tf

if tf.executing_eagerly():
    tf.compat.v1.disable_eager_execution()

from zoo import models
from tflms.tf import oracle

SHAPE = [1024, 1024]
S = 4 * 1024 * 1024  # one float32 tensor of SHAPE


# What TensorFlow itself decides: run on both stacks (tools/run_tests.sh).
pytestmark = pytest.mark.both_stacks


def _own(h, name=None):
    """An op whose output is a buffer of its own: a matrix product (of `h`
    with itself), which no kernel writes into an input's buffer
    (`tflms.inplace`). The runtime replay's closed forms below count one
    buffer per op; `test_inplace.py` checks the ops that write in place."""
    return tf.linalg.matmul(h, h, name=name)


def _chain(n):
    graph = tf.Graph()
    with graph.as_default():
        h = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        for i in range(n):
            h = _own(h, name=f"a{i + 1}")
    return graph, h


def _swap_graph(delay=True):
    """A GPU chain whose first activation is swapped through the CPU.

    ``a1`` goes out through ``lms/swapout_a1`` and back through
    ``lms/swapin_a1`` (both on the CPU); only ``out``, at the very end,
    reads the swapped-in copy. With ``delay`` the swap-in waits for ``a2``,
    as LMS's control dependencies would make it. After the swap-in, a 4 S
    ``tile`` and its 4 S product ``b`` dominate memory.
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        a1 = _own(x, name="a1")
        a2 = _own(a1, name="a2")
        a3 = _own(a2, name="a3")
        with tf.device("/cpu:0"):
            swap_out = tf.identity(a1, name="lms/swapout_a1")
            deps = [a2.op] if delay else []
            with tf.control_dependencies(deps):
                swap_in = tf.identity(swap_out, name="lms/swapin_a1")
        big = tf.tile(a3, [2, 2], name="big")
        b = _own(big, name="b")
        c = tf.reduce_sum(tf.reshape(b, [4] + SHAPE), axis=0, name="c")
        out = tf.add(c, swap_in, name="out")
    return graph, out


@pytest.mark.parametrize("n, expected", [(1, 2 * S), (2, 3 * S), (5, 3 * S)])
def test_chain_peak_closed_form(n, expected):
    graph, fetch = _chain(n)
    result = oracle.peak_memory(graph, fetch)
    assert result.raw_gpu_peak_bytes == expected
    assert result.replayed_raw_gpu_peak_bytes == expected
    assert result.gpu_peak_bytes == expected
    assert result.correction_bytes == 0
    assert result.transfers == ()
    assert result.host_peak_bytes == 0
    assert sum(t.nbytes for t in result.live_at_peak) == expected


def test_chain_live_tensors_at_peak():
    graph, fetch = _chain(5)
    result = oracle.peak_memory(graph, fetch)
    # The first time three tensors overlap is when a2 starts.
    assert sorted(result.largest_live_tensors()) == ["a1:0", "a2:0", "x:0"]
    assert {t.name for t in result.raw_live_at_peak} == {"a1:0", "a2:0", "x:0"}
    assert all(t.nbytes == S for t in result.live_at_peak)


def test_blind_spot_corrected_by_one_tensor():
    graph, out = _swap_graph(delay=True)
    result = oracle.peak_memory(graph, out)
    # Raw: a3 (freed 1 ns after big's successor starts), big, b, and then
    # Reshape(b) and c -- the reduction consts add 16 bytes. Worked out in
    # Grappler's model: big + b + Reshape (3 x 4 S) + c (S) = 13 S.
    assert result.raw_gpu_peak_bytes == 13 * S + 16
    assert result.replayed_raw_gpu_peak_bytes == result.raw_gpu_peak_bytes
    # The GPU copy of the swapped-in a1 is live until `out`: exactly S more.
    assert result.gpu_peak_bytes == result.raw_gpu_peak_bytes + S
    assert result.correction_bytes == S

    (transfer,) = result.transfers
    assert transfer.source == "lms/swapin_a1:0"
    assert transfer.nbytes == S
    assert transfer.consumers == ("out",)
    assert transfer.raw_end_ns == transfer.start_ns + 1
    assert transfer.corrected_end_ns > transfer.raw_end_ns
    copies = [t for t in result.live_at_peak if t.transferred]
    assert [t.name for t in copies] == [transfer.recv_node + ":0"]
    assert not any(t.name.startswith("Recv_") and t.nbytes == S
                   for t in result.raw_live_at_peak)
    # Host: the swap-out, the swap-in and the CPU-side Recv of a1.
    assert result.host_peak_bytes == 3 * S


def test_correction_never_lowers_peak():
    for delay in (False, True):
        graph, out = _swap_graph(delay=delay)
        result = oracle.peak_memory(graph, out)
        assert result.gpu_peak_bytes >= result.raw_gpu_peak_bytes
        assert result.replayed_raw_gpu_peak_bytes == result.raw_gpu_peak_bytes


def test_swap_ops_stay_on_cpu_after_placement():
    graph, _ = _swap_graph()
    placed = oracle.place_on_gpu(graph)
    devices = {node.name: node.device for node in placed.node}
    assert devices["lms/swapout_a1"] == "/cpu:0"
    assert devices["lms/swapin_a1"] == "/cpu:0"
    assert devices["a1"] == "/device:GPU:0"
    assert devices["x"] == "/device:GPU:0"
    # The source graph is untouched.
    assert graph.get_operation_by_name("a1").device == ""


def test_graph_def_and_name_fetches_agree():
    graph, out = _swap_graph()
    from_graph = oracle.peak_memory(graph, out)
    from_def = oracle.peak_memory(graph.as_graph_def(), ["out:0"])
    assert from_def.gpu_peak_bytes == from_graph.gpu_peak_bytes
    assert from_def.raw_gpu_peak_bytes == from_graph.raw_gpu_peak_bytes


def test_fits_against_capacity():
    graph, fetch = _chain(3)
    assert oracle.peak_memory(graph, fetch).fits is None
    assert oracle.peak_memory(graph, fetch, gpu_memory_bytes=3 * S).fits
    assert not oracle.peak_memory(graph, fetch,
                                  gpu_memory_bytes=3 * S - 1).fits


@pytest.mark.parametrize("n", [1, 2, 5])
def test_runtime_chain_holds_two_tensors(n):
    graph, fetch = _chain(n)
    result = oracle.peak_memory(graph, fetch)
    assert result.runtime_gpu_peak_bytes == 2 * S
    assert sorted(t.name for t in result.runtime_live_at_peak) == [
        "a1:0", "x:0"]


def test_runtime_peak_forwards_identity_and_reshape():
    """x -> a0 -> ... -> a4 (`_own`) -> Identity -> Reshape -> out (cos).

    The runtime holds two tensors at a time (an op's input and its output),
    the forwarding ops add nothing, and out writes into a4's buffer (it is
    its last reader). ``InferFromTrace`` counts five: the
    Identity and Reshape outputs as new buffers, and a3 and a4 still live
    when out is allocated, because the zero-cost forwarding ops run in the
    same microsecond and each input is released 1 ns after its reader.
    """
    graph = tf.Graph()
    with graph.as_default():
        h = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        for i in range(5):
            h = _own(h, name="a%d" % i)
        h = tf.reshape(tf.identity(h, name="fwd"), [512, 2048], name="flat")
        out = tf.math.cos(h, name="out")
    result = oracle.peak_memory(graph, out)
    shape_const = 8  # the Reshape's int32 shape [512, 2048]
    assert result.raw_gpu_peak_bytes == 5 * S + shape_const
    assert result.gpu_peak_bytes == result.raw_gpu_peak_bytes
    raw_names = {t.name for t in result.raw_live_at_peak}
    assert {"fwd:0", "flat:0"} <= raw_names
    assert result.runtime_gpu_peak_bytes == 2 * S + shape_const
    assert sorted(t.name for t in result.runtime_live_at_peak) == [
        "a0:0", "flat/shape:0", "x:0"]


def test_runtime_forwarded_buffer_is_its_source():
    """x -> a1 (`_own`); out = Reshape(Identity(a1)) + a1.

    The Identity and the Reshape return a1's buffer, so at out's start the
    runtime holds a1 and out (x was released when a1 ended): 2 S, as at
    a1's start (x, a1 and the shape constant). Counting them as new
    buffers, as ``InferFromTrace`` does, gives a1, both copies, out, and x
    (1 ns past a1, which ends in the microsecond out starts): 5 S.
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        a1 = _own(x, name="a1")
        same = tf.reshape(tf.identity(a1, name="fwd"), SHAPE, name="same")
        out = tf.add(same, a1, name="out")
    result = oracle.peak_memory(graph, out)
    shape_const = 8  # the Reshape's int32 shape
    assert result.raw_gpu_peak_bytes == 5 * S + shape_const
    assert result.runtime_gpu_peak_bytes == 2 * S + shape_const
    assert sorted(t.name for t in result.runtime_live_at_peak) == [
        "a1:0", "same/shape:0", "x:0"]


def test_runtime_identity_n_forwards_each_port():
    """a1 = _own(x) (S), a2 = tile(x) (4 S); i1, i2 = IdentityN(a1, a2);
    out = _own(i2) (4 S). Output 1 of the IdentityN is a2's buffer, so a2
    stays live until out ends: at out's start a2 and out hold 8 S (a1 and
    x were released when their last readers ended)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        a1 = _own(x, name="a1")
        a2 = tf.tile(x, [2, 2], name="a2")
        _, i2 = tf.identity_n([a1, a2], name="both")
        out = _own(i2, name="out")
    result = oracle.peak_memory(graph, out)
    assert result.runtime_gpu_peak_bytes == 8 * S
    assert sorted(t.name for t in result.runtime_live_at_peak) == [
        "a2:0", "out:0"]


@pytest.mark.parametrize("fetched", [False, True])
def test_runtime_identity_n_read_of_an_unread_handoff(fetched):
    """x -> a1 -> a2 -> a3 -> a4 (`_own`, S each); n = IdentityN(a4, a1),
    out = _own(n:0). Nothing reads n:1, so Grappler drops n's read of a1
    (as `tf.custom_gradient`'s IdentityN's) and a1 is released after a2:
    the chain's 2 S. A fetched IdentityN is kept whole: then a1 is held
    until n runs, 3 S at a3 and a4."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        a1 = _own(x, name="a1")
        h = a1
        for i in range(2, 5):
            h = _own(h, name=f"a{i}")
        n = tf.raw_ops.IdentityN(input=[h, a1], name="n")
        out = _own(n[0], name="out")
    result = oracle.peak_memory(graph, [out, "n"] if fetched else out)
    assert result.runtime_gpu_peak_bytes == (3 if fetched else 2) * S
    if fetched:
        assert "a1:0" in {t.name for t in result.runtime_live_at_peak}


@pytest.mark.parametrize("neutral", ["mul_one", "add_zero"])
def test_runtime_neutral_operand_op_forwards_its_input(neutral):
    """x -> a -> b1 -> b2 (`_own`); out = f(a) + b2 with f(a) = a * 1.0
    or a + 0.0, made before b1, which Grappler's constant folding replaces
    by an Identity of a (tf.nn.swish's gradient computes x * 1.0). Its
    output is a's buffer, so the runtime peak is the one of out = a + b2,
    and no buffer of f(a) is live."""
    def build(f):
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
            a = _own(x, name="a")
            kept = f(a)
            h = a
            # f(a) runs before b1, so a buffer of its own would be live
            # from there to out.
            with tf.control_dependencies([kept]):
                h = _own(h, name="b1")
            h = _own(h, name="b2")
            out = tf.add(kept, h, name="out")
        return oracle.peak_memory(graph, out)
    op = {"mul_one": lambda a: tf.multiply(a, 1.0, name="f"),
          "add_zero": lambda a: tf.add(a, 0.0, name="f")}[neutral]
    plain = build(lambda a: a)
    folded = build(op)
    assert folded.runtime_gpu_peak_bytes == plain.runtime_gpu_peak_bytes
    assert "f:0" not in {t.name for t in folded.runtime_live_at_peak}


def test_runtime_peak_keeps_swapped_in_copy_live():
    """In `_swap_graph` the runtime peak is at the start of ``b``: big and
    b (4 S each), the two small constants, and the GPU copy of the
    swapped-in a1, which stays live until ``out`` reads it: 9 S + 16. The
    Reshape of b forwards its buffer; a1, a2 and a3 are released by then.
    Without the correction (copy freed after the transfer) it would be
    8 S + 16. Without ``delay`` the copy is allocated earlier, when a1's
    swap-in is sent, which does not move this peak."""
    for delay in (False, True):
        graph, out = _swap_graph(delay=delay)
        result = oracle.peak_memory(graph, out)
        assert result.runtime_gpu_peak_bytes == 9 * S + 16
        assert result.runtime_gpu_peak_bytes <= result.gpu_peak_bytes
        (transfer,) = result.transfers
        copies = [t for t in result.runtime_live_at_peak if t.transferred]
        assert [t.name for t in copies] == [transfer.recv_node + ":0"]
        (copy,) = copies
        assert copy.nbytes == S
        if delay:
            assert copy.alloc_ns == transfer.start_ns
        else:
            # Sent as soon as a1 has ended (the swap-in waits for nothing
            # else), while a2 runs; its _Recv runs after a2.
            assert copy.alloc_ns < transfer.start_ns
        # Released when `out` is launched, at its start; InferFromTrace's
        # rule keeps it until 1 ns after `out` ends.
        assert transfer.start_ns < copy.dealloc_ns < \
            transfer.corrected_end_ns - 1
        assert sorted(t.name for t in result.runtime_live_at_peak
                      if t.nbytes >= S) == sorted(
                          ["b:0", "big:0", transfer.recv_node + ":0"])


def _swap_in_after(make_readers):
    """x -> a1 (S) and the GPU ops ``make_readers(a1)`` makes, which
    returns ``(trigger, outputs)``: a1 goes out to the CPU and comes back
    through ``lms/swapin_a1`` once ``trigger`` has ended, and ``out`` adds
    the swapped-in a1 to a reduction (S) of each of ``outputs``
    (4 S each)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        a1 = _own(x, name="a1")
        trigger, outputs = make_readers(a1)
        with tf.device("/cpu:0"):
            swap_out = tf.identity(a1, name="lms/swapout_a1")
            with tf.control_dependencies([trigger.op]):
                swap_in = tf.identity(swap_out, name="lms/swapin_a1")
        sums = [tf.reduce_sum(tf.reshape(t, [2, 1024, 2, 1024]), axis=[0, 2])
                for t in outputs]
        out = tf.add_n([swap_in] + sums, name="out")
    return oracle.peak_memory(graph, out)


def _then_big(t):
    """``t`` starts the swap-in; ``big = _own(t)`` is reduced."""
    return t, [_own(t, name="big")]


def test_runtime_copy_allocated_when_the_host_sends_it():
    """`_swap_in_after`: ``t = _own(tile(a1))`` (4 S) starts the swap-in,
    ``big = _own(t)`` (4 S) reads it.

    The virtual scheduler runs the swap-in on the CPU when ``t`` ends and
    queues its ``_Recv`` on the GPU behind ``big``, which became ready at
    that moment too. TensorFlow's rendezvous allocates the GPU copy when
    the swap-in is sent, and ``big``, ready no earlier, may be launched
    after it: at ``big``'s launch t, big and the copy are live, 9 S and the
    two small constants (24 bytes). With the copy allocated at the
    ``_Recv``'s turn, after ``big`` has released t, the peak would be
    8 S + 24.
    """
    result = _swap_in_after(lambda a1: _then_big(
        _own(tf.tile(a1, [2, 2]), name="t")))
    (transfer,) = result.transfers
    copy_name = transfer.recv_node + ":0"
    live = {t.name: t for t in result.runtime_live_at_peak}
    assert sorted(name for name, t in live.items() if t.nbytes >= S) == \
        sorted(["big:0", "t:0", copy_name])
    assert result.runtime_gpu_peak_bytes == 9 * S + 24
    # Allocated when t ended and big started, before the _Recv's turn.
    assert live[copy_name].alloc_ns == live["big:0"].alloc_ns
    assert live[copy_name].alloc_ns < transfer.start_ns


def test_runtime_copy_after_the_ops_ready_before_it_was_sent():
    """`_swap_in_after` with m = tile(a1) (4 S) and two readers of it
    (4 S each): ``p = _own(m)`` starts the swap-in, ``q = _own(m)`` was
    ready as early but runs after
    ``p``. When ``p`` ends, the swap-in is sent and ``q`` is launched; q
    was waiting already, so it is launched first and releases m (its last
    reader) before the copy is allocated. Peak at q's launch: m, p and q,
    12 S and four small constants (48 bytes); with the copy counted first
    it would be 13 S + 48."""
    def readers(a1):
        m = tf.tile(a1, [2, 2], name="m")
        p = _own(m, name="p")
        return p, [p, _own(m, name="q")]

    result = _swap_in_after(readers)
    (transfer,) = result.transfers
    live = {t.name: t for t in result.runtime_live_at_peak}
    assert result.runtime_gpu_peak_bytes == 12 * S + 48
    assert sorted(name for name, t in live.items() if t.nbytes >= S) == [
        "m:0", "p:0", "q:0"]
    assert transfer.recv_node + ":0" not in live


def test_runtime_copy_waits_for_the_swap_ins_trigger():
    """`_swap_in_after`: ``t = tile(a1)`` (4 S) starts the swap-in,
    ``big = _own(t)`` reads it. The virtual scheduler starts the swap-in on
    the CPU with ``t`` (it takes an op's ready time from the input it
    processed last, here the swap-out), but the GPU copy is allocated no
    earlier than ``t``'s end, here when its ``_Recv`` runs, just before
    ``big``. Peak at ``big``'s launch: t, big and the copy, 9 S + 24."""
    result = _swap_in_after(
        lambda a1: _then_big(tf.tile(a1, [2, 2], name="t")))
    (transfer,) = result.transfers
    live = {t.name: t for t in result.runtime_live_at_peak}
    copy = live[transfer.recv_node + ":0"]
    assert result.runtime_gpu_peak_bytes == 9 * S + 24
    # t ends when big starts; the swap-in ran in the schedule when t began.
    assert copy.alloc_ns == transfer.start_ns == live["big:0"].alloc_ns
    assert copy.alloc_ns > live["t:0"].alloc_ns


def test_runtime_peak_counts_variables_not_reads():
    """x -> a1 -> a2 -> out = a2 * v with v a resource variable of S bytes.

    Raw: at a2's start x, a1, a2 and the ReadVariableOp output (allocated
    at time 0 and kept until out) are live: 4 S. Runtime: the read is the
    variable's buffer, resident all step, plus two chain tensors: 3 S.
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        v = tf.Variable(tf.zeros(SHAPE), name="v")
        a1 = _own(x, name="a1")
        a2 = _own(a1, name="a2")
        out = tf.multiply(a2, v, name="out")
    result = oracle.peak_memory(graph, out)
    assert result.raw_gpu_peak_bytes == 4 * S
    assert "out/ReadVariableOp:0" in {t.name for t in result.raw_live_at_peak}
    assert result.runtime_gpu_peak_bytes == 3 * S
    (variable,) = [t for t in result.runtime_live_at_peak if t.variable]
    assert variable.name == "v"
    assert variable.nbytes == S
    assert variable.alloc_ns == 0
    assert variable.dealloc_ns >= max(
        t.dealloc_ns for t in result.runtime_live_at_peak)
    assert not any("ReadVariableOp" in t.name
                   for t in result.runtime_live_at_peak)


def test_runtime_peak_counts_ref_variables_once():
    """x -> a1 -> a2 -> out = a2 * v -> assign(v, out), v a v1 ref variable
    (VariableV2) of S bytes.

    The VariableV2 output and the Assign output are references to v's
    buffer, which is resident: 3 S (first reached at a1: v, x and a1), as
    for a resource variable. Counting the VariableV2 output as a buffer of
    its own (live from the step's start to its last reader) gave 4 S.
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        v = tf.compat.v1.get_variable(
            "v", SHAPE, initializer=tf.compat.v1.zeros_initializer(),
            use_resource=False)
        a1 = _own(x, name="a1")
        a2 = _own(a1, name="a2")
        out = tf.multiply(a2, v, name="out")
        update = tf.compat.v1.assign(v, out, name="update")
    assert v.op.type == "VariableV2"
    result = oracle.peak_memory(graph, update)
    assert result.runtime_gpu_peak_bytes == 3 * S
    assert sorted((t.name, t.variable) for t in result.runtime_live_at_peak
                  if t.nbytes) == [("a1:0", False), ("v", True),
                                   ("x:0", False)]


def test_scheduler_cross_check():
    graph, out = _swap_graph()
    result = oracle.peak_memory(graph, out, scheduler_check=True)
    assert 0 < result.scheduler_gpu_peak_bytes <= result.gpu_peak_bytes


@pytest.mark.parametrize("builder, kwargs", [
    (models.mlp, dict(depth=3, width=64, batch=8)),
    (models.cnn_bn, dict(image=16, channels=8, depth=3, batch=4)),
    (models.keras_resnet, dict(image=16, batch=2, blocks=(1, 1))),
])
def test_models_without_swaps_need_no_correction(builder, kwargs):
    graph = tf.Graph()
    with graph.as_default():
        model = builder(**kwargs)
    result = oracle.peak_memory(graph, model.train_op)
    assert result.raw_gpu_peak_bytes > 0
    assert result.gpu_peak_bytes == result.raw_gpu_peak_bytes
    assert result.replayed_raw_gpu_peak_bytes == result.raw_gpu_peak_bytes
    assert result.transfers == ()
    assert 0 < result.runtime_gpu_peak_bytes == sum(
        t.nbytes for t in result.runtime_live_at_peak)
    # Bigger batch, more activation memory.
    bigger = tf.Graph()
    with bigger.as_default():
        big_model = builder(**dict(kwargs, batch=kwargs["batch"] * 4))
    assert (oracle.peak_memory(bigger, big_model.train_op).gpu_peak_bytes
            > result.gpu_peak_bytes)


def test_runtime_sizes_come_from_static_shapes():
    """x -> a = _own(x); t = Transpose(a, InvertPermutation([1, 0]));
    c = _own(t); out = c + a.

    Grappler's shape inference does not evaluate the InvertPermutation, so
    the step stats size t (and c, computed from it) as 4 bytes, and the
    cost model makes c a zero-length op. TensorFlow's construction-time
    inference knows t is S bytes: while c runs, a, t and c are live, 3 S.
    Grappler's own count sees 2 S.
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        a = _own(x, name="a")
        perm = tf.math.invert_permutation(tf.constant([1, 0]), name="perm")
        t = tf.transpose(a, perm, name="t")
        out = tf.add(_own(t, name="c"), a, name="out")
    assert t.shape.as_list() == SHAPE
    result = oracle.peak_memory(graph, out)
    assert result.raw_gpu_peak_bytes < 2 * S + 64
    assert result.runtime_gpu_peak_bytes == 3 * S
    assert sorted(t.name for t in result.runtime_live_at_peak) == [
        "a:0", "c:0", "t:0"]
    # The same from a GraphDef (shapes inferred on a scratch import).
    from_def = oracle.peak_memory(graph.as_graph_def(), "out")
    assert from_def.runtime_gpu_peak_bytes == 3 * S


def test_runtime_zero_length_op_holds_its_input_while_allocating():
    """In the graph above, c starts and ends in the microsecond t ends, and
    out starts then too. Releasing t before that microsecond's
    allocations would never show t and c together (the peak would be a, c
    and out); holding t until every allocation of the microsecond, out's
    included, would show four tensors (4 S). In execution order c
    allocates, releases t, then out allocates: a, t, c first, 3 S."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        a = _own(x, name="a")
        perm = tf.math.invert_permutation(tf.constant([1, 0]), name="perm")
        c = _own(tf.transpose(a, perm, name="t"), name="c")
        out = tf.add(c, a, name="out")
    result = oracle.peak_memory(graph, out)
    live = {t.name: t for t in result.runtime_live_at_peak}
    assert live["c:0"].alloc_ns == live["t:0"].dealloc_ns  # zero-length c
    assert result.runtime_gpu_peak_bytes == 3 * S


def test_graph_def_with_a_dangling_colocation_is_measured():
    """`benchmarks.measure.forward_identities` drops Identity ops that other
    ops may be colocated with; the measurement ignores colocation, and the
    import that finds static shapes must not reject the GraphDef."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, SHAPE, name="x")
        fwd = tf.identity(x, name="fwd")
        with tf.compat.v1.colocate_with(fwd):
            _own(x, name="y")
    graph_def = tf.compat.v1.GraphDef()
    for node in graph.as_graph_def().node:
        if node.name != "fwd":
            graph_def.node.add().CopyFrom(node)
    result = oracle.peak_memory(graph_def, "y")
    assert result.runtime_gpu_peak_bytes == 2 * S


def _function_with_host_slot():
    """A tf.function step (built in graph mode) capturing a weight ``w``
    made on ``/cpu:1`` (the device LMS manages) and a slot ``m`` made on
    the host ``/cpu:0``, each of S bytes, traced with no device scope (as
    Keras traces its step: the captured handles unplaced); then the slot's
    reads and writes placed on the host, as ``offload_optimizer``'s
    rewrite places them: ``(function graph, fetch names)``."""
    graph = tf.Graph()
    with graph.as_default():
        with tf.device("/cpu:1"):
            w = tf.Variable(tf.ones(SHAPE), name="w")
        with tf.device("/cpu:0"):
            m = tf.Variable(tf.zeros(SHAPE), name="m")

        @tf.function
        def step(x):
            grad = _own(x * w.read_value(), name="grad")
            with tf.name_scope("slot_write"):
                m.assign_add(grad * 0.1)
            with tf.name_scope("slot_read"):
                new = m.read_value() * 0.01
            w.assign_sub(new)
            return tf.reduce_sum(grad)

        concrete = step.get_concrete_function(
            tf.TensorSpec(SHAPE, tf.float32))
    func_graph = concrete.graph
    for op in func_graph.get_operations():
        if (op.name.startswith(("slot_write", "slot_read"))
                and op.type != "Placeholder"):
            op._set_device("/cpu:0")
    fetches = [t.op.name for t in func_graph.outputs]
    fetches += [op.name for op in func_graph.control_outputs]
    return func_graph, fetches


def test_place_on_gpu_with_a_host_puts_each_variable_on_its_device():
    """With ``host``, LMS's rule: the ops and the captured variables on
    the host stay on the CPU, everything else (a logical ``/cpu:1``
    included) goes to the GPU; the runtime replay counts the weight on
    the GPU and the slot on the host. Without it, as before: the captured
    handles unplaced, so both variables on the GPU."""
    func_graph, fetches = _function_with_host_slot()
    handles = {v.name.split(":")[0]: name for name, v in
               oracle.functions.function_api.captured_variables(
                   func_graph).items()}
    placed = {n.name: n for n in
              oracle.place_on_gpu(func_graph, host="/cpu:0").node}
    assert placed[handles["w"]].op == "VarHandleOp"
    assert placed[handles["w"]].device == "/device:GPU:0"
    assert placed[handles["m"]].device == "/cpu:0"
    assert placed["grad"].device == "/device:GPU:0"
    assert placed["slot_write/AssignAddVariableOp"].device == "/cpu:0"

    def resident(result):
        return {t.name: t.nbytes for t in result.runtime_live_at_peak
                if t.variable}

    hosted = oracle.peak_memory(func_graph, fetches, place="/cpu:0")
    assert resident(hosted) == {handles["w"]: S}
    everywhere = oracle.peak_memory(func_graph, fetches)
    assert resident(everywhere) == {handles["w"]: S, handles["m"]: S}
    assert everywhere.runtime_gpu_peak_bytes - \
        hosted.runtime_gpu_peak_bytes >= S
    # The function graph itself is untouched.
    assert all(op.type != "VarHandleOp"
               for op in func_graph.get_operations())
