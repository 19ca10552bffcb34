"""Training graphs the benchmarks measure, each built in its own `tf.Graph`.

Every builder returns a `Built`: the graph, the op one training step runs,
the batch size, a feed of random inputs (made only when asked, so that
graphs too large to run can still be measured) and the variable
initializer. Shapes are fully static, which the Grappler oracle needs.

* `resnet50`: ``tf.keras.applications.ResNet50(weights=None)`` trained with
  Keras' own graph-mode train function. ``learning_phase="baked"`` builds it
  in training mode (batch norm without a ``cond`` on the learning phase), the
  graph the memory measurements use; ``learning_phase="placeholder"`` keeps
  Keras' learning-phase conds, the graph a user of ``model.fit`` gets, which
  in v1 control flow (``tf.compat.v1.disable_v2_behavior()``) is the large
  graph the rewrite-time targets talk about.
* `unet3d`: a 3D U-Net (two 3x3x3 convs per level, max pooling, transposed
  conv upsampling, skip concatenations) for voxel-wise segmentation.
* `transformer`: a post-norm Transformer encoder from raw TF ops, Adam.
* `layered`: a synthetic graph of about ``num_ops`` ops shaped like a
  training step (a forward pass of layers and a mirrored backward pass that
  reads every forward activation again), for graph-size scaling.
* `deep_mlp`: a deep, narrow MLP of about ``num_ops`` ops built with the
  TF1 API (dense layers with bias and ReLU, plain SGD): thousands of levels
  with a small tensor at each, the shape that stresses planning the most.

This module turns nothing on globally; the caller picks eager/graph mode.
"""

import collections
import contextlib
import dataclasses
import random
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

__all__ = ["Built", "BUILDERS", "build", "resnet50", "unet3d", "transformer",
           "layered", "deep_mlp", "size_key"]

_v1 = tf.compat.v1


@dataclasses.dataclass
class Built:
    """One training graph.

    Attributes:
      name: builder name.
      graph: the `tf.Graph`.
      train_op: the op one step runs (also the oracle's fetch).
      loss: the loss tensor.
      batch_size: mini-batch size (for LMS's unknown dimensions).
      init_op: initializes every variable.
      make_feed: callable returning a feed dict of random inputs.
      description: short text for tables.
    """

    name: str
    graph: tf.Graph
    train_op: tf.Operation
    loss: tf.Tensor
    batch_size: int
    init_op: Optional[tf.Operation]
    make_feed: Callable[[], dict]
    description: str

    @property
    def num_ops(self):
        return len(self.graph.get_operations())


def _feed_maker(placeholders, seed):
    """Random inputs of the placeholders' static shapes (ints for labels)."""
    def make():
        rng = np.random.RandomState(seed)
        feed = {}
        for ph, classes in placeholders:
            shape = ph.shape.as_list()
            if ph.dtype.is_integer:
                feed[ph] = rng.randint(0, classes, size=shape).astype(
                    ph.dtype.as_numpy_dtype)
            else:
                feed[ph] = rng.standard_normal(shape).astype(
                    ph.dtype.as_numpy_dtype)
        return feed
    return make


@contextlib.contextmanager
def _seeded_keras(seed, baked):
    """Pins Keras' unseeded initializers and, if `baked`, training mode."""
    state = random.getstate()
    random.seed(seed)
    try:
        if baked:
            with tf.keras.backend.learning_phase_scope(1):
                yield
        else:
            yield
    finally:
        random.setstate(state)


def resnet50(image=224, batch=1, classes=10, learning_phase="baked",
             optimizer="sgd", seed=0):
    """Keras ResNet50 (``weights=None``) with a graph-mode training step.

    Args:
      image: input height and width (>= 32).
      batch: batch size, fixed in the input layer.
      classes: output classes.
      learning_phase: "baked" (training-mode batch norm, no conds) or
        "placeholder" (Keras' learning-phase conds, as ``model.fit`` builds).
      optimizer: "sgd" (momentum 0.9) or "adam" (Keras legacy optimizers).
      seed: seed for weights and data.

    Returns:
      A `Built`.
    """
    if learning_phase not in ("baked", "placeholder"):
        raise ValueError("learning_phase must be 'baked' or 'placeholder'; "
                         "got %r" % (learning_phase,))
    graph = tf.Graph()
    with graph.as_default(), _seeded_keras(seed,
                                           learning_phase == "baked"):
        _v1.set_random_seed(seed)
        inp = tf.keras.Input(shape=(image, image, 3), batch_size=batch,
                             name="image")
        model = tf.keras.applications.ResNet50(weights=None, input_tensor=inp,
                                               classes=classes)
        labels = _v1.placeholder(tf.int32, [batch], name="labels")
        legacy = tf.keras.optimizers.legacy
        opt = (legacy.Adam(1e-3) if optimizer == "adam"
               else legacy.SGD(0.01, momentum=0.9))
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], target_tensors=[labels])
        model._make_train_function()  # pylint: disable=protected-access
        train_op = model.train_function.updates_op
        loss = model.total_loss
        init_op = _v1.variables_initializer(_v1.global_variables(),
                                            name="init")
    # Keras' learning phase, when not baked in, is a placeholder with a
    # default: it is not fed.
    placeholders = [(inp, 0), (labels, classes)]
    return Built("resnet50", graph, train_op, loss, batch, init_op,
                 _feed_maker(placeholders, seed),
                 "Keras ResNet50 %dx%d, batch %d" % (image, image, batch))


def _variable(name, shape, stddev):
    return _v1.get_variable(
        name, shape, initializer=_v1.truncated_normal_initializer(
            stddev=stddev), use_resource=True)


def _conv3d(x, filters, name):
    with _v1.variable_scope(name):
        cin = int(x.shape[-1])
        w = _variable("kernel", [3, 3, 3, cin, filters],
                      (2.0 / (27 * cin)) ** 0.5)
        b = _v1.get_variable("bias", [filters],
                             initializer=_v1.zeros_initializer(),
                             use_resource=True)
        return tf.nn.relu(tf.nn.conv3d(x, w, [1] * 5, "SAME") + b)


def unet3d(volume=64, batch=1, base_filters=16, depth=4, channels=1,
           seed=0):
    """A 3D U-Net for voxel-wise binary segmentation, momentum SGD.

    Args:
      volume: input depth, height and width; a multiple of 2**(depth-1).
      batch: batch size.
      base_filters: filters at the top level, doubled per level down.
      depth: resolution levels.
      channels: input channels.
      seed: seed for weights and data.

    Returns:
      A `Built`.
    """
    step = 2 ** (depth - 1)
    if volume % step:
        raise ValueError("volume must be a multiple of %d for depth %d; got "
                         "%d" % (step, depth, volume))
    graph = tf.Graph()
    with graph.as_default():
        _v1.set_random_seed(seed)
        shape = [batch, volume, volume, volume]
        x = _v1.placeholder(tf.float32, shape + [channels], name="x")
        y = _v1.placeholder(tf.float32, shape + [1], name="y")
        h, skips = x, []
        for level in range(depth):
            filters = base_filters * 2 ** level
            h = _conv3d(h, filters, "down%d_a" % level)
            h = _conv3d(h, filters, "down%d_b" % level)
            if level < depth - 1:
                skips.append(h)
                h = tf.nn.max_pool3d(h, 2, 2, "VALID", name="pool%d" % level)
        for level in reversed(range(depth - 1)):
            filters = base_filters * 2 ** level
            skip = skips[level]
            with _v1.variable_scope("up%d" % level):
                w = _variable("kernel", [2, 2, 2, filters, int(h.shape[-1])],
                              0.05)
                h = tf.nn.conv3d_transpose(h, w, output_shape=skip.shape,
                                           strides=[1, 2, 2, 2, 1])
            h = tf.concat([h, skip], axis=-1, name="concat%d" % level)
            h = _conv3d(h, filters, "up%d_a" % level)
            h = _conv3d(h, filters, "up%d_b" % level)
        with _v1.variable_scope("head"):
            w = _variable("kernel", [1, 1, 1, int(h.shape[-1]), 1], 0.05)
            logits = tf.nn.conv3d(h, w, [1] * 5, "SAME")
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=y, logits=logits), name="loss")
        train_op = _v1.train.MomentumOptimizer(0.01, 0.9).minimize(
            loss, name="train")
        init_op = _v1.variables_initializer(_v1.global_variables(),
                                            name="init")
    make = _feed_maker([(x, 0), (y, 0)], seed)
    return Built("unet3d", graph, train_op, loss, batch, init_op, make,
                 "3D U-Net %d^3, %d filters, depth %d, batch %d"
                 % (volume, base_filters, depth, batch))


def _dense(x, units, name, bias=True):
    with _v1.variable_scope(name):
        w = _variable("kernel", [int(x.shape[-1]), units],
                      (1.0 / int(x.shape[-1])) ** 0.5)
        y = tf.tensordot(x, w, axes=[[x.shape.ndims - 1], [0]])
        if bias:
            y += _v1.get_variable("bias", [units],
                                  initializer=_v1.zeros_initializer(),
                                  use_resource=True)
        return y


def _layer_norm(x, name):
    with _v1.variable_scope(name):
        d = int(x.shape[-1])
        gamma = _v1.get_variable("gamma", [d], use_resource=True,
                                 initializer=_v1.ones_initializer())
        beta = _v1.get_variable("beta", [d], use_resource=True,
                                initializer=_v1.zeros_initializer())
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-6) * gamma + beta


def transformer(layers=12, seq=512, d_model=512, heads=8, batch=4,
                classes=10, seed=0):
    """A post-norm Transformer encoder classifier, trained with Adam.

    Args:
      layers: encoder layers.
      seq: sequence length.
      d_model: model width (divisible by `heads`).
      heads: attention heads.
      batch: batch size.
      classes: output classes.
      seed: seed for weights and data.

    Returns:
      A `Built`.
    """
    if d_model % heads:
        raise ValueError("d_model must be divisible by heads; got d_model=%d "
                         "heads=%d" % (d_model, heads))
    depth = d_model // heads
    graph = tf.Graph()
    with graph.as_default():
        _v1.set_random_seed(seed)
        x = _v1.placeholder(tf.float32, [batch, seq, d_model], name="x")
        y = _v1.placeholder(tf.int32, [batch], name="y")

        def split(t):
            t = tf.reshape(t, [batch, seq, heads, depth])
            return tf.transpose(t, [0, 2, 1, 3])

        h = x + _variable("position", [seq, d_model], 0.02)
        for i in range(layers):
            with _v1.variable_scope("layer%d" % i):
                q = split(_dense(h, d_model, "q"))
                k = split(_dense(h, d_model, "k", bias=False))
                v = split(_dense(h, d_model, "v"))
                scores = tf.matmul(q, k, transpose_b=True) / float(
                    np.sqrt(depth))
                ctx = tf.matmul(tf.nn.softmax(scores, axis=-1), v)
                ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]),
                                 [batch, seq, d_model])
                h = _layer_norm(h + _dense(ctx, d_model, "o"), "ln1")
                ff = tf.nn.relu(_dense(h, 4 * d_model, "ff1"))
                h = _layer_norm(h + _dense(ff, d_model, "ff2"), "ln2")
        logits = _dense(tf.reduce_mean(h, axis=1), classes, "logits")
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                           logits=logits),
            name="loss")
        train_op = _v1.train.AdamOptimizer(1e-4).minimize(loss, name="train")
        init_op = _v1.variables_initializer(_v1.global_variables(),
                                            name="init")
    make = _feed_maker([(x, 0), (y, classes)], seed)
    return Built("transformer", graph, train_op, loss, batch, init_op, make,
                 "Transformer encoder, %d layers, seq %d, d_model %d, "
                 "batch %d" % (layers, seq, d_model, batch))


def _node(graph_def, name, op, inputs=(), **attrs):
    node = graph_def.node.add()
    node.name = name
    node.op = op
    node.input.extend(inputs)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)
    return name


def _attr(**kwargs):
    return tf.compat.v1.AttrValue(**kwargs)


def layered_graph_def(num_ops=10000, width=256, batch=64):
    """GraphDef of a synthetic MLP training step with about `num_ops` ops.

    Layer ``i`` is ``h_i = Relu(BiasAdd(MatMul(h_{i-1}, W_i), b_i))`` with
    resource variables; the backward pass, in reverse layer order, has
    ``ReluGrad`` (reads ``h_i``), ``BiasAddGrad``, the weight gradient
    ``MatMul(h_{i-1}, g, transpose_a)`` (reads ``h_{i-1}``), the input
    gradient and two ``ResourceApplyGradientDescent`` updates; a ``NoOp``
    groups the updates. That is 13 ops per layer, one of which (``h_i``) is
    a large activation read again by the backward pass: the proportion of
    swap candidates in real training graphs (ResNet50 has a few per cent).
    Built as a protobuf and imported, which is much faster than building
    200,000 ops through the Python op wrappers.

    Args:
      num_ops: approximate number of ops.
      width: features per layer (weights are width x width).
      batch: rows of every activation.

    Returns:
      A `GraphDef`.
    """
    layers = max(2, (num_ops - 8) // 13)
    gd = tf.compat.v1.GraphDef()
    f32 = _attr(type=tf.float32.as_datatype_enum)
    shape_x = _attr(shape=tf.TensorShape([batch, width]).as_proto())
    x = _node(gd, "x", "Placeholder", dtype=f32, shape=shape_x)
    lr = _node(gd, "lr", "Const", dtype=f32,
               value=_attr(tensor=tf.make_tensor_proto(0.01, tf.float32)))
    handles, reads, hs = [], [], [x]
    for i in range(layers):
        w = _node(gd, "l%d/w" % i, "VarHandleOp", dtype=f32,
                  shape=_attr(shape=tf.TensorShape([width, width]).as_proto()),
                  shared_name=_attr(s=b"l%d/w" % i))
        b = _node(gd, "l%d/b" % i, "VarHandleOp", dtype=f32,
                  shape=_attr(shape=tf.TensorShape([width]).as_proto()),
                  shared_name=_attr(s=b"l%d/b" % i))
        rw = _node(gd, "l%d/w/read" % i, "ReadVariableOp", [w], dtype=f32)
        rb = _node(gd, "l%d/b/read" % i, "ReadVariableOp", [b], dtype=f32)
        mm = _node(gd, "l%d/MatMul" % i, "MatMul", [hs[-1], rw], T=f32)
        ba = _node(gd, "l%d/BiasAdd" % i, "BiasAdd", [mm, rb], T=f32)
        hs.append(_node(gd, "l%d/Relu" % i, "Relu", [ba], T=f32))
        handles.append((w, b))
        reads.append(rw)
    loss = _node(gd, "loss", "Sum", [hs[-1], _node(
        gd, "axes", "Const", dtype=_attr(type=tf.int32.as_datatype_enum),
        value=_attr(tensor=tf.make_tensor_proto([0, 1], tf.int32)))], T=f32,
                 Tidx=_attr(type=tf.int32.as_datatype_enum))
    grad = _node(gd, "grad/loss", "OnesLike", [hs[-1]], T=f32)
    updates = []
    for i in reversed(range(layers)):
        g = _node(gd, "grad/l%d/ReluGrad" % i, "ReluGrad", [grad, hs[i + 1]],
                  T=f32)
        gb = _node(gd, "grad/l%d/BiasAddGrad" % i, "BiasAddGrad", [g], T=f32)
        gw = _node(gd, "grad/l%d/MatMul_w" % i, "MatMul", [hs[i], g], T=f32,
                   transpose_a=_attr(b=True))
        grad = _node(gd, "grad/l%d/MatMul_x" % i, "MatMul", [g, reads[i]],
                     T=f32, transpose_b=_attr(b=True))
        w, b = handles[i]
        updates.append(_node(gd, "train/l%d/w" % i,
                             "ResourceApplyGradientDescent", [w, lr, gw],
                             T=f32))
        updates.append(_node(gd, "train/l%d/b" % i,
                             "ResourceApplyGradientDescent", [b, lr, gb],
                             T=f32))
    _node(gd, "train", "NoOp", ["^" + u for u in updates] + ["^" + loss])
    return gd


def layered(num_ops=10000, width=256, batch=64, seed=0):
    """A synthetic MLP training graph of about `num_ops` ops.

    See `layered_graph_def`; the GraphDef is imported into a new graph.

    Returns:
      A `Built` (variables are not initialized: the graph is for rewrite
      timing, not for running).
    """
    del seed
    gd = layered_graph_def(num_ops, width, batch)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    train_op = graph.get_operation_by_name("train")
    loss = graph.get_tensor_by_name("loss:0")
    x = graph.get_tensor_by_name("x:0")
    layers = (len(gd.node) - 4) // 13
    return Built("layered", graph, train_op, loss, batch, None,
                 _feed_maker([(x, 0)], 0),
                 "synthetic MLP step, %d layers of %d" % (layers, width))


# Ops the training graph of `deep_mlp` has per layer: MatMul, BiasAdd,
# Relu; ReluGrad, BiasAddGrad, two MatMuls and two gradient tuples (a NoOp
# and two Identity ops each); two ApplyGradientDescent; two VariableV2, their
# Assign and read Identity.
DEEP_MLP_OPS_PER_LAYER = 21
# Placeholders, shared initial values, loss and its gradient, train, init.
_DEEP_MLP_FIXED_OPS = 27


def deep_mlp_layers(num_ops):
    """Layers of the `deep_mlp` with about `num_ops` ops."""
    return max(2, (num_ops - _DEEP_MLP_FIXED_OPS) // DEEP_MLP_OPS_PER_LAYER)


def deep_mlp(num_ops=10000, width=32, batch=32, seed=0):
    """A deep, narrow MLP trained with SGD, of about `num_ops` ops.

    Built op by op with ``tf.compat.v1`` as a TF1 user would: layer ``i`` is
    ``relu(bias_add(matmul(h, kernel_i), bias_i))`` on reference variables,
    the loss a mean squared error, the step
    ``tf.compat.v1.train.GradientDescentOptimizer.minimize``. Every
    activation is ``batch x width`` (4 KiB by default): the graph has one
    level per op of the long forward and backward chains and thousands of
    equally small swap candidates, so the planner's per-level and
    per-candidate work dominates, not any one large tensor. All kernels start
    from one shared initial value (which keeps the graph small to build;
    the values do not matter for planning).

    Args:
      num_ops: approximate number of ops (see `deep_mlp_layers`).
      width: features per layer.
      batch: rows of every activation.
      seed: seed for the shared initial kernel and the data.

    Returns:
      A `Built`.
    """
    layers = deep_mlp_layers(num_ops)
    graph = tf.Graph()
    with graph.as_default():
        _v1.set_random_seed(seed)
        x = _v1.placeholder(tf.float32, [batch, width], name="x")
        y = _v1.placeholder(tf.float32, [batch, width], name="y")
        rng = np.random.RandomState(seed)
        kernel0 = tf.constant(
            rng.standard_normal((width, width)).astype(np.float32)
            / np.sqrt(width), name="kernel_init")
        bias0 = tf.zeros([width], name="bias_init")
        h = x
        for i in range(layers):
            with _v1.variable_scope("dense%d" % i):
                w = _v1.get_variable("kernel", initializer=kernel0,
                                     use_resource=False)
                b = _v1.get_variable("bias", initializer=bias0,
                                     use_resource=False)
                h = tf.nn.relu(tf.nn.bias_add(tf.matmul(h, w), b))
        loss = tf.reduce_mean(tf.square(h - y), name="loss")
        train_op = _v1.train.GradientDescentOptimizer(0.01).minimize(
            loss, name="train")
        init_op = _v1.variables_initializer(_v1.global_variables(),
                                            name="init")
    return Built("deep_mlp", graph, train_op, loss, batch, init_op,
                 _feed_maker([(x, 0), (y, 0)], seed),
                 "deep narrow MLP, %d layers of %d, batch %d, SGD"
                 % (layers, width, batch))


BUILDERS = collections.OrderedDict([
    ("resnet50", resnet50),
    ("unet3d", unet3d),
    ("transformer", transformer),
    ("layered", layered),
    ("deep_mlp", deep_mlp),
])

# The argument a capacity search grows, per builder and dimension.
_SIZE_ARGS = {"image": "image", "volume": "volume", "batch": "batch",
              "seq": "seq"}


def size_key(dimension):
    """Builder keyword for a capacity dimension ('image', 'volume', ...)."""
    try:
        return _SIZE_ARGS[dimension]
    except KeyError:
        raise ValueError("unknown dimension %r; use one of %s"
                         % (dimension, sorted(_SIZE_ARGS))) from None


def build(name, **kwargs):
    """Build model `name` from `BUILDERS` with keyword arguments."""
    try:
        builder = BUILDERS[name]
    except KeyError:
        raise ValueError("unknown model %r; use one of %s"
                         % (name, list(BUILDERS))) from None
    return builder(**kwargs)
