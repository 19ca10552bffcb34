"""The model zoo: real training graphs for the tests and the benchmarks.

One builder per model family, used by ``tests/`` (small sizes, exact
numerics) and by ``benchmarks/models.py`` (large sizes, which wraps each
graph in its own ``tf.Graph`` for timing and memory measurements). It is not
part of the ``tflms`` package.

Every builder adds one training step to the *current default graph*, in
``tf.compat.v1`` graph mode, and returns a `Model`. The caller owns the graph
(``with tf.Graph().as_default():``) and must already have called
``tf.compat.v1.disable_eager_execution()``; builders never flip process-wide
switches.

Determinism: each builder sets the graph-level seed of the graph it builds in
and passes explicit op seeds to every initializer it creates, and the feed
data come from ``numpy.random.RandomState(seed)``. Two builds with the same
arguments in fresh graphs therefore start from identical weights and see
identical data, which lets tests compare a graph rewritten by LMS with an
untouched twin. The feed is drawn only when ``Model.inputs`` is first read,
so a graph too large to run (a benchmark's capacity search) can still be
built and measured. Keras models whose layers we do not construct ourselves
(``tf.keras.applications``) draw unseeded initializer seeds from Keras' seed
generator; the builders pin that generator to ``seed`` for the duration of the
build only.

All placeholders have fully defined shapes, which the memory oracle needs.
"""

import contextlib
import dataclasses
import random
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

__all__ = [
    "Model",
    "BUILDERS",
    "mlp",
    "cnn_bn",
    "cnn_bias",
    "keras_resnet",
    "keras_resnet50",
    "lstm",
    "unet3d",
    "transformer_encoder",
]

_v1 = tf.compat.v1


@dataclasses.dataclass
class Model:
    """A training graph built by one of the builders.

    Attributes:
      name: short model name.
      loss: scalar loss tensor.
      train_op: the op that runs one training step (gradients, variable
        updates and, where present, batch-norm statistic updates).
      make_inputs: returns placeholder -> numpy array to feed for one step
        (read it through ``inputs``, which draws it once).
      variables: every global variable the model created (weights,
        optimizer slots, batch-norm statistics, Keras counters).
      init_op: initializes ``variables``.
      graph: the graph the model lives in.
      keras_model: the ``tf.keras.Model`` for the Keras builders, else None.
    """

    name: str
    loss: tf.Tensor
    train_op: tf.Operation
    make_inputs: Callable[[], Dict[tf.Tensor, np.ndarray]]
    variables: List[tf.Variable]
    init_op: tf.Operation
    graph: tf.Graph
    keras_model: Optional[object] = None
    _inputs: Optional[Dict[tf.Tensor, np.ndarray]] = dataclasses.field(
        default=None, init=False, repr=False)

    @property
    def inputs(self) -> Dict[tf.Tensor, np.ndarray]:
        """Placeholder -> numpy array to feed for one step (drawn once)."""
        if self._inputs is None:
            self._inputs = self.make_inputs()
        return self._inputs

    @property
    def feed_dict(self) -> Dict[tf.Tensor, np.ndarray]:
        """Feed dict for ``Session.run``."""
        return dict(self.inputs)

    @property
    def fetches(self) -> list:
        """``[train_op, loss]``: what one training step runs."""
        return [self.train_op, self.loss]


def _finish(name, loss, train_op, seed, draw_inputs,
            keras_model=None) -> Model:
    """Wraps a built step; `draw_inputs(rng)` makes the feed from a fresh
    ``RandomState(seed)``, so every read of it gives the same numbers."""
    graph = loss.graph
    with graph.as_default():
        variables = list(_v1.global_variables())
        init_op = _v1.variables_initializer(variables, name="init")
        # The step LMS finds (tflms.step): what these models' users fetch.
        for key, item in ((_v1.GraphKeys.TRAIN_OP, train_op),
                          (_v1.GraphKeys.LOSSES, loss)):
            if item not in _v1.get_collection(key):
                _v1.add_to_collection(key, item)
    return Model(name=name, loss=loss, train_op=train_op,
                 make_inputs=lambda: draw_inputs(np.random.RandomState(seed)),
                 variables=variables, init_op=init_op, graph=graph,
                 keras_model=keras_model)


class _Seeds:
    """Hands out distinct, reproducible op seeds derived from one seed."""

    def __init__(self, seed):
        self._base = int(seed) * 1000 + 1
        self._next = 0

    def __call__(self):
        self._next += 1
        return self._base + self._next

    def glorot(self):
        return _v1.glorot_uniform_initializer(seed=self())

    def normal(self, stddev):
        return _v1.truncated_normal_initializer(stddev=stddev, seed=self())


def _graph_seed(seed):
    # Per-graph seed: it only affects the graph being built.
    _v1.set_random_seed(seed)
    return _Seeds(seed)


def _variable(name, shape, initializer, resource=True):
    """A float32 variable: a resource variable, or with ``resource=False`` a
    TF1 reference variable (VariableV2, read through an Identity)."""
    return _v1.get_variable(name, shape=shape, dtype=tf.float32,
                            initializer=initializer, use_resource=resource)




def _classifier_inputs(x, y, classes):
    """Feed maker for a float input `x` and integer class labels `y`."""
    def draw(rng):
        return {x: rng.standard_normal(x.shape.as_list()).astype(np.float32),
                y: rng.randint(0, classes, size=y.shape.as_list()).astype(
                    np.int32)}
    return draw


def _sgd_after_updates(loss, learning_rate, global_step=None):
    """Plain SGD step that first runs the UPDATE_OPS (batch-norm moving
    statistics): the TF1 idiom, which makes them control inputs of the
    train op."""
    update_ops = _v1.get_collection(_v1.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
        return _v1.train.GradientDescentOptimizer(learning_rate).minimize(
            loss, global_step=global_step, name="train")


def _logits(h, classes, seeds, resource=True):
    """A dense layer from the features `h` (batch, n) to `classes` logits."""
    with _v1.variable_scope("logits"):
        w = _variable("kernel", [h.shape[-1], classes], seeds.glorot(),
                      resource)
        b = _variable("bias", [classes], tf.zeros_initializer(), resource)
        return tf.matmul(h, w) + b


def _classification_loss(logits, labels):
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                       logits=logits),
        name="loss")


# ---------------------------------------------------------------------------
# Raw TF models
# ---------------------------------------------------------------------------

def mlp(depth: int = 8, width: int = 256, batch: int = 32, seed: int = 0,
        classes: int = 10, learning_rate: float = 0.01,
        optimizer: str = "momentum",
        resource_variables: bool = True) -> Model:
    """A ReLU multilayer perceptron trained with momentum SGD or plain SGD.

    Args:
      depth: number of hidden layers.
      width: input and hidden width.
      batch: batch size.
      seed: seed for weights and data.
      classes: number of output classes.
      learning_rate: optimizer step size.
      optimizer: "momentum" (0.9) or "sgd" (plain gradient descent).
      resource_variables: False makes TF1 reference variables (VariableV2),
        what ``tf.compat.v1.get_variable`` gives under
        ``tf.compat.v1.disable_v2_behavior()``.

    Returns:
      A `Model`.
    """
    if optimizer not in ("momentum", "sgd"):
        raise ValueError("optimizer must be 'momentum' or 'sgd'; got %r"
                         % (optimizer,))
    seeds = _graph_seed(seed)
    with _v1.variable_scope("mlp"):
        x = _v1.placeholder(tf.float32, [batch, width], name="x")
        y = _v1.placeholder(tf.int32, [batch], name="y")
        h = x
        for i in range(depth):
            with _v1.variable_scope(f"dense{i}"):
                w = _variable("kernel", [width, width], seeds.glorot(),
                              resource_variables)
                b = _variable("bias", [width], tf.zeros_initializer(),
                              resource_variables)
                h = tf.nn.relu(tf.matmul(h, w) + b)
        logits = _logits(h, classes, seeds, resource_variables)
        loss = _classification_loss(logits, y)
        if optimizer == "sgd":
            opt = _v1.train.GradientDescentOptimizer(learning_rate)
        else:
            opt = _v1.train.MomentumOptimizer(learning_rate, momentum=0.9)
        train_op = opt.minimize(loss, name="train")
    return _finish("mlp", loss, train_op, seed,
                   _classifier_inputs(x, y, classes))


def _conv2d(x, filters, kernel, stride, seeds, name):
    with _v1.variable_scope(name):
        cin = x.shape[-1]
        w = _variable("kernel", [kernel, kernel, cin, filters], seeds.glorot())
        return tf.nn.conv2d(x, w, strides=stride, padding="SAME")


def cnn_bn(image: int = 32, channels: int = 16, depth: int = 4, batch: int = 8,
           seed: int = 0, classes: int = 10,
           learning_rate: float = 0.01) -> Model:
    """Conv + batch norm + ReLU blocks, trained with plain SGD.

    Batch norm is ``tf.compat.v1.layers.batch_normalization`` in training
    mode; its moving-statistics updates are control dependencies of the train
    op, as the TF1 idiom requires. Every other block halves the resolution.

    Args:
      image: input height and width.
      channels: filters of the first conv; doubled when the resolution halves.
      depth: number of conv/BN/ReLU blocks.
      batch: batch size.
      seed: seed for weights and data.
      classes: number of output classes.
      learning_rate: optimizer step size.

    Returns:
      A `Model`.
    """
    seeds = _graph_seed(seed)
    with _v1.variable_scope("cnn_bn"):
        x = _v1.placeholder(tf.float32, [batch, image, image, 3], name="x")
        y = _v1.placeholder(tf.int32, [batch], name="y")
        h = x
        filters = channels
        for i in range(depth):
            stride = 2 if i % 2 == 1 and h.shape[1] > 1 else 1
            if stride == 2:
                filters *= 2
            h = _conv2d(h, filters, 3, stride, seeds, f"conv{i}")
            h = _v1.layers.batch_normalization(h, training=True, name=f"bn{i}")
            h = tf.nn.relu(h)
        h = tf.reduce_mean(h, axis=[1, 2])
        logits = _logits(h, classes, seeds)
        loss = _classification_loss(logits, y)
        train_op = _sgd_after_updates(loss, learning_rate)
    return _finish("cnn_bn", loss, train_op, seed,
                   _classifier_inputs(x, y, classes))


def cnn_bias(image: int = 16, channels: int = 4, depth: int = 2,
             branches: int = 1, batch: int = 4, seed: int = 0,
             classes: int = 10, learning_rate: float = 0.05) -> Model:
    """Convs with biases, max pooling and a dense head, trained with SGD that
    counts a global step: the plain TF1 CNN of the MNIST tutorials.

    Its gradients are what oneDNN's graph pass rewrites most: each conv's
    `Conv2DBackpropFilter` and `BiasAddGrad` read the same gradient (through
    the ``tuple`` identities `tf.gradients` adds) and TensorFlow merges them
    at run time when oneDNN is on. With ``branches > 1`` every block has
    parallel convs (kernel sizes 1, 3, 5, ...) concatenated, then batch norm
    in training mode.

    Args:
      image: input height and width.
      channels: filters of each conv of the first block; doubled per block.
      depth: number of conv/pool blocks.
      branches: parallel convs per block.
      batch: batch size.
      seed: seed for weights and data.
      classes: number of output classes.
      learning_rate: optimizer step size.

    Returns:
      A `Model` whose ``variables`` include the global step.
    """
    seeds = _graph_seed(seed)
    with _v1.variable_scope("cnn_bias"):
        x = _v1.placeholder(tf.float32, [batch, image, image, 1], name="x")
        y = _v1.placeholder(tf.int32, [batch], name="y")
        h = x
        filters = channels
        for i in range(depth):
            outs = []
            for j in range(branches):
                outs.append(_v1.layers.conv2d(
                    h, filters, 2 * j + 1, padding="same",
                    activation=tf.nn.relu, kernel_initializer=seeds.glorot(),
                    name=f"conv{i}_{j}"))
            h = outs[0] if branches == 1 else tf.concat(outs, -1)
            if branches > 1:
                h = _v1.layers.batch_normalization(h, training=True,
                                                   name=f"bn{i}")
            if h.shape[1] > 1:
                h = _v1.layers.max_pooling2d(h, 2, 2, name=f"pool{i}")
            filters *= 2
        h = _v1.layers.flatten(h)
        h = _v1.layers.dense(h, 16, activation=tf.nn.relu,
                             kernel_initializer=seeds.glorot(), name="dense")
        logits = _v1.layers.dense(h, classes,
                                  kernel_initializer=seeds.glorot(),
                                  name="logits")
        loss = _classification_loss(logits, y)
        global_step = _v1.train.get_or_create_global_step()
        train_op = _sgd_after_updates(loss, learning_rate, global_step)
    return _finish("cnn_bias", loss, train_op, seed,
                   _classifier_inputs(x, y, classes))


def lstm(steps: int = 10, units: int = 32, batch: int = 4, seed: int = 0,
         features: Optional[int] = None, classes: int = 10,
         swap_memory: bool = False, unroll: bool = False,
         learning_rate: float = 0.01) -> Model:
    """A one-layer LSTM over a sequence, run by ``dynamic_rnn``.

    With TF2 control flow (the default even under
    ``disable_eager_execution``) ``dynamic_rnn`` becomes one functional
    ``While`` op, whose per-step tensors are invisible to graph rewriting and
    for which ``swap_memory`` has no effect. ``unroll=True`` builds the same
    cell with ``static_rnn`` instead: one op group per step, the shape LMS
    can work on.

    Args:
      steps: sequence length.
      units: LSTM state size.
      batch: batch size.
      seed: seed for weights and data.
      features: input features per step (default ``units``).
      classes: number of output classes (read from the last output).
      swap_memory: passed to ``tf.compat.v1.nn.dynamic_rnn``.
      unroll: use ``tf.compat.v1.nn.static_rnn`` instead of ``dynamic_rnn``.
      learning_rate: optimizer step size.

    Returns:
      A `Model`.
    """
    features = units if features is None else features
    seeds = _graph_seed(seed)
    with _v1.variable_scope("lstm"):
        x = _v1.placeholder(tf.float32, [batch, steps, features], name="x")
        y = _v1.placeholder(tf.int32, [batch], name="y")
        cell = _v1.nn.rnn_cell.LSTMCell(units, initializer=seeds.glorot(),
                                        name="cell")
        if unroll:
            outputs, _ = _v1.nn.static_rnn(cell, tf.unstack(x, axis=1),
                                           dtype=tf.float32)
            last = outputs[-1]
        else:
            outputs, _ = _v1.nn.dynamic_rnn(cell, x, dtype=tf.float32,
                                            swap_memory=swap_memory)
            last = outputs[:, -1, :]
        logits = _logits(last, classes, seeds)
        loss = _classification_loss(logits, y)
        train_op = _v1.train.GradientDescentOptimizer(learning_rate).minimize(
            loss, name="train")
    return _finish("lstm", loss, train_op, seed,
                   _classifier_inputs(x, y, classes))


def _conv3d(x, filters, seeds, name, kernel=3):
    with _v1.variable_scope(name):
        cin = x.shape[-1]
        w = _variable("kernel", [kernel] * 3 + [cin, filters], seeds.glorot())
        b = _variable("bias", [filters], tf.zeros_initializer())
        return tf.nn.relu(
            tf.nn.conv3d(x, w, strides=[1] * 5, padding="SAME") + b)


def unet3d(volume: int = 16, base_filters: int = 4, depth: int = 3,
           batch: int = 1, seed: int = 0, channels: int = 1,
           learning_rate: float = 0.01) -> Model:
    """A small 3D U-Net for voxel-wise binary segmentation.

    Encoder levels are two 3x3x3 convs followed by 2x max pooling; decoder
    levels upsample with a strided transposed conv, concatenate the skip
    connection and apply two convs. Long-lived skip tensors make this the
    classic LMS workload.

    Args:
      volume: input depth, height and width; divisible by ``2**(depth-1)``.
      base_filters: filters at the top level, doubled per level.
      depth: number of resolution levels.
      batch: batch size.
      seed: seed for weights and data.
      channels: input channels.
      learning_rate: optimizer step size.

    Returns:
      A `Model`.
    """
    if volume % (2 ** (depth - 1)):
        raise ValueError(f"volume {volume} not divisible by 2**{depth - 1}")
    seeds = _graph_seed(seed)
    shape = [batch, volume, volume, volume]
    with _v1.variable_scope("unet3d"):
        x = _v1.placeholder(tf.float32, shape + [channels], name="x")
        y = _v1.placeholder(tf.float32, shape + [1], name="y")
        h, skips = x, []
        for level in range(depth):
            filters = base_filters * 2 ** level
            h = _conv3d(h, filters, seeds, f"down{level}_a")
            h = _conv3d(h, filters, seeds, f"down{level}_b")
            if level < depth - 1:
                skips.append(h)
                h = tf.nn.max_pool3d(h, ksize=2, strides=2, padding="VALID",
                                     name=f"pool{level}")
        for level in reversed(range(depth - 1)):
            filters = base_filters * 2 ** level
            skip = skips[level]
            with _v1.variable_scope(f"up{level}"):
                w = _variable("kernel", [2, 2, 2, filters, h.shape[-1]],
                              seeds.glorot())
                h = tf.nn.conv3d_transpose(h, w, output_shape=skip.shape,
                                           strides=[1, 2, 2, 2, 1])
            h = tf.concat([h, skip], axis=-1, name=f"concat{level}")
            h = _conv3d(h, filters, seeds, f"up{level}_a")
            h = _conv3d(h, filters, seeds, f"up{level}_b")
        with _v1.variable_scope("head"):
            w = _variable("kernel", [1, 1, 1, h.shape[-1], 1], seeds.glorot())
            logits = tf.nn.conv3d(h, w, strides=[1] * 5, padding="SAME")
        loss = tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits),
            name="loss")
        train_op = _v1.train.MomentumOptimizer(learning_rate, 0.9).minimize(
            loss, name="train")

    def draw(rng):
        return {x: rng.standard_normal(shape + [channels]).astype(np.float32),
                y: (rng.random_sample(shape + [1]) > 0.5).astype(np.float32)}
    return _finish("unet3d", loss, train_op, seed, draw)


def _layer_norm(x, name):
    with _v1.variable_scope(name):
        d = x.shape[-1]
        gamma = _variable("gamma", [d], tf.ones_initializer())
        beta = _variable("beta", [d], tf.zeros_initializer())
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-6) * gamma + beta


def _dense(x, units, seeds, name, bias=True):
    with _v1.variable_scope(name):
        w = _variable("kernel", [x.shape[-1], units], seeds.glorot())
        y = tf.tensordot(x, w, axes=[[x.shape.ndims - 1], [0]])
        if bias:
            y += _variable("bias", [units], tf.zeros_initializer())
        return y


def transformer_encoder(layers: int = 4, seq: int = 64, d_model: int = 64,
                        heads: int = 4, batch: int = 2, seed: int = 0,
                        ffn_mult: int = 4, classes: int = 10,
                        learning_rate: float = 1e-3) -> Model:
    """A post-norm Transformer encoder built from raw TF ops, trained with
    Adam.

    Each layer is multi-head self-attention (explicit Q/K/V projections,
    scaled dot product, softmax) and a ReLU feed-forward block, each with a
    residual connection and layer norm. The loss classifies the mean-pooled
    sequence.

    Args:
      layers: number of encoder layers.
      seq: sequence length.
      d_model: model width; divisible by ``heads``.
      heads: attention heads.
      batch: batch size.
      seed: seed for weights and data.
      ffn_mult: feed-forward width as a multiple of ``d_model``.
      classes: number of output classes.
      learning_rate: Adam step size.

    Returns:
      A `Model`.
    """
    if d_model % heads:
        raise ValueError(f"d_model {d_model} not divisible by heads {heads}")
    depth = d_model // heads
    seeds = _graph_seed(seed)

    def split_heads(t):
        t = tf.reshape(t, [batch, seq, heads, depth])
        return tf.transpose(t, [0, 2, 1, 3])

    with _v1.variable_scope("transformer"):
        x = _v1.placeholder(tf.float32, [batch, seq, d_model], name="x")
        y = _v1.placeholder(tf.int32, [batch], name="y")
        pos = _variable("position", [seq, d_model], seeds.normal(0.02))
        h = x + pos
        for i in range(layers):
            with _v1.variable_scope(f"layer{i}"):
                q = split_heads(_dense(h, d_model, seeds, "q"))
                # No key bias: it adds the same score to every key, which
                # softmax cancels, so its gradient is pure rounding noise
                # that Adam would blow up into visible weight changes.
                k = split_heads(_dense(h, d_model, seeds, "k", bias=False))
                v = split_heads(_dense(h, d_model, seeds, "v"))
                scores = (tf.matmul(q, k, transpose_b=True)
                          / float(np.sqrt(depth)))
                attn = tf.nn.softmax(scores, axis=-1)
                ctx = tf.transpose(tf.matmul(attn, v), [0, 2, 1, 3])
                ctx = tf.reshape(ctx, [batch, seq, d_model])
                h = _layer_norm(h + _dense(ctx, d_model, seeds, "o"), "ln1")
                ff = tf.nn.relu(_dense(h, ffn_mult * d_model, seeds, "ff1"))
                h = _layer_norm(h + _dense(ff, d_model, seeds, "ff2"), "ln2")
        logits = _dense(tf.reduce_mean(h, axis=1), classes, seeds, "logits")
        loss = _classification_loss(logits, y)
        train_op = _v1.train.AdamOptimizer(learning_rate).minimize(
            loss, name="train")
    return _finish("transformer_encoder", loss, train_op, seed,
                   _classifier_inputs(x, y, classes))


# ---------------------------------------------------------------------------
# Keras models
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def _keras_build_scope(seed, baked=True):
    """Pins Keras' unseeded-initializer seeds and training mode, then restores.

    Keras initializers without a seed draw one from a thread-local generator
    (or Python's ``random``); pinning it makes ``tf.keras.applications``
    models reproducible. Building inside ``learning_phase_scope(1)``
    (`baked`) bakes training-mode batch norm into the graph instead of a
    ``cond`` on the ``keras_learning_phase`` placeholder.
    """
    from tflms.tf import compat
    try:
        keras_backend = compat.keras2_backend()
        holder = keras_backend._SEED_GENERATOR
    except (ImportError, AttributeError, compat.UnsupportedStackError):
        holder = None
    py_state = random.getstate()
    had = holder is not None and hasattr(holder, "generator")
    previous = (getattr(holder, "generator", None) if holder is not None
                else None)
    if holder is not None:
        holder.generator = random.Random(seed)
    random.seed(seed)
    try:
        if baked:
            with tf.keras.backend.learning_phase_scope(1):
                yield
        else:
            yield
    finally:
        random.setstate(py_state)
        if holder is not None:
            if had:
                holder.generator = previous
            else:
                del holder.generator


# Keras 2 legacy optimizers by name: the graph-mode train function needs
# them (the TF2 optimizers have no `get_updates`).
_KERAS_OPTIMIZERS = {
    "sgd": lambda lr: tf.keras.optimizers.legacy.SGD(lr),
    "momentum": lambda lr: tf.keras.optimizers.legacy.SGD(lr, momentum=0.9),
    "adam": lambda lr: tf.keras.optimizers.legacy.Adam(lr),
}


def _keras_training(model, inp, labels, name, seed, classes, learning_rate,
                    optimizer="sgd", metrics=()):
    try:
        make_optimizer = _KERAS_OPTIMIZERS[optimizer]
    except KeyError:
        raise ValueError(
            "optimizer must be one of %s; got %r"
            % (", ".join(sorted(_KERAS_OPTIMIZERS)), optimizer)) from None
    model.compile(optimizer=make_optimizer(learning_rate),
                  loss="sparse_categorical_crossentropy",
                  metrics=list(metrics) or None, target_tensors=[labels])
    model._make_train_function()
    function = model.train_function
    train_op = function.updates_op
    loss = model.total_loss
    return _finish(name, loss, train_op, seed,
                   _classifier_inputs(inp, labels, classes),
                   keras_model=model)


def _keras_block(h, filters, stride, seeds, name):
    layers = tf.keras.layers

    def conv(t, f, k, s, suffix):
        return layers.Conv2D(
            f, k, strides=s, padding="same", use_bias=False,
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seeds()),
            name=f"{name}_{suffix}")(t)

    shortcut = h
    out = conv(h, filters, 3, stride, "conv1")
    out = layers.BatchNormalization(name=f"{name}_bn1")(out)
    out = layers.ReLU(name=f"{name}_relu1")(out)
    out = conv(out, filters, 3, 1, "conv2")
    out = layers.BatchNormalization(name=f"{name}_bn2")(out)
    if stride != 1 or h.shape[-1] != filters:
        shortcut = conv(h, filters, 1, stride, "proj")
        shortcut = layers.BatchNormalization(name=f"{name}_proj_bn")(shortcut)
    out = layers.Add(name=f"{name}_add")([out, shortcut])
    return layers.ReLU(name=f"{name}_out")(out)


def keras_resnet(image: int = 32, batch: int = 2, seed: int = 0,
                 blocks: Sequence[int] = (2, 2, 2), filters: int = 16,
                 classes: int = 10, learning_rate: float = 0.01) -> Model:
    """A ResNet-style Keras functional model (basic residual blocks).

    Stage ``i`` has ``blocks[i]`` blocks of two 3x3 conv + BN, with ``filters *
    2**i`` filters; each stage after the first starts with stride 2 and a
    projection shortcut. Trained through Keras' own graph-mode train function
    with the legacy SGD optimizer.

    Args:
      image: input height and width.
      batch: batch size (fixed in the input layer).
      seed: seed for weights and data.
      blocks: residual blocks per stage.
      filters: filters of the stem and first stage.
      classes: number of output classes.
      learning_rate: SGD step size.

    Returns:
      A `Model` with ``keras_model`` set.
    """
    seeds = _graph_seed(seed)
    layers = tf.keras.layers
    with _keras_build_scope(seed):
        inp = tf.keras.Input(shape=(image, image, 3), batch_size=batch,
                             name="image")
        h = layers.Conv2D(
            filters, 3, padding="same", use_bias=False,
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seeds()),
            name="stem_conv")(inp)
        h = layers.BatchNormalization(name="stem_bn")(h)
        h = layers.ReLU(name="stem_relu")(h)
        for stage, count in enumerate(blocks):
            for b in range(count):
                stride = 2 if stage > 0 and b == 0 else 1
                h = _keras_block(h, filters * 2 ** stage, stride, seeds,
                                 f"stage{stage}_block{b}")
        h = layers.GlobalAveragePooling2D(name="pool")(h)
        out = layers.Dense(
            classes, activation="softmax",
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seeds()),
            name="predictions")(h)
        model = tf.keras.Model(inp, out, name="keras_resnet")
        labels = _v1.placeholder(tf.int32, [batch], name="labels")
        return _keras_training(model, inp, labels, "keras_resnet", seed,
                               classes, learning_rate)


def keras_resnet50(image: int = 64, batch: int = 1, seed: int = 0,
                   classes: int = 10, learning_rate: float = 0.01,
                   learning_phase: str = "baked", optimizer: str = "sgd",
                   metrics: Sequence[str] = ()) -> Model:
    """``tf.keras.applications.ResNet50(weights=None)`` with a training step.

    Args:
      image: input height and width (at least 32).
      batch: batch size (fixed in the input layer).
      seed: seed for weights and data.
      classes: number of output classes.
      learning_rate: optimizer step size.
      learning_phase: "baked" (training-mode batch norm, no conds) or
        "placeholder" (Keras' learning-phase conds, the graph
        ``model.fit`` builds; the phase has a default and need not be fed).
      optimizer: Keras legacy optimizer: "sgd", "momentum" (SGD with
        momentum 0.9) or "adam".
      metrics: passed to ``compile`` (their ops join the train step).

    Returns:
      A `Model` with ``keras_model`` set.
    """
    if learning_phase not in ("baked", "placeholder"):
        raise ValueError("learning_phase must be 'baked' or 'placeholder'; "
                         "got %r" % (learning_phase,))
    _graph_seed(seed)
    with _keras_build_scope(seed, baked=learning_phase == "baked"):
        inp = tf.keras.Input(shape=(image, image, 3), batch_size=batch,
                             name="image")
        model = tf.keras.applications.ResNet50(weights=None, input_tensor=inp,
                                               classes=classes)
        labels = _v1.placeholder(tf.int32, [batch], name="labels")
        return _keras_training(model, inp, labels, "keras_resnet50", seed,
                               classes, learning_rate, optimizer, metrics)


BUILDERS = {
    "mlp": mlp,
    "cnn_bn": cnn_bn,
    "cnn_bias": cnn_bias,
    "keras_resnet": keras_resnet,
    "keras_resnet50": keras_resnet50,
    "lstm": lstm,
    "unet3d": unet3d,
    "transformer_encoder": transformer_encoder,
}
