"""Which ops Grappler and oneDNN merge at run time (tflms/fusions.py):
fusion partners seen through identities, and the groups of ops Grappler
merges, which a tf.function's step leaves alone (no swap out of them, no
control edge into them)."""

from tflms import analysis
from tflms import fusions
from tflms import graph_index as gi
from tflms.target import Target

# A tf.function step's target (Grappler's groups left whole), and one on
# oneDNN's CPU kernels.
GROUPS = Target(grappler_groups=True)
ONEDNN = Target(grappler_groups=True, onednn_cpu=True)


def names_of(index, ids):
    return {index.names[i] for i in ids}


def fusion_graph():
    return gi.from_edges(
        [("x", "Placeholder"), ("k", "Const"), ("pad", "Pad"),
         ("pad_id", "Identity"), ("conv", "Conv2D"), ("b", "Const"),
         ("bias", "BiasAdd"), ("g", "Placeholder"), ("g_id", "Identity"),
         ("bias_grad", "BiasAddGrad"), ("filter_grad", "Conv2DBackpropFilter"),
         ("relu", "Relu"), ("other_grad", "BiasAddGrad")],
        edges=[("x", "pad"), ("k", "pad"), ("pad", "pad_id"),
               ("pad_id", "conv"), ("k", "conv"), ("conv", "bias"),
               ("b", "bias"), ("g", "g_id"), ("g_id", "bias_grad"),
               ("x", "filter_grad"), ("k", "filter_grad"),
               ("g", "filter_grad"), ("conv", "relu"),
               ("relu", "other_grad")])


def test_fusion_partners_see_through_identities():
    index = fusion_graph()
    found = {index.names[k]: names_of(index, v)
             for k, v in fusions.fusion_partners(index).items()}
    assert found == {
        "pad": {"conv"}, "conv": {"pad", "bias"}, "bias": {"conv"},
        "bias_grad": {"filter_grad"}, "filter_grad": {"bias_grad"}}
    assert analysis.classify_ops(index).fused_with == \
        fusions.fusion_partners(index)


def test_grappler_groups_are_neither_swapped_nor_ordered():
    """A residual block's additions (bn_add -> res_add, Grappler makes one
    AddN of them), a conv + bias add (one _FusedConv2D), and ops that
    Grappler leaves as they are: an addition read twice, a Mul read by an
    Add. The inner ops are not sources, no member triggers or waits."""
    index = gi.from_edges(
        [("x", "Placeholder"), ("conv", "Conv2D"), ("bias", "BiasAdd"),
         ("scale", "Mul"), ("bn_add", "AddV2"), ("skip", "Identity"),
         ("res_add", "AddV2"), ("relu", "Relu"), ("twice", "AddV2"),
         ("late", "Relu"), ("sum", "AddN")],
        edges=[("x", "conv"), ("conv", "bias"), ("bias", "scale"),
               ("scale", "bn_add"), ("bn_add", "skip"), ("skip", "res_add"),
               ("x", "res_add"), ("res_add", "relu"), ("relu", "twice"),
               ("x", "twice"), ("twice", "late"), ("twice", "sum"),
               ("late", "sum")])
    inner, members, direct = fusions.grappler_groups(index)
    assert names_of(index, inner) == {"conv", "bn_add"}
    assert names_of(index, members) == {"conv", "bias", "bn_add", "res_add"}
    # A Session graph's roles are as they were (its plans too) ...
    roles = analysis.classify_ops(index)
    assert {"conv", "bn_add"} <= names_of(index, roles.sources)
    # ... a tf.function's step leaves the groups alone.
    roles = analysis.classify_ops(index, GROUPS)
    assert not names_of(index, roles.sources) & {"conv", "bn_add"}
    assert {"bias", "scale", "res_add", "twice"} <= names_of(index,
                                                             roles.sources)
    assert not names_of(index, roles.triggers | roles.waiters) & {
        "conv", "bias", "bn_add", "res_add"}
    assert "scale" in names_of(index, roles.triggers)


def test_identity_n_of_many_inputs_gets_no_control_edge():
    """Grappler's dependency optimizer removes an IdentityN of several
    inputs (Keras 3's optimizer passes its gradients through one) only
    while it has no control edge, and then the arithmetic optimizer merges
    the products on either side of it: in a tf.function's step it neither
    triggers nor waits. An IdentityN of one input is removed either way."""
    index = gi.from_edges(
        [("x", "Placeholder"), ("g1", "Relu"), ("g2", "Relu"),
         ("grads", "IdentityN"), ("one", "IdentityN"), ("y", "Relu"),
         ("z", "Relu")],
        edges=[("x", "g1"), ("x", "g2"), ("g1", "grads"), ("g2", "grads"),
               ("x", "one"), ("one", "y"), ("grads", "z")])
    members = fusions.grappler_groups(index).members
    assert "grads" in names_of(index, members)
    assert "one" not in names_of(index, members)
    assert "grads" in names_of(index, analysis.classify_ops(index).triggers)
    roles = analysis.classify_ops(index, GROUPS)
    assert "grads" not in names_of(index, roles.triggers | roles.waiters)
    assert "one" in names_of(index, roles.triggers)


def swish_graph():
    """``x * sigmoid(x * 1)`` as ``tf.nn.silu`` writes it (the ``x * 1``
    is the arithmetic optimizer's to remove), read late by its gradient,
    and a squeeze-excitation gate ``y * sigmoid(z)``, which is no swish."""
    return gi.from_edges(
        [("x", "Relu", {"outputs": [1024]}), ("one", "Const"),
         ("beta_x", "Mul", {"forwards_input": 0, "outputs": [1024]}),
         ("sigmoid", "Sigmoid", {"outputs": [1024]}),
         ("swish", "Mul", {"outputs": [1024]}),
         ("z", "Relu", {"outputs": [1024]}),
         ("gate", "Sigmoid", {"outputs": [1024]}),
         ("excite", "Mul", {"outputs": [1024]}),
         ("a", "Relu", {"outputs": [1024]}),
         ("b", "Relu", {"outputs": [1024]}),
         ("c", "Relu", {"outputs": [1024]}),
         ("grad", "AddN", {"outputs": [1024]})],
        edges=[("x", "beta_x"), ("one", "beta_x"), ("beta_x", "sigmoid"),
               ("x", "swish"), ("sigmoid", "swish"), ("swish", "z"),
               ("z", "gate"), ("swish", "excite"), ("gate", "excite"),
               ("excite", "a"), ("a", "b"), ("b", "c"), ("c", "grad"),
               ("x", "grad")])


def test_a_swish_stays_one_op_for_onednn():
    """On oneDNN's CPU kernels, the remapper makes one _MklSwish of Mul(x,
    Sigmoid(x)) only while the Sigmoid has no other reader and no control
    edge and the Mul reads x itself: in a tf.function's step the Sigmoid is
    not swapped, neither op triggers or waits, and the Mul reads x as the
    model wrote it, not from a swap-in (EfficientNet's activations rounded
    differently before). The gate's Sigmoid is no swish."""
    index = swish_graph()
    inner, members, direct = fusions.grappler_groups(index, onednn_cpu=True)
    assert names_of(index, inner) == {"sigmoid"}
    assert names_of(index, members) == {"sigmoid", "swish"}
    assert names_of(index, direct) == {"swish"}
    session_roles = analysis.classify_ops(index, Target(onednn_cpu=True))
    assert {"swish"} <= names_of(index, session_roles.sinks)
    roles = analysis.classify_ops(index, ONEDNN)
    assert "swish" not in names_of(index, roles.sinks)
    assert "sigmoid" not in names_of(index, roles.sources)
    assert not names_of(index, roles.triggers | roles.waiters) & {
        "sigmoid", "swish"}
    assert {"gate", "excite"} <= names_of(index, roles.triggers)
    assert "excite" in names_of(index, roles.sinks)
    # Without oneDNN nothing merges them.
    assert not any(fusions.grappler_groups(swish_graph()))


def test_a_max_pool_keeps_its_output_for_its_gradient_on_onednn():
    """On oneDNN's CPU kernels the layout pass gives a MaxPoolGrad its
    pool's workspace only while it reads the pool's own output: that output
    is not swapped (NASNet's gradients of tied maxima went elsewhere
    before); the pool's input still may be."""
    index = gi.from_edges(
        [("x", "Relu", {"outputs": [4096]}),
         ("pool", "MaxPool", {"outputs": [1024]}),
         ("a", "Relu", {"outputs": [1024]}),
         ("b", "Relu", {"outputs": [1024]}),
         ("c", "Relu", {"outputs": [1024]}),
         ("grad", "MaxPoolGrad", {"outputs": [4096]})],
        edges=[("x", "pool"), ("pool", "a"), ("a", "b"), ("b", "c"),
               ("x", "grad"), ("pool", "grad"), ("c", "grad")])
    assert names_of(index, fusions.grappler_groups(
        index, onednn_cpu=True).inner) == {"pool"}
    roles = analysis.classify_ops(index, ONEDNN)
    assert "pool" not in names_of(index, roles.sources)
    assert {"x", "grad"} <= names_of(index, roles.sources | roles.sinks)
    assert "x" in names_of(index, roles.sources)
    assert "pool" in names_of(index,
                              analysis.classify_ops(index, GROUPS).sources)


def test_readers_of_a_shape_alone_do_not_split_a_group():
    """A layer normalization's ``(x * scale + offset) + shift`` with an
    unknown batch: the gradient of the additions reads their operands'
    shapes, which Grappler's constant folding drops before the arithmetic
    optimizer makes one AddN of them. The Shape readers do not keep the
    additions from being a group (they did: GPT-2's fit with whole batches
    rounded differently)."""
    index = gi.from_edges(
        [("x", "Placeholder"), ("scaled", "Mul"), ("offset", "Relu"),
         ("add_1", "AddV2"), ("shift", "Mul"), ("add_2", "AddV2"),
         ("shape", "Shape"), ("size", "Size"), ("out", "Relu")],
        edges=[("x", "scaled"), ("x", "offset"), ("scaled", "add_1"),
               ("offset", "add_1"), ("x", "shift"), ("add_1", "add_2"),
               ("shift", "add_2"), ("add_1", "shape"), ("add_1", "size"),
               ("add_2", "out")])
    inner, members, _ = fusions.grappler_groups(index)
    assert names_of(index, inner) == {"add_1"}
    assert {"add_1", "add_2"} <= names_of(index, members)


def transpose_graph(shape_w, shape_t):
    """``h @ transpose(w)`` (a language model's logits against its tied
    embedding, shapes `shape_w` and `shape_t`), the transpose also read by
    the product's gradient late, and by a Relu."""
    return gi.from_edges(
        [("h", "Placeholder", {"outputs": [((4, 8), 4)]}),
         ("w", "Relu", {"outputs": [(shape_w, 4)]}),
         ("w_t", "Transpose", {"outputs": [(shape_t, 4)]}),
         ("logits", "MatMul", {"outputs": [((4, 16), 4)]}),
         ("a", "Relu", {"outputs": [((4, 16), 4)]}),
         ("b", "Relu", {"outputs": [((4, 16), 4)]}),
         ("grad", "MatMul", {"outputs": [((4, 8), 4)]}),
         ("other", "Relu", {"outputs": [(shape_t, 4)]})],
        edges=[("h", "logits"), ("w", "w_t"), ("w_t", "logits"),
               ("logits", "a"), ("a", "b"), ("b", "grad"), ("w_t", "grad"),
               ("w_t", "other")])


def test_a_transpose_folded_into_its_products_is_never_swapped():
    """Grappler folds a transpose of the last two dimensions into each
    MatMul that reads it (transpose_b, another order of summing): in a
    tf.function's step the transpose is never swapped, so the products
    read it as the model wrote it (with LMS, Grappler left GPT-2's
    transposed tied embedding unfolded before). The fold looks at each
    operand alone: the products may read a swap-in of their other
    operand (the attention's keys and queries in its gradient)."""
    index = transpose_graph((16, 8), (8, 16))
    pairs = {(index.names[t], index.names[p])
             for t, p in fusions.folded_transposes(index)}
    assert pairs == {("w_t", "logits"), ("w_t", "grad")}
    groups = fusions.grappler_groups(index)
    assert names_of(index, groups.inner) == {"w_t"}
    assert not groups.direct_readers
    roles = analysis.classify_ops(index, GROUPS)
    assert "w_t" not in names_of(index, roles.sources)
    assert {"logits", "grad", "other"} <= names_of(index, roles.sinks)
    assert "w_t" in names_of(index, analysis.classify_ops(index).sources)


def test_a_transpose_of_other_dimensions_is_not_folded():
    """A transpose that moves more than the last two dimensions (the
    heads of an attention, [b, s, h, d] -> [b, h, s, d]) is no matrix
    transpose: the products reading it may read swap-ins."""
    index = transpose_graph((2, 16, 8), (16, 2, 8))
    assert not list(fusions.folded_transposes(index))
    assert "w_t" not in names_of(index, fusions.grappler_groups(index).inner)


def test_a_power_joins_the_products_that_read_it():
    """GELU's ``0.044715 * x ** 3``: Grappler turns Pow(x, 3) into
    products that join the Mul reading it, a chain it reorders; the Pow is
    merged like a Mul (not swapped; neither triggers nor waits)."""
    index = gi.from_edges(
        [("x", "Placeholder"), ("three", "Const"), ("pow", "Pow"),
         ("c", "Const"), ("scaled", "Mul"), ("square", "Square"),
         ("grad", "Mul"), ("late", "Relu")],
        edges=[("x", "pow"), ("three", "pow"), ("c", "scaled"),
               ("pow", "scaled"), ("x", "square"), ("square", "grad"),
               ("scaled", "late"), ("late", "grad")])
    inner, members, _ = fusions.grappler_groups(index)
    assert {"pow", "square"} <= names_of(index, inner)
    assert {"pow", "scaled", "square", "grad"} <= names_of(index, members)


def gelu_power_graph(half=True):
    """GELU's ``c * x ** 3`` and its gradient's ``g * 3 * x ** (3 - 1)``,
    the gradient's power read late; with `half`, ``x`` is read by a
    product of its own too (GELU's ``0.5 * x``)."""
    halves = [("half", "Mul", {"outputs": [((4, 8), 4)]})] if half else []
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [((4, 8), 4)]}),
         *halves,
         ("three", "Const", {"outputs": [((), 4)]}),
         ("pow", "Pow", {"outputs": [((4, 8), 4)]}),
         ("c", "Const", {"outputs": [((), 4)]}),
         ("scaled", "Mul", {"outputs": [((4, 8), 4)]}),
         ("one", "Const", {"outputs": [((), 4)]}),
         ("sub", "Sub", {"outputs": [((), 4)]}),
         ("pow_grad", "Pow", {"outputs": [((4, 8), 4)]}),
         ("late", "Relu", {"outputs": [((4, 8), 4)]}),
         ("later", "Relu", {"outputs": [((4, 8), 4)]}),
         ("grad", "Mul", {"outputs": [((4, 8), 4)]})],
        edges=[("x", "pow"), ("three", "pow"), ("c", "scaled"),
               ("pow", "scaled"), ("three", "sub"), ("one", "sub"),
               ("x", "pow_grad"), ("sub", "pow_grad"),
               ("scaled", "late"), ("late", "later"),
               ("later", "grad"), ("pow_grad", "grad")]
        + ([("x", "half"), ("c", "half")] if half else []))


def test_the_gradient_power_of_a_power_may_be_swapped():
    """The gradient of ``x ** 3`` reads ``x ** 2``: Grappler makes one
    Square of ``x`` for both powers and shares it, so the Square already
    has two readers and joins no chain; a swap-out is a third reader.
    The gradient's power is swapped like any tensor (GELU's, held from
    the forward pass to the backward one); the forward power stays
    merged, and both stay members (no control edge on them)."""
    index = gelu_power_graph()
    assert names_of(index, fusions.power_gradients(index)) == {"pow_grad"}
    inner, members, _ = fusions.grappler_groups(index)
    assert "pow" in names_of(index, inner)
    assert "pow_grad" not in names_of(index, inner)
    assert {"pow", "pow_grad", "grad"} <= names_of(index, members)
    roles = analysis.classify_ops(index, GROUPS)
    assert "pow_grad" in names_of(index, roles.sources)
    assert "pow" not in names_of(index, roles.sources)


def test_the_gradient_power_of_a_cube_alone_stays_merged():
    """``tanh(x + c * x ** 3)``: ``x`` is read by no product of its own,
    and Grappler orders the cube's product otherwise once the shared
    Square has one more reader (tests/test_grappler_check.py), so the
    gradient's power is merged like any power."""
    index = gelu_power_graph(half=False)
    assert not list(fusions.power_gradients(index))
    inner = names_of(index, fusions.grappler_groups(index).inner)
    assert {"pow", "pow_grad"} <= inner


def test_a_power_of_another_tensor_is_no_gradient_power():
    """``pow(y, 3 - 1)`` of another tensor than the power of 3 reads:
    no shared Square, the power stays merged (both bases read by
    products of their own)."""
    index = gi.from_edges(
        [("x", "Placeholder"), ("y", "Placeholder"), ("three", "Const"),
         ("pow", "Pow"), ("one", "Const"), ("sub", "Sub"),
         ("pow_grad", "Pow"), ("grad", "Mul"), ("hx", "Mul"),
         ("hy", "Mul")],
        edges=[("x", "pow"), ("three", "pow"), ("three", "sub"),
               ("one", "sub"), ("y", "pow_grad"), ("sub", "pow_grad"),
               ("pow_grad", "grad"), ("pow", "grad"), ("x", "hx"),
               ("one", "hx"), ("y", "hy"), ("one", "hy")])
    assert not list(fusions.power_gradients(index))
    assert "pow_grad" in names_of(index, fusions.grappler_groups(index).inner)


def test_a_broadcast_gradient_is_neither_trigger_nor_waiter():
    """``Reshape(Sum(g, BroadcastGradientArgs(...)), Shape(x))``, the
    gradient of a broadcasting op: where nothing was broadcast Grappler
    removes the Sum and the Reshape, in a pass a control edge on them
    delays, and the sum of gradients they feed then adds its terms in
    another order. In a tf.function's step they get no control edge."""
    index = gi.from_edges(
        [("x", "Placeholder"), ("g", "Relu"), ("sx", "Shape"),
         ("sg", "Shape"), ("bga", "BroadcastGradientArgs"),
         ("sum", "Sum"), ("reshape", "Reshape"), ("other", "Relu"),
         ("total", "AddN")],
        edges=[("x", "g"), ("x", "sx"), ("g", "sg"), ("sx", "bga"),
               ("sg", "bga"), ("g", "sum"), ("bga", "sum"),
               ("sum", "reshape"), ("sx", "reshape"), ("g", "other"),
               ("reshape", "total"), ("other", "total")])
    assert names_of(index, fusions.broadcast_gradients(index)) == {
        "sum", "reshape"}
    roles = analysis.classify_ops(index, GROUPS)
    assert not names_of(index, roles.triggers | roles.waiters) & {
        "sum", "reshape"}
    plain = analysis.classify_ops(index)
    assert {"sum", "reshape"} <= names_of(index, plain.triggers)
