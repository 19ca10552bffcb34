"""Element-wise ops that write their output into an input's buffer
(`tflms.inplace`), in closed form: in the simulator and in the oracle's
runtime replay, which apply the rule independently.

Every large tensor here is float32 [512, 512] (1 MiB) in the simulator's
graphs and [1024, 1024] (S = 4 MiB) in the oracle's; ``x`` is a small
placeholder that a ``tile`` makes the first large tensor from, so the large
tensors are the only ones that count.
"""

import tensorflow as tf

from tflms.tf import reader as tf_reader
from tflms import analysis
from tflms import inplace
from tflms.tf import oracle
from tflms import planner
from tflms.tf import rewriter
from tflms import simulator

MIB = 1 << 20
S = 4 * MIB


def _replay(graph, plan=None):
    index = tf_reader.build_index(graph)
    model = simulator.SimulationModel(index, analysis.classify_ops(index))
    result = model.replay(plan)
    return index, result, (result.device_timeline
                           - result.resident_device_bytes).tolist()


def _tiled(side):
    """x (side/32 square, small) and a = tile(x) (side square)."""
    x = tf.compat.v1.placeholder(tf.float32, [side // 32, side // 32],
                                 name="x")
    return x, tf.tile(x, [32, 32], name="a")


def test_the_kernels_that_write_in_place():
    assert inplace.inplace_candidates("Relu", 1) == (0,)
    assert inplace.inplace_candidates("AddV2", 2) == (0, 1)
    assert inplace.inplace_candidates("AddN", 3) == (0, 1, 2)
    assert inplace.inplace_candidates("Select", 3) == (1, 2)
    assert inplace.inplace_candidates("FusedBatchNormV3", 5) == (0,)
    # A matrix product or a convolution always allocates.
    assert inplace.inplace_candidates("MatMul", 2) == ()
    assert inplace.inplace_candidates("Conv2D", 2) == ()


def _elementwise_chain():
    """a = tile(x) -> b = relu(a) -> c = exp(b) -> d = sum(c): each
    element-wise op is its input's only reader, so b and c are a's buffer.
    Levels: x 0, a 1, b 2, c 3, d 4 (d and the sum's axes are small)."""
    g = tf.Graph()
    with g.as_default():
        _, a = _tiled(512)
        b = tf.nn.relu(a, name="b")
        c = tf.math.exp(b, name="c")
        tf.reduce_sum(c, name="d")
    return g


def test_simulator_chain_of_element_wise_ops_is_one_buffer():
    index, result, timeline = _replay(_elementwise_chain())
    x = 16 * 16 * 4
    # One large buffer from a to d; counted as new buffers it would be two
    # at b and at c.
    assert timeline == [x, x + MIB, MIB, MIB, MIB + 4]
    assert result.peak_device_bytes - result.resident_device_bytes \
        == x + MIB
    names = [n for n, _ in result.live_at_peak]
    assert "a:0" in names


def test_simulator_input_read_later_is_not_written_over():
    """b = relu(a) while a is read again by e = matmul(a, a) two levels on:
    relu is not a's last reader, so b is a buffer of its own, and so is
    c = exp(b) (b's only reader writes into b)."""
    g = tf.Graph()
    with g.as_default():
        _, a = _tiled(512)
        b = tf.nn.relu(a, name="b")
        c = tf.math.exp(b, name="c")
        tf.linalg.matmul(a, c, name="e")
    _, result, timeline = _replay(g)
    x = 16 * 16 * 4
    # Levels: x 0, a 1, b 2, c 3, e 4.
    assert timeline == [x, x + MIB, 2 * MIB, 2 * MIB, 3 * MIB]


def test_simulator_readers_at_one_level_do_not_write_in_place():
    """a is read by relu and by exp at the same level: either could run
    last, so neither is counted as writing into it."""
    g = tf.Graph()
    with g.as_default():
        _, a = _tiled(512)
        b = tf.nn.relu(a, name="b")
        c = tf.math.exp(a, name="c")
        tf.math.add(b, c, name="out")
    _, _, timeline = _replay(g)
    x = 16 * 16 * 4
    # Levels: x 0, a 1, b and c 2, out 3 (written into b, its first input).
    assert timeline == [x, x + MIB, 3 * MIB, 2 * MIB]


def test_simulator_broadcast_operand_is_not_taken():
    """out = v + a with v a [512] vector: the kernel tries v first, whose
    size is not the output's, then a, whose buffer it takes."""
    g = tf.Graph()
    with g.as_default():
        _, a = _tiled(512)
        v = tf.compat.v1.placeholder(tf.float32, [512], name="v")
        tf.math.add(v, a, name="out")
    index, result, timeline = _replay(g)
    x, v = 16 * 16 * 4, 512 * 4
    # Levels: x, v 0; a 1; out 2 (in a's buffer; v freed after out).
    assert timeline == [x + v, x + v + MIB, v + MIB]
    assert result.peak_device_bytes - result.resident_device_bytes \
        == x + v + MIB


def test_simulator_decides_on_the_graph_without_a_plan():
    """a = tile(x), b = relu(a), c = exp(b), d = sum(c), late = a * d.
    Without LMS late is a's last reader, so relu allocates b. A plan that
    swaps a out for late does not change that: the simulator decides which
    op writes in place on the graph as it is (counting a buffer the runtime
    might not allocate can only overestimate), and the swap-out holds a
    until its copy has left anyway. Levels: x 0, a 1, b 2, c 3, d 4, the
    swap-in 5 (after d, its trigger), late 6."""
    g = tf.Graph()
    with g.as_default():
        _, a = _tiled(512)
        b = tf.nn.relu(a, name="b")
        c = tf.math.exp(b, name="c")
        d = tf.reduce_sum(c, name="d")
        tf.math.multiply(a, d, name="late")
    index = tf_reader.build_index(g)
    roles = analysis.classify_ops(index)
    model = simulator.SimulationModel(index, roles)
    without = model.replay(None)
    ids = index.id_of
    swap = planner.SwapPlan(
        producer=ids["a"], output=0, nbytes=MIB,
        swap_ins=(planner.SwapInPlan(((ids["late"], 0),), (ids["d"],),
                                     False),),
        waiters=())
    plan = planner.Plan(params=planner.SwapParams(1, 1, 0, 0),
                        swaps=(swap,), serialization_edges=(),
                        num_levels=0)
    with_lms = model.replay(plan)
    resident = without.resident_device_bytes
    x = 16 * 16 * 4
    # Without LMS: a and b at b's level, a and c at c's (exp writes into
    # b), a, c and d at d's, then late (written into a) and d.
    assert (without.device_timeline - resident).tolist() == [
        x, x + MIB, 2 * MIB, 2 * MIB, 2 * MIB + 4, MIB + 4]
    # With the swap: a until its swap-out (level 2) beside b, then c alone
    # (in b's buffer), c and d, a's copy and d, late written into the copy.
    assert (with_lms.device_timeline - resident).tolist() == [
        x, x + MIB, 2 * MIB, MIB, MIB + 4, MIB + 4, MIB + 4]
    assert with_lms.swapout_bytes == with_lms.swapin_bytes == MIB


def test_oracle_chain_of_element_wise_ops_is_one_buffer():
    """The oracle's runtime replay of the same chain at S per tensor: a, b
    and c are one buffer, so the peak is a and x at a's start; Grappler's
    own count holds a and b at once."""
    g = tf.Graph()
    with g.as_default():
        _, a = _tiled(1024)
        b = tf.nn.relu(a, name="b")
        c = tf.math.exp(b, name="c")
        out = tf.reduce_sum(c, name="d")
    result = oracle.peak_memory(g, out)
    # The tile's multiples and the sum's axes: two int32 pairs, 16 bytes.
    assert result.runtime_gpu_peak_bytes == S + 32 * 32 * 4 + 16
    assert result.raw_gpu_peak_bytes >= 2 * S


def test_oracle_input_read_later_is_not_written_over():
    """As in the simulator: relu is not a's last reader, so b allocates;
    exp writes into b; e = matmul(a, c) holds a, c and e: 3 S."""
    g = tf.Graph()
    with g.as_default():
        _, a = _tiled(1024)
        b = tf.nn.relu(a, name="b")
        c = tf.math.exp(b, name="c")
        out = tf.linalg.matmul(a, c, name="e")
    result = oracle.peak_memory(g, out)
    assert result.runtime_gpu_peak_bytes == 3 * S
    assert sorted(t.name for t in result.runtime_live_at_peak
                  if t.nbytes >= S) == ["a:0", "b:0", "e:0"]


def _recomputed_chain(twice=False):
    """a = tile(x), b = relu(a), c = sigmoid(b) (or b * b with `twice`),
    z = tanh(c); m1 = sum(z), m2..m5 = sin(...) (small); gz = z * m5 reads
    z late, out = gz + a reads a last. Levels: x and the tile's multiples 0,
    a 1, b 2, c 3, z 4, m1..m5 5..9, gz 10, out 11. The plan recomputes z
    for gz by cloning b, c and z from a (on the device until out), three
    levels ahead of gz: the clones run at 7, 8 and 9."""
    g = tf.Graph()
    with g.as_default():
        _, a = _tiled(512)
        b = tf.nn.relu(a, name="b")
        c = (tf.math.multiply(b, b, name="c") if twice
             else tf.math.sigmoid(b, name="c"))
        z = tf.math.tanh(c, name="z")
        m = tf.reduce_sum(z, name="m1")
        for k in range(2, 6):
            m = tf.math.sin(m, name="m%d" % k)
        gz = tf.math.multiply(z, m, name="gz")
        out = tf.math.add(gz, a, name="out")
    index = tf_reader.build_index(g)
    roles = analysis.classify_ops(index)
    ids = index.id_of
    rec = planner.Recomputer(index, roles).plan(
        ids["z"], 0, ((ids["gz"], 0),))
    assert rec.ops == (ids["b"], ids["c"], ids["z"])
    plan = planner.Plan(params=planner.SwapParams(1, 1, 0, 0), swaps=(),
                        serialization_edges=(), num_levels=0,
                        recomputes=(rec,))
    return g, out, index, roles, plan


def test_clones_write_in_place_as_their_kernels_do():
    """A clone that is the only reader of an earlier clone's output writes
    into it, as the original kernel would (the plan decides a clone's
    readers): the three clones are one buffer. The simulator and the
    oracle's runtime replay of the rewritten graph agree."""
    g, out, index, roles, plan = _recomputed_chain()
    result = simulator.SimulationModel(index, roles).replay(plan)
    resident = result.resident_device_bytes
    x = 16 * 16 * 4
    # a and b until out (c and z written into b); z freed after m1 (5);
    # m1..m5 one 4-byte buffer; the clones at 7-9 one buffer beside a (as
    # new buffers, b's and c's clones would be 3 MiB at 8); gz written into
    # z's clone at 10; out at 11.
    assert (result.device_timeline - resident).tolist() == [
        x, x + MIB, 2 * MIB, 2 * MIB, 2 * MIB, 2 * MIB + 4, MIB + 4,
        2 * MIB + 4, 2 * MIB + 4, 2 * MIB + 4, 2 * MIB + 4, 2 * MIB]
    rewriter.apply_plan(g, index, plan, "/cpu:0")
    replay = oracle.peak_memory(g, out)
    # The runtime peak is a and one other buffer (and the small constants):
    # the clones do not hold three.
    assert replay.runtime_gpu_peak_bytes < 2 * MIB + 64


def test_a_clone_output_read_twice_is_not_written_over():
    """c = b * b reads b's clone twice: its clone allocates (the runtime
    holds two references), and z's clone writes into c's: a, b's clone and
    c's clone at 8, in the simulator and the oracle alike."""
    g, out, index, roles, plan = _recomputed_chain(twice=True)
    result = simulator.SimulationModel(index, roles).replay(plan)
    resident = result.resident_device_bytes
    assert (result.device_timeline - resident).tolist()[7:10] == [
        2 * MIB + 4, 3 * MIB + 4, 2 * MIB + 4]
    rewriter.apply_plan(g, index, plan, "/cpu:0")
    replay = oracle.peak_memory(g, out)
    assert 3 * MIB <= replay.runtime_gpu_peak_bytes < 3 * MIB + 64
