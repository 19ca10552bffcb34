"""Training graphs the benchmarks measure, each built in its own `tf.Graph`.

Every builder returns a `Built`: the graph, the op one training step runs,
the batch size, a feed of random inputs (made only when asked, so that
graphs too large to run can still be measured) and the variable
initializer. Shapes are fully static, which the Grappler oracle needs.

The real models come from the model zoo the tests use (`zoo.models`), at
benchmark sizes:

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
* `mlp`: a ReLU MLP with plain SGD and resource or TF1 reference variables
  (the simulator-fidelity case of issue 15).
* `layered`: a synthetic graph of about ``num_ops`` ops shaped like a
  training step (a forward pass of layers and a mirrored backward pass that
  reads every forward activation again), for graph-size scaling.
* `keras_app`: a Keras application (``tf.keras.applications``, written by
  the Keras team, not by this project) used as a layer library in a Session
  graph, the TF1 pattern of issue 22: the model is built on its own input
  (Keras keeps that symbolic forward pass in the graph, a branch the step
  never runs), called with ``training=True`` on placeholders, and trained by
  ``MomentumOptimizer.minimize`` on its trainable weights.
* `keras3_app`: a Keras 3 application (``keras.applications``) compiled as
  ``fit()`` trains it (momentum SGD, sparse categorical cross entropy) and
  its ``train_step`` traced by ``tf.function`` for one batch: the graph is
  the concrete function's `FuncGraph` (TensorFlow 2.16+ with Keras 3, in
  eager mode), planned and rewritten as `tflms.tf.lms_function` does
  (`Built.function`).
* `unet3d_recipe`: the 3D U-Net of the PyPI package segmentation-models-3D
  (ZFTurbo's Keras recipe, ``segmentation_models_3D.Unet`` on a 3D ResNet
  encoder of classification-models-3D), written by others, in the same
  Session pattern as `keras_app`; the package is imported only when this
  builder runs (`SM3D_INSTALL` says how to install it).
* `deep_mlp`: a deep, narrow MLP of about ``num_ops`` ops built with the
  TF1 API (dense layers with bias and ReLU, plain SGD): thousands of levels
  with a small tensor at each, the shape that stresses planning the most.

This module turns nothing on globally; the caller picks eager/graph mode.
"""

import collections
import dataclasses
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from zoo import models as zoo

__all__ = ["Built", "BUILDERS", "build", "resnet50", "keras_app",
           "keras3_app", "unet3d", "unet3d_recipe", "SM3D_INSTALL",
           "transformer", "mlp", "layered", "deep_mlp", "size_key",
           "build_sized", "KERAS_APPS"]

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
      function: for a `tf.function`'s step (`keras3_app`): its concrete
        function and model, kept alive while the graph is measured (the
        graph reads the model's variables through captured handles);
        `graph` is then the function graph, indexed and rewritten as
        `tflms.tf.lms_function` does (`measure.step_index`,
        `measure.apply_tflms`), and `train_op` a NoOp beside the function's
        outputs that runs its step (for the oracle). None for a Session
        graph.
    """

    name: str
    graph: tf.Graph
    train_op: tf.Operation
    loss: tf.Tensor
    batch_size: int
    init_op: Optional[tf.Operation]
    make_feed: Callable[[], dict]
    description: str
    function: object = None

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


def _from_zoo(name, builder, batch, description, **kwargs):
    """Builds a zoo model in a new graph; its feed is drawn on each call."""
    graph = tf.Graph()
    with graph.as_default():
        model = builder(batch=batch, **kwargs)
    return Built(name, graph, model.train_op, model.loss, batch,
                 model.init_op, model.make_inputs, description)


def resnet50(image=224, batch=1, classes=10, learning_phase="baked",
             optimizer="sgd", seed=0):
    """Keras ResNet50 (``weights=None``) with a graph-mode training step.

    Args:
      image: input height and width (>= 32).
      batch: batch size, fixed in the input layer.
      classes: output classes.
      learning_phase: "baked" (training-mode batch norm, no conds) or
        "placeholder" (Keras' learning-phase conds, as ``model.fit`` builds).
      optimizer: "sgd" (momentum 0.9, step 0.01) or "adam" (step 1e-3);
        Keras legacy optimizers, with an accuracy metric, as
        examples/Keras_ResNet50.py trains.
      seed: seed for weights and data.

    Returns:
      A `Built`.
    """
    if optimizer not in ("sgd", "adam"):
        raise ValueError("optimizer must be 'sgd' or 'adam'; got %r"
                         % (optimizer,))
    return _from_zoo(
        "resnet50", zoo.keras_resnet50, batch,
        "Keras ResNet50 %dx%d, batch %d" % (image, image, batch),
        image=image, classes=classes, seed=seed,
        learning_phase=learning_phase,
        optimizer="adam" if optimizer == "adam" else "momentum",
        learning_rate=1e-3 if optimizer == "adam" else 0.01,
        metrics=["accuracy"])


# The Keras applications the third-party benchmarks use, each with the
# smallest input side it accepts.
KERAS_APPS = collections.OrderedDict([
    ("ResNet50", 32), ("DenseNet121", 32), ("InceptionV3", 75),
    ("EfficientNetB0", 32), ("MobileNetV2", 32),
])


def _unfused_batch_norm(make_model):
    """`make_model()` rebuilt with every ``BatchNormalization`` layer
    ``fused=False``: the model is made once in a scratch graph for its
    config (so its variables stay out of the caller's graph), each batch-norm
    layer's config gets ``fused=False``, and the model is made again from
    that config in the current graph."""
    with tf.Graph().as_default():
        config = make_model().get_config()
    for layer in config["layers"]:
        if layer["class_name"] == "BatchNormalization":
            layer["config"]["fused"] = False
    return tf.keras.Model.from_config(config)


def keras_app(app="ResNet50", image=224, batch=1, classes=1000, seed=0,
              fused_batch_norm=True, gate_gradients=1):
    """A Keras application trained in a Session graph, as issue 22 wrote it.

    The graph holds what a user of ``tf.keras.applications`` in TF1 code
    gets: the model built on its own ``Input`` (a forward pass the step never
    runs, with batch norm under a learning-phase ``cond``), then called with
    ``training=True`` on placeholders, softmax cross entropy on the logits,
    and ``MomentumOptimizer(0.01, 0.9).minimize`` over the model's trainable
    weights. Batch-norm moving averages are not updated (the issue's program
    does not ask for them). The step is found by `tflms.step`'s rules (the
    optimizer's updates); nothing is put in the train-op collection.

    ``fused_batch_norm=False`` builds every ``BatchNormalization`` layer
    with ``fused=False``: batch norm computed as Keras 3 computes it on
    TensorFlow (``tf.nn.moments`` and ``tf.nn.batch_normalization``,
    element-wise ops and their gradients) instead of ``FusedBatchNormV3``
    and ``FusedBatchNormGradV3``; the model is otherwise the same (issue
    24 item 8: the Session-graph figure of the computation `keras3_app`
    runs). ``gate_gradients`` is ``minimize``'s: 1 (``GATE_OP``, its
    default, what the issue's program gets: the gradients of each op
    grouped by ``tf.tuple``, so none is used before all of that op's are
    made) or 0 (``GATE_NONE``, no grouping, as a ``GradientTape`` step
    such as Keras 3's ``train_step`` computes them).

    Args:
      app: a name of `KERAS_APPS` (a function of ``tf.keras.applications``).
      image: input height and width (at least the app's minimum).
      batch: batch size.
      classes: output classes.
      seed: seed for weights and data.
      fused_batch_norm: False: every batch-norm layer unfused (see above).
      gate_gradients: ``minimize``'s gating, 1 (GATE_OP) or 0 (GATE_NONE).

    Returns:
      A `Built`.
    """
    if app not in KERAS_APPS:
        raise ValueError("app must be one of %s; got %r"
                         % (list(KERAS_APPS), app))
    if image < KERAS_APPS[app]:
        raise ValueError("image must be at least %d for %s; got %d"
                         % (KERAS_APPS[app], app, image))

    def make_model():
        return getattr(tf.keras.applications, app)(
            weights=None, input_shape=(image, image, 3), classes=classes,
            classifier_activation=None)

    graph = tf.Graph()
    with graph.as_default():
        _v1.set_random_seed(seed)
        model = make_model() if fused_batch_norm else \
            _unfused_batch_norm(make_model)
        x = _v1.placeholder(tf.float32, [batch, image, image, 3], name="x")
        y = _v1.placeholder(tf.int32, [batch], name="y")
        logits = model(x, training=True)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                           logits=logits))
        train_op = _v1.train.MomentumOptimizer(0.01, 0.9).minimize(
            loss, var_list=model.trainable_weights,
            gate_gradients=gate_gradients)
        init_op = _v1.global_variables_initializer()
    return Built("keras_app", graph, train_op, loss, batch, init_op,
                 _feed_maker([(x, 0), (y, classes)], seed),
                 "Keras %s %dx%d, batch %d (Session graph%s)"
                 % (app, image, image, batch,
                    ("" if fused_batch_norm else ", batch norm unfused")
                    + ("" if gate_gradients == 1 else
                       ", gate_gradients %d" % gate_gradients)))


def keras3_app(app="ResNet50", image=224, batch=1, classes=1000, seed=0):
    """A Keras 3 application's ``fit()`` step, traced as a `tf.function`.

    ``keras.applications.<app>(weights=None, input_shape=(image, image,
    3), classes=classes)`` (softmax head), compiled with
    ``SGD(0.01, momentum=0.9)`` and ``sparse_categorical_crossentropy``;
    its ``train_step`` (what ``fit()`` runs: forward, loss, backward,
    momentum update, batch-norm statistics, the loss tracker) traced by
    ``tf.function`` on a `tf.TensorSpec` of one batch. Needs TensorFlow
    2.16+ with Keras 3 and eager execution on (the benchmark case's
    ``control_flow: "eager"``).

    Args:
      app: a name of `KERAS_APPS` (a function of ``keras.applications``).
      image: input height and width (at least the app's minimum).
      batch: batch size.
      classes: output classes.
      seed: seed for weights.

    Returns:
      A `Built` whose `function` is set (see `Built`).
    """
    from tflms.tf.adapters import tf_function
    from tflms.tf import keras3_trace
    keras = keras3_trace.keras3()
    if keras is None or not tf.executing_eagerly():
        raise RuntimeError(
            "keras3_app needs Keras 3 (TensorFlow 2.16+) and eager "
            "execution; run its case with control_flow 'eager' on the "
            "newest TensorFlow")
    if app not in KERAS_APPS:
        raise ValueError("app must be one of %s; got %r"
                         % (list(KERAS_APPS), app))
    keras.utils.set_random_seed(seed)
    model = getattr(keras.applications, app)(
        weights=None, input_shape=(image, image, 3), classes=classes)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy", jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    step = tf.function(model.train_step, jit_compile=False)
    concrete = step.get_concrete_function((
        tf.TensorSpec([batch, image, image, 3], tf.float32),
        tf.TensorSpec([batch], tf.int32)))
    graph = concrete.graph
    fetches = tf_function.step_fetches(graph)
    with graph.as_default():
        # Outside the function's outputs: the function never runs it, and
        # LMS's index (the outputs' and control outputs' fan-in) leaves it
        # out; the oracle runs the step through it.
        train_op = tf.group(*fetches.ops, name="tflms_bench_step")

    def no_feed():
        raise RuntimeError("keras3_app's function graph is measured, not "
                           "run in a Session")
    return Built("keras3_app", graph, train_op, graph.outputs[0], batch,
                 None, no_feed,
                 "Keras 3 %s %dx%d, batch %d (train_step as a tf.function)"
                 % (app, image, image, batch),
                 function=(concrete, model))


# segmentation-models-3D and the packages it imports, as the benchmarks use
# them. Every release requires the `tensorflow` distribution by name, which
# the tf215 stack's tensorflow-cpu does not satisfy (pip would add a second
# TensorFlow), hence --no-deps; 1.0.4's code is 1.0.7's with looser pins.
SM3D_INSTALL = ("pip install --no-deps segmentation-models-3D==1.0.4 "
                "classification-models-3D==1.0.10 keras-applications==1.0.8")


def _segmentation_models_3d():
    """The package behind `unet3d_recipe`, on tf.keras (Keras 2)."""
    import os
    # Its default framework is the standalone `keras` package (Keras 3 on
    # TensorFlow 2.16+); its users pick tf.keras this way.
    os.environ.setdefault("SM_FRAMEWORK", "tf.keras")
    try:
        import segmentation_models_3D
    except ImportError as err:
        raise ImportError(
            "unet3d_recipe needs the package segmentation-models-3D, which "
            "is not importable (%s); install it with: %s (or into a folder "
            "with --target DIR and put DIR on PYTHONPATH, which keeps the "
            "venv's pip check clean)" % (err, SM3D_INSTALL)) from err
    return segmentation_models_3D


def unet3d_recipe(volume=64, batch=1, backbone="resnet34", channels=1,
                  seed=0):
    """segmentation-models-3D's 3D U-Net trained in a Session graph.

    What a user of the package writes, in the TF1 pattern of `keras_app`:
    ``sm.Unet(backbone, input_shape=(volume,) * 3 + (channels,),
    encoder_weights=None, classes=1, activation="sigmoid")`` (the package's
    defaults otherwise: upsampling decoder of 256, 128, 64, 32, 16 filters
    with batch norm), called with ``training=True`` on placeholders, the
    package's own ``bce_jaccard_loss`` (its README's choice), and
    ``MomentumOptimizer(0.01, 0.9).minimize`` over the model's trainable
    weights. The step is found by `tflms.step`'s rules.

    Args:
      volume: input depth, height and width; a multiple of 32.
      batch: batch size.
      backbone: an encoder name of ``sm.get_available_backbone_names()``.
      channels: input channels.
      seed: seed for weights and data.

    Returns:
      A `Built`.

    Raises:
      ImportError: segmentation-models-3D is not installed (the message
        gives the pip command).
    """
    if volume < 32 or volume % 32:
        raise ValueError("volume must be a positive multiple of 32 (the "
                         "encoder halves it five times); got %d" % volume)
    sm = _segmentation_models_3d()
    graph = tf.Graph()
    with graph.as_default():
        _v1.set_random_seed(seed)
        model = sm.Unet(backbone, input_shape=(volume,) * 3 + (channels,),
                        encoder_weights=None, classes=1,
                        activation="sigmoid")
        x = _v1.placeholder(tf.float32, [batch] + [volume] * 3 + [channels],
                            name="x")
        y = _v1.placeholder(tf.float32, [batch] + [volume] * 3 + [1],
                            name="y")
        prob = model(x, training=True)
        loss = sm.losses.bce_jaccard_loss(y, prob)
        train_op = _v1.train.MomentumOptimizer(0.01, 0.9).minimize(
            loss, var_list=model.trainable_weights)
        init_op = _v1.global_variables_initializer()

    def feed():
        rng = np.random.RandomState(seed)
        return {x: rng.standard_normal(x.shape.as_list()).astype(np.float32),
                y: rng.randint(0, 2, size=y.shape.as_list()).astype(
                    np.float32)}
    return Built("unet3d_recipe", graph, train_op, loss, batch, init_op,
                 feed, "segmentation-models-3D U-Net (%s) %d^3, batch %d "
                 "(Session graph)" % (backbone, volume, batch))


def mlp(depth=16, width=1024, batch=4096, variables="resource", classes=10,
        seed=0):
    """A ReLU MLP trained with plain SGD (issue 15's fidelity case).

    Args:
      depth: hidden layers.
      width: input and hidden width.
      batch: batch size.
      variables: "resource" (resource variables) or "ref" (TF1 reference
        variables, VariableV2: what ``tf.compat.v1.get_variable`` makes
        under ``disable_v2_behavior()``).
      classes: output classes.
      seed: seed for weights and data.

    Returns:
      A `Built`.
    """
    if variables not in ("resource", "ref"):
        raise ValueError("variables must be 'resource' or 'ref'; got %r"
                         % (variables,))
    return _from_zoo(
        "mlp", zoo.mlp, batch,
        "MLP %d x %d, batch %d, SGD, %s variables"
        % (depth, width, batch, variables),
        depth=depth, width=width, classes=classes, seed=seed,
        optimizer="sgd", resource_variables=variables == "resource")


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
    return _from_zoo(
        "unet3d", zoo.unet3d, batch,
        "3D U-Net %d^3, %d filters, depth %d, batch %d"
        % (volume, base_filters, depth, batch),
        volume=volume, base_filters=base_filters, depth=depth,
        channels=channels, seed=seed)


def transformer(layers=12, seq=512, d_model=512, heads=8, batch=4,
                classes=10, seed=0):
    """A post-norm Transformer encoder classifier, trained with Adam (1e-4).

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
    return _from_zoo(
        "transformer", zoo.transformer_encoder, batch,
        "Transformer encoder, %d layers, seq %d, d_model %d, batch %d"
        % (layers, seq, d_model, batch),
        layers=layers, seq=seq, d_model=d_model, heads=heads,
        classes=classes, seed=seed, learning_rate=1e-4)


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
        # Divided before the cast: with NumPy 2, float32 / np.float64 is
        # float64, which MatMul would refuse beside the float32 inputs.
        kernel0 = tf.constant(
            (rng.standard_normal((width, width)) / np.sqrt(width))
            .astype(np.float32), name="kernel_init")
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
    ("keras_app", keras_app),
    ("keras3_app", keras3_app),
    ("unet3d", unet3d),
    ("unet3d_recipe", unet3d_recipe),
    ("transformer", transformer),
    ("mlp", mlp),
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


def build_sized(name, size=None, batch=1):
    """`build` of ResNet50 (`size`: the image side) or the 3D U-Net
    (`size`: the volume side) at `batch`; the builder's default size for
    None."""
    kwargs = {"batch": batch}
    if size:
        kwargs[size_key("image" if name == "resnet50" else "volume")] = size
    return build(name, **kwargs)


# ---------------------------------------------------------------------------
# The published single-GPU training runs the step-time model is checked
# against (benchmarks/step_time.py): their models at their precision.
# ---------------------------------------------------------------------------

PRECISIONS = ("float32", "mixed_float16", "float16")


def _check_precision(precision):
    if precision not in PRECISIONS:
        raise ValueError("precision must be one of %s; got %r"
                         % (", ".join(PRECISIONS), precision))


def resnet50_at(image=224, batch=1, classes=1000, precision="float32",
                seed=0):
    """`resnet50` (training-mode batch norm, SGD with momentum) in
    `precision`: ``"mixed_float16"`` builds it under Keras' mixed-precision
    policy (float16 convolutions and activations, float32 variables, the
    loss in float32), as automatic mixed precision trains it.

    Returns:
      A `Built`.
    """
    _check_precision(precision)
    if precision == "float32":
        return resnet50(image=image, batch=batch, classes=classes, seed=seed)
    from tflms.tf import compat
    mixed = compat.keras2().mixed_precision
    before = mixed.global_policy()
    mixed.set_global_policy("mixed_float16")
    try:
        built = resnet50(image=image, batch=batch, classes=classes,
                         seed=seed)
    finally:
        mixed.set_global_policy(before)
    built.description += ", mixed float16"
    return built


def bert(layers=24, hidden=1024, heads=16, seq=128, batch=8,
         vocab=30522, predictions=20, head="pretraining",
         precision="float32", dropout=0.1, optimizer="adam", seed=0):
    """A BERT encoder stack trained with Adam, in graph mode.

    BERT-large by default (24 layers, hidden 1024, 16 heads, feed-forward
    4096, vocabulary 30522, Devlin et al. 2018), as NVIDIA's
    DeepLearningExamples train it: word, position and token-type
    embeddings with layer norm; per layer self-attention (Q, K, V and
    output projections, scaled dot product, softmax, dropout) and a GELU
    feed-forward block, each with a residual connection, dropout and a
    post layer norm. ``head="pretraining"``: the masked-LM loss at
    `predictions` gathered positions (dense + GELU + layer norm, then the
    tied word embedding and a bias over the vocabulary) plus next-sentence
    prediction on the pooled first token; ``head="squad"``: start and end
    logits per position (SQuAD fine-tuning).

    ``precision="mixed_float16"``: variables stay float32 and are cast to
    float16 where read; matrix products, GELU, dropout and residuals run in
    float16; layer norms, softmax and the losses in float32 (what
    automatic mixed precision's lists keep in float32).
    ``precision="float16"``: the same, but the softmax reads and writes
    float16 too, as apex's O2 runs a model cast to float16 (NVIDIA's
    PyTorch run_squad.py with ``--fp16``); layer norms still compute in
    float32 between float16 tensors, as apex's fused layer norm does.

    ``optimizer="adam-weight-decay"``: the update NVIDIA's TensorFlow
    BERT fine-tuning runs (its optimization.py): gated gradients (with
    mixed precision, a finiteness check of all of them), clipped to global
    norm 1, then Adam with weight decay 0.01 (not on layer norms and
    biases) written as elementwise ops per variable, its slots and the
    variable assigned. ``optimizer="accumulate"``: the step adds each gradient
    to an accumulator variable (``AssignAddVariableOp``) instead of applying
    Adam: one micro-batch of gradient accumulation, as NVIDIA's
    pretraining runs most steps (its LAMB update comes once every 256 to
    16384 micro-batches); its gradients gated per op as the optimizers'
    ``compute_gradients`` gates them (``GATE_OP``).

    Returns:
      A `Built` whose feed draws token ids, positions and labels.
    """
    _check_precision(precision)
    if optimizer not in ("adam", "adam-weight-decay", "accumulate"):
        raise ValueError("optimizer must be 'adam', 'adam-weight-decay' or "
                         "'accumulate'; got %r" % (optimizer,))
    if head not in ("pretraining", "squad"):
        raise ValueError("head must be 'pretraining' or 'squad'; got %r"
                         % (head,))
    if hidden % heads:
        raise ValueError("hidden %d is not divisible by heads %d"
                         % (hidden, heads))
    compute = tf.float32 if precision == "float32" else tf.float16
    softmax32 = precision != "float16"
    depth = hidden // heads
    graph = tf.Graph()
    with graph.as_default():
        _v1.set_random_seed(seed)
        init = _v1.truncated_normal_initializer(stddev=0.02)

        def weight(name, shape, initializer=init):
            var = _v1.get_variable(name, shape, tf.float32, initializer,
                                   use_resource=True)
            return tf.cast(var, compute) if compute != tf.float32 else var

        def dense(x, units, name, bias=True):
            with _v1.variable_scope(name):
                y = tf.matmul(x, weight("kernel", [x.shape[-1], units]))
                if bias:
                    y += weight("bias", [units], tf.zeros_initializer())
                return y

        def layer_norm(x, name):
            with _v1.variable_scope(name):
                x32 = tf.cast(x, tf.float32)
                mean, var = tf.nn.moments(x32, axes=[-1], keepdims=True)
                gamma = _v1.get_variable("gamma", [x.shape[-1]], tf.float32,
                                         tf.ones_initializer(),
                                         use_resource=True)
                beta = _v1.get_variable("beta", [x.shape[-1]], tf.float32,
                                        tf.zeros_initializer(),
                                        use_resource=True)
                y = (x32 - mean) * tf.math.rsqrt(var + 1e-12) * gamma + beta
                return tf.cast(y, compute)

        def drop(x):
            return tf.nn.dropout(x, rate=dropout) if dropout else x

        tokens = _v1.placeholder(tf.int32, [batch, seq], name="tokens")
        segments = _v1.placeholder(tf.int32, [batch, seq], name="segments")
        with _v1.variable_scope("bert"):
            table = _v1.get_variable("word_embeddings", [vocab, hidden],
                                     tf.float32, init, use_resource=True)
            h = tf.gather(table, tokens)
            h += tf.gather(_v1.get_variable(
                "token_type_embeddings", [2, hidden], tf.float32, init,
                use_resource=True), segments)
            h += _v1.get_variable("position_embeddings", [seq, hidden],
                                  tf.float32, init, use_resource=True)
            h = tf.reshape(drop(layer_norm(h, "embeddings_ln")),
                           [batch * seq, hidden])
            for i in range(layers):
                with _v1.variable_scope("layer%d" % i):
                    def heads_of(t):
                        return tf.transpose(tf.reshape(
                            t, [batch, seq, heads, depth]), [0, 2, 1, 3])
                    q = heads_of(dense(h, hidden, "query"))
                    k = heads_of(dense(h, hidden, "key"))
                    v = heads_of(dense(h, hidden, "value"))
                    scores = tf.matmul(q, k, transpose_b=True) * \
                        tf.cast(1.0 / np.sqrt(depth), compute)
                    if softmax32:
                        probs = tf.cast(tf.nn.softmax(
                            tf.cast(scores, tf.float32)), compute)
                    else:
                        probs = tf.nn.softmax(scores)
                    ctx = tf.matmul(drop(probs), v)
                    ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]),
                                     [batch * seq, hidden])
                    h = layer_norm(h + drop(dense(ctx, hidden, "output")),
                                   "attention_ln")
                    ff = tf.nn.gelu(dense(h, 4 * hidden, "intermediate"))
                    h = layer_norm(h + drop(dense(ff, hidden, "ffn_output")),
                                   "output_ln")
            feeds = [(tokens, vocab), (segments, 2)]
            if head == "pretraining":
                positions = _v1.placeholder(tf.int32, [batch, predictions],
                                            name="positions")
                labels = _v1.placeholder(tf.int32, [batch * predictions],
                                         name="mlm_labels")
                nsp = _v1.placeholder(tf.int32, [batch], name="nsp_labels")
                flat = tf.reshape(positions + seq * tf.range(batch)[:, None],
                                  [-1])
                m = tf.gather(h, flat)
                with _v1.variable_scope("mlm"):
                    m = layer_norm(tf.nn.gelu(dense(m, hidden, "transform")),
                                   "ln")
                    logits = tf.matmul(m, tf.cast(table, compute),
                                       transpose_b=True)
                    logits += weight("bias", [vocab], tf.zeros_initializer())
                first = tf.reshape(h, [batch, seq, hidden])[:, 0]
                pooled = tf.tanh(dense(first, hidden, "pooler"))
                nsp_logits = dense(pooled, 2, "nsp")
                loss = tf.add(
                    _classification_loss32(logits, labels),
                    _classification_loss32(nsp_logits, nsp), name="loss")
                feeds += [(positions, seq), (labels, vocab), (nsp, 2)]
            else:
                starts = _v1.placeholder(tf.int32, [batch], name="starts")
                ends = _v1.placeholder(tf.int32, [batch], name="ends")
                span = tf.reshape(dense(h, 2, "squad"), [batch, seq, 2])
                loss = tf.add(
                    _classification_loss32(span[:, :, 0], starts),
                    _classification_loss32(span[:, :, 1], ends), name="loss")
                feeds += [(starts, seq), (ends, seq)]
            if optimizer == "adam":
                train_op = _v1.train.AdamOptimizer(1e-4).minimize(
                    loss, name="train")
            elif optimizer == "adam-weight-decay":
                train_op = _adam_weight_decay(loss, compute == tf.float16)
            else:
                params = _v1.trainable_variables()
                adds = []
                with _v1.variable_scope("accumulators"):
                    for param, grad in zip(params, _v1.gradients(
                            loss, params, gate_gradients=True)):
                        acc = _v1.get_variable(
                            param.op.name.replace("/", "_"), param.shape,
                            tf.float32, tf.zeros_initializer(),
                            trainable=False, use_resource=True)
                        adds.append(acc.assign_add(
                            tf.convert_to_tensor(grad), read_value=False))
                train_op = tf.group(*adds, name="train")
        init_op = _v1.variables_initializer(_v1.global_variables(),
                                            name="init")
        for key, item in ((_v1.GraphKeys.TRAIN_OP, train_op),
                          (_v1.GraphKeys.LOSSES, loss)):
            _v1.add_to_collection(key, item)
    return Built("bert", graph, train_op, loss, batch, init_op,
                 _feed_maker(feeds, seed),
                 "BERT %d layers, hidden %d, seq %d, batch %d, %s%s" % (
                     layers, hidden, seq, batch, head,
                     ", mixed float16" if compute == tf.float16 else ""))


def _adam_weight_decay(loss, finite_check):
    """NVIDIA's BERT fine-tuning update (TensorFlow/LanguageModeling/BERT/
    optimization.py: create_optimizer, AdamWeightDecayOptimizer) on every
    trainable variable: gated gradients, a finiteness check of them all
    with mixed precision, clipping to global norm 1, Adam with weight
    decay as elementwise ops; the train op groups the assignments."""
    params = _v1.trainable_variables()
    grads = [tf.convert_to_tensor(g) for g in _v1.gradients(
        loss, params, gate_gradients=True)]
    norm = tf.linalg.global_norm(grads)
    if finite_check:
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g))
                                for g in grads])
        norm = tf.where(finite, norm, 1.0)
    scale = 1.0 / tf.maximum(norm, 1.0)  # clip_by_global_norm(grads, 1.0)
    assigns = []
    with _v1.variable_scope("adam_weight_decay"):
        for param, grad in zip(params, grads):
            grad = grad * scale
            name = param.op.name
            m, v = (_v1.get_variable(
                name.replace("/", "_") + slot, param.shape, tf.float32,
                tf.zeros_initializer(), trainable=False, use_resource=True)
                for slot in ("_adam_m", "_adam_v"))
            next_m = 0.9 * m + 0.1 * grad
            next_v = 0.999 * v + 0.001 * tf.square(grad)
            update = next_m / (tf.sqrt(next_v) + 1e-6)
            if not any(k in name for k in ("gamma", "beta", "bias")):
                update += 0.01 * param  # layer norms and biases excluded
            assigns += [param.assign(param - 1e-4 * update, read_value=False),
                        m.assign(next_m, read_value=False),
                        v.assign(next_v, read_value=False)]
    return tf.group(*assigns, name="train")


def _classification_loss32(logits, labels):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=tf.cast(logits, tf.float32)))
