"""``tflms plan`` on a model saved by Keras 3: its training step, traced.

Keras 3 has no graph-mode training step to load: ``fit()`` runs the
model's ``train_step`` as a `tf.function`. `load` loads the file with
``keras.saving.load_model`` (in eager mode), compiles it with the saved
loss and optimizer or with the command line's ``--loss`` / ``--optimizer``,
and traces ``model.train_step`` with `tf.function` on a `tf.TensorSpec` of
one batch (``--batch-size``, or the batch the model's input fixes): the
step ``fit()`` runs, forward pass, loss, backward pass, optimizer update,
batch-norm statistics and metrics, in one concrete function. Its graph
(`FuncGraph`) is what `tflms.tf.lms_function` rewrites for ``lms.function``,
and ``tflms plan`` plans it the same way
(`tflms.tf.adapters.rewrite.rewrite_function_graph`: the function's
outputs and control outputs are the step, the variables it captures are
resident);
``--inference`` traces ``model(x, training=False)`` instead.

Targets are given the model's output shape, and for a sparse loss (its
name says ``sparse``) integer class indices without the class dimension,
as ``fit()`` would be fed.

A step can also be traced at a sequence length (``tflms capacity
--dimension sequence``): the sequence axis is axis 1 of every input, and
of every output (so target), whose axis 1 the model leaves unknown
(``keras.Input(shape=(None, ...))``, a KerasHub backbone's
``token_ids`` and ``padding_mask``); inputs whose axis 1 is fixed keep
it. `sequence_limit` finds the longest sequence a model was built for
(a KerasHub backbone's ``max_sequence_length``, a position embedding's
``sequence_length``).

Only this module and the Keras 3 branch of `tflms.cli` know of Keras 3
files; Keras 2 files (``.h5``, ``.keras`` from tf_keras) load as before
(`tflms.tf.keras_models`).
"""

import dataclasses
from typing import Optional

import tensorflow as tf

from tflms.errors import LMSError
from tflms.tf.adapters import tf_function
from tflms.tf import keras_models

__all__ = ["Keras3PlanError", "LoadedModel", "TracedStep", "keras3",
           "is_keras3_file", "load", "load_model", "trace", "from_model",
           "sequence_inputs", "sequence_limit"]


class Keras3PlanError(LMSError, ValueError):
    """A Keras 3 model that cannot be traced for planning; the message
    says why and what to do."""


@dataclasses.dataclass
class TracedStep:
    """A Keras 3 model's step traced for planning.

    Attributes:
      graph: the concrete function's `FuncGraph` (nothing has run in it).
      fetches: its step (`step.StepFetches`): outputs and control outputs.
      training: True for ``train_step``, False for the forward pass.
      notes: lines for the report.
      trainable: ``(parameters, bytes)`` of the model's trainable
        variables.
      model: the Keras model, kept alive with the function (the graph
        reads its variables through captured handles).
      concrete: the concrete function.
    """

    graph: object
    fetches: object
    training: bool
    notes: list
    trainable: tuple
    model: object
    concrete: object


def keras3():
    """The ``keras`` package if it is Keras 3 (TensorFlow 2.16+), else
    None."""
    try:
        import keras
    except ImportError:
        return None
    version = getattr(keras, "__version__", "0")
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return None
    return keras if major >= 3 else None


def is_keras3_file(path):
    """True if `path` is a model file saved by Keras 3 (the version its
    ``.keras`` archive or ``.h5`` file records)."""
    version = keras_models.saved_keras_version(path)
    try:
        return version is not None and int(version.split(".")[0]) >= 3
    except ValueError:
        return False


def _name(value):
    if isinstance(value, str):
        return value
    return (getattr(value, "name", None) or getattr(value, "__name__", None)
            or type(value).__name__)


def _is_sparse(loss):
    return "sparse" in str(_name(loss)).lower()


def _losses_per_output(loss, outputs, names):
    """The loss of each output of `outputs` (a flat list), from what
    ``compile(loss=...)`` was given: one for all, a list, or a dict by
    output name."""
    if isinstance(loss, dict):
        return [loss.get(name) for name in names]
    if isinstance(loss, (list, tuple)) and len(loss) == len(outputs):
        return list(loss)
    return [loss] * len(outputs)


def _batch_of(tensors, batch_size, path):
    """The batch dimension to trace with: `batch_size`, else the one the
    model's inputs fix."""
    fixed = {t.shape[0] for t in tensors if t.shape and t.shape[0]}
    if batch_size:
        return batch_size
    if len(fixed) == 1:
        return fixed.pop()
    raise Keras3PlanError(
        "the Keras 3 model %s has no fixed batch size; pass --batch-size N "
        "(the training step is traced for one batch)" % path)


def _structure(model, what):
    """The model's inputs or outputs (`what`: "input" or "output") as
    KerasTensors in the structure it takes or returns: one tensor, a
    list or a dict (a loaded Sequential model knows only its flat list);
    None when the model does not know them."""
    try:
        return getattr(model, what)
    except (AttributeError, ValueError):
        pass
    try:
        flat = list(getattr(model, what + "s"))
    except (AttributeError, ValueError, TypeError):
        return None
    if not flat:
        return None
    return flat[0] if len(flat) == 1 else flat


def _has_sequence_axis(shape):
    """True if axis 1 of `shape` is unknown: the sequence axis."""
    return len(shape) >= 2 and shape[1] is None


def _spec(shape, dtype, batch, what, path, sequence=None):
    dims = (batch,) + tuple(shape[1:])
    if sequence is not None and _has_sequence_axis(shape):
        dims = (batch, sequence) + dims[2:]
    if any(d is None for d in dims):
        hint = ""
        if sequence is None and _has_sequence_axis(shape) and \
                None not in tuple(shape[2:]):
            hint = ("; or search its sequence length with tflms capacity "
                    "--dimension sequence --batch-size N, which traces "
                    "axis 1 at each length")
        raise Keras3PlanError(
            "the Keras 3 model %s has %s of shape %s, with an unknown "
            "dimension besides the %s: its training step can only be "
            "planned for fixed shapes; save the model with a fixed input "
            "shape (keras.Input(shape=...))%s" % (
                path, what, tuple(shape),
                "batch" if sequence is None else "batch and axis 1 (the "
                "sequence)", hint))
    return tf.TensorSpec(dims, tf.as_dtype(dtype))


def _signature(keras, model, batch_size, path, training, sequence=None):
    """``(x spec, y spec or None, batch)`` for one batch of `model` (at
    `sequence` on the sequence axis, if given)."""
    inputs, outputs = _structure(model, "input"), _structure(model, "output")
    if inputs is None or outputs is None:
        raise Keras3PlanError(
            "cannot tell the input and output shapes of the Keras 3 model "
            "%s; save a functional or Sequential model built on keras.Input"
            % path)
    flat_in = keras.tree.flatten(inputs)
    batch = _batch_of(flat_in, batch_size, path)
    x = keras.tree.pack_sequence_as(inputs, [
        _spec(t.shape, t.dtype, batch, "an input", path, sequence)
        for t in flat_in])
    if not training:
        return x, None, batch
    flat_out = keras.tree.flatten(outputs)
    losses = _losses_per_output(model.loss, flat_out,
                                getattr(model, "output_names", None) or [])
    targets = []
    for out, loss in zip(flat_out, losses):
        if _is_sparse(loss):
            # One class index per example, as fit() is fed for a sparse
            # loss.
            targets.append(_spec(out.shape[:-1], tf.int32, batch, "an output",
                                 path, sequence))
        else:
            targets.append(_spec(out.shape, out.dtype, batch, "an output",
                                 path, sequence))
    return x, keras.tree.pack_sequence_as(outputs, targets), batch


def _compile(model, path, loss, optimizer):
    """Compile `model` for the step; returns notes. The saved loss and
    optimizer are kept unless `loss` / `optimizer` (the command line's)
    replace them."""
    saved = getattr(model, "optimizer", None) is not None and \
        getattr(model, "loss", None) is not None
    if saved and loss is None and optimizer is None:
        return ["Compiled with the saved loss and optimizer (%s, %s)." % (
            _name(model.loss), type(model.optimizer).__name__)]
    if not saved and loss is None:
        raise Keras3PlanError(
            "the Keras 3 model %s was saved without a training "
            "configuration (no compile() before model.save()), so its loss "
            "is unknown; pass --loss (a Keras loss name such as "
            "sparse_categorical_crossentropy or mse) and --optimizer "
            "(default adam; its slots count as device memory)" % path)
    new_loss = loss or model.loss
    new_optimizer = optimizer or (model.optimizer if saved else "adam")
    try:
        model.compile(optimizer=new_optimizer, loss=new_loss,
                      jit_compile=False)
    except (ValueError, TypeError) as e:
        raise Keras3PlanError(
            "cannot compile the Keras 3 model with loss=%r and "
            "optimizer=%r: %s; choose others with --loss and --optimizer"
            % (_name(new_loss), _name(new_optimizer), e)) from None
    return ["Compiled with loss=%s and optimizer=%s (%s)." % (
        _name(new_loss), type(model.optimizer).__name__,
        "the saved ones replaced by --loss/--optimizer" if saved else
        "the model was saved without a training configuration")]


@dataclasses.dataclass
class LoadedModel:
    """A Keras 3 model loaded (and, for training, compiled) for one batch.

    Attributes:
      keras: the Keras 3 package.
      model: the Keras model.
      notes: lines for the report (how it was compiled).
      x, y: `tf.TensorSpec` structures of one batch's inputs and targets
        (`y` is None for inference).
      batch: the batch size.
      sequence: the sequence length on the sequence axis, or None.
    """

    keras: object
    model: object
    notes: list
    x: object
    y: object
    batch: int
    sequence: Optional[int] = None


def load_model(path, batch_size=None, loss=None, optimizer=None,
               inference=False, sequence=None):
    """Load the Keras 3 model `path` in eager mode and compile it for
    training (the saved loss and optimizer, or `loss` / `optimizer`),
    with its optimizer built; `tflms plan` traces its step
    (`load`) and `tflms verify` trains it (`tflms.tf.verify_keras3`).

    Returns:
      A `LoadedModel`.

    Raises:
      Keras3PlanError: as `load`.
    """
    keras = keras3()
    if keras is None:
        raise Keras3PlanError(
            "%s was saved by Keras 3, which is not installed here (Keras 3 "
            "needs TensorFlow 2.16 or newer); plan it where TensorFlow 2.16+ "
            "and Keras 3 are installed" % path)
    if not tf.executing_eagerly():
        raise Keras3PlanError(
            "a Keras 3 model is traced in eager mode (TensorFlow 2's "
            "default); eager execution is off in this process")
    try:
        model = keras.saving.load_model(path, compile=not inference)
    except Exception as e:
        raise Keras3PlanError(
            "cannot load the Keras 3 model %s: %s: %s. Models with custom "
            "layers or losses need their code registered "
            "(keras.saving.register_keras_serializable) to load"
            % (path, type(e).__name__, e)) from None
    notes = []
    if not inference:
        notes.extend(_compile(model, path, loss, optimizer))
    x, y, batch = _signature(keras, model, batch_size, path, not inference,
                             sequence)
    if not inference and not model.optimizer.built:
        # Built outside the trace, as fit() builds it before its first
        # step; the step only reads and updates the slots.
        model.optimizer.build(model.trainable_variables)
    return LoadedModel(keras=keras, model=model, notes=notes, x=x, y=y,
                       batch=batch, sequence=sequence)


def from_model(model, batch_size, sequence=None):
    """A `LoadedModel` of a live Keras 3 model compiled for training (its
    optimizer built here if it is not yet), for `trace`."""
    keras = keras3()
    x, y, batch = _signature(keras, model, batch_size, "the model", True,
                             sequence)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return LoadedModel(keras=keras, model=model, notes=[], x=x, y=y,
                       batch=batch, sequence=sequence)


def sequence_inputs(loaded, path="the model"):
    """The names (or positions) of the inputs of `loaded`'s model whose
    axis 1 is the sequence axis (unknown in the model).

    Raises:
      Keras3PlanError: no input has one.
    """
    keras, model = loaded.keras, loaded.model
    inputs = _structure(model, "input")
    flat = keras.tree.flatten(inputs) if inputs is not None else []
    found = [getattr(t, "name", None) or str(k) for k, t in enumerate(flat)
             if _has_sequence_axis(tuple(t.shape))]
    if not found:
        raise Keras3PlanError(
            "--dimension sequence: no input of the Keras 3 model %s has an "
            "unknown axis 1 to trace at each length (its inputs: %s); "
            "build the model on inputs of shape (None, ...) after the batch "
            "(keras.Input(shape=(None,)) for token ids), or search the "
            "batch (--dimension batch)" % (path, ", ".join(
                "%s %s" % (getattr(t, "name", "?"), tuple(t.shape))
                for t in flat) or "none known"))
    return found


def sequence_limit(model):
    """``(length, reason)``: the longest sequence `model` was built for,
    from its layers (a KerasHub backbone's ``max_sequence_length``, a
    position embedding's ``sequence_length``: a step longer than that
    slices past the embedding's table), or ``(None, None)`` when no layer
    says. A position looked up in a plain ``keras.layers.Embedding`` is
    not recognised."""
    best = (None, None)
    layers = model._flatten_layers(include_self=True, recursive=True)
    for layer in layers:
        for attr, what in (("max_sequence_length", "was built with "
                            "max_sequence_length=%d"),
                           ("sequence_length", "(a position embedding) "
                            "holds sequence_length=%d positions")):
            if attr == "sequence_length" and \
                    "PositionEmbedding" not in type(layer).__name__:
                continue
            value = getattr(layer, attr, None)
            if isinstance(value, int) and value > 0 and (
                    best[0] is None or value < best[0]):
                best = (value, "%s %r %s" % (type(layer).__name__,
                                             layer.name, what % value))
    return best


def load(path, batch_size=None, loss=None, optimizer=None, inference=False):
    """Load the Keras 3 model `path` and trace its step for planning.

    Args:
      path: a ``.keras`` (or ``.h5``) file written by Keras 3.
      batch_size: the batch to trace with (the model's own fixed batch when
        None).
      loss, optimizer: replace the saved ones (names Keras 3 knows); needed
        when the file has no training configuration (`loss` at least).
      inference: trace the forward pass ``model(x, training=False)``
        instead of ``train_step``.

    Returns:
      A `TracedStep`.

    Raises:
      Keras3PlanError: no Keras 3 here, a file Keras 3 cannot load, no loss
        known, no batch size, shapes that are not fixed.
    """
    return trace(load_model(path, batch_size, loss, optimizer, inference),
                 inference)


def trace(loaded, inference=False, batch_size=None, path="the model",
          sequence=None):
    """The `TracedStep` of a `LoadedModel` (`load_model`, `from_model`),
    for its batch or for `batch_size` (and its sequence length, or
    `sequence`): `tflms capacity` loads a model once and traces its step
    once per batch (or sequence length) it tries."""
    model, notes, x, y, batch = (loaded.model, list(loaded.notes), loaded.x,
                                 loaded.y, loaded.batch)
    sequence = loaded.sequence if sequence is None else sequence
    if (batch_size is not None and batch_size != batch) or \
            sequence != loaded.sequence:
        x, y, batch = _signature(loaded.keras, model, batch_size or batch,
                                 path, not inference, sequence)
    if inference:
        step = tf.function(lambda x: model(x, training=False))
        concrete = step.get_concrete_function(x)
        notes.append("--inference: traced the forward pass model(x, "
                     "training=False) with tf.function, batch %d." % batch)
    else:
        step = tf.function(model.train_step, jit_compile=False)
        concrete = step.get_concrete_function((x, y))
        notes.append("Traced Keras 3's train step (model.train_step, the "
                     "step fit() runs) with tf.function for batch %d%s: "
                     "forward, loss, backward, optimizer update and metrics "
                     "in one function graph." % (batch, "" if sequence is None
                                                 else ", sequence length %d"
                                                 % sequence))
    graph = concrete.graph
    fetches = tf_function.step_fetches(graph)
    # Named as a MetaGraph's train op is, for --oracle.
    for op in fetches.ops:
        graph.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, op)
    count = nbytes = 0
    for v in model.trainable_variables:
        n = _elements(v.shape)
        count += n
        nbytes += n * tf.as_dtype(v.dtype).size
    return TracedStep(graph=graph, fetches=fetches, training=not inference,
                      notes=notes, trainable=(count, nbytes), model=model,
                      concrete=concrete)


def _elements(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n
