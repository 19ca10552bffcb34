"""Loading a saved graph into a fresh `tf.Graph` (`load_graph`): a
MetaGraph, a SavedModel, or a Keras model compiled and given its train
function as ``fit()`` would; a model saved by Keras 3 is traced instead
(its ``train_step`` as a `tf.function` for one batch, the function graph
planned as `tflms.tf.lms_function` plans it: `tflms.tf.keras3_trace`)."""

import dataclasses
import os

from tflms.errors import LMSError


_KERAS_EXTENSIONS = (".h5", ".hdf5", ".keras")


class PlanError(LMSError):
    """A graph that cannot be loaded or planned; the message says why and
    what to do."""


@dataclasses.dataclass
class LoadedGraph:
    """A training (or inference) graph ready for LMS.

    Attributes:
      graph: the `tf.Graph` (nothing has run in it).
      kind: human-readable description of the file.
      training: True if the graph has a backward phase.
      notes: lines to show the user about how it was loaded.
      fetches: what one step runs (`step.StepFetches`), when the file
        says (a Keras model's train function, or its outputs for
        inference); None: LMS finds it (`tflms.step`).
      traced: for a Keras 3 model, its `keras3_trace.TracedStep`: `graph`
        is then the traced step's function graph, planned as
        `tflms.tf.lms_function` plans one; None for a Session graph.
    """

    graph: object
    kind: str
    training: bool
    notes: list
    fetches: object = None
    traced: object = None


def _has_backward(graph):
    """True if the graph computes gradients or applies an optimizer."""
    for op in graph.get_operations():
        if op.type.startswith(("Apply", "ResourceApply", "SparseApply",
                               "ResourceSparseApply")):
            return True
        if any(part == "gradients" or part.startswith("gradients_")
               for part in op.name.split("/")):
            return True
    return False


def _is_keras_savedmodel(path):
    return os.path.exists(os.path.join(path, "keras_metadata.pb"))


def _is_savedmodel(path):
    return any(os.path.exists(os.path.join(path, name))
               for name in ("saved_model.pb", "saved_model.pbtxt"))


_CLI_FIX = ("pass a graph-mode optimizer with --optimizer (a name such as "
            "sgd, adam, rmsprop, adagrad; optimizer slots count as device "
            "memory, so pick one with the same slots)")


def _shape_targets(model):
    """Give a compiled Keras 2 model's target placeholders the shape of
    their output (batch and, for sparse losses, the class dimension left
    out): Keras makes them with no known dimension, so neither the
    simulator nor `verify` could size or feed them."""
    for endpoint in getattr(model, "_training_endpoints", None) or ():
        target = getattr(getattr(endpoint, "training_target", None),
                         "target", None)
        output = getattr(endpoint, "output", None)
        if (target is None or output is None
                or getattr(target.op, "type", None) != "Placeholder"
                or target.shape.rank is None
                or target.shape.rank != output.shape.rank):
            continue
        loss = getattr(endpoint, "loss_fn", None)
        name = (getattr(loss, "name", None) or getattr(loss, "__name__", None)
                or type(loss).__name__)
        dims = output.shape.as_list()
        if "sparse" in str(name).lower() and dims:
            dims[-1] = 1  # one class index per example
        try:
            target.set_shape(dims)
        except ValueError:
            continue  # a shape the user gave that disagrees: keep theirs


def _load_keras(path, graph, args):
    """Notes and the step's fetches of a Keras model loaded into `graph`."""
    from tflms.tf import compat
    from tflms.tf import keras_models
    import tensorflow as tf
    from tflms.tf import reader
    notes = []
    with graph.as_default():
        try:
            model, load_notes = keras_models._load(
                path, compile=not args.inference,
                convert=args.optimizer is None, fix=_CLI_FIX)
        except compat.UnsupportedStackError as e:
            raise PlanError(str(e)) from None
        except (ImportError, IOError, OSError, ValueError, TypeError) as e:
            problem = keras_models.not_a_model_file(path)
            if problem is not None:
                raise PlanError(problem) from None
            keras3 = ""
            if compat.TF_VERSION >= (2, 16, 0) and \
                    keras_models.saved_keras_version(path) is None:
                # A file that does not name its Keras version may still
                # be Keras 3's (the ones that do are UnsupportedStackError).
                keras3 = (" A model saved by Keras 3 (tf.keras without "
                          "TF_USE_LEGACY_KERAS=1 on TensorFlow 2.16+) cannot "
                          "be loaded by Keras 2: save it from a tf_keras "
                          "model instead.")
            raise PlanError(
                "cannot load the Keras model %s: %s. Models with custom "
                "layers or losses cannot be loaded by this command; export "
                "the training graph with tf.compat.v1.train.export_meta_graph "
                "after model._make_train_function() and plan the .meta file.%s"
                % (path, e, keras3)) from None
        if args.inference:
            notes.append("--inference: planned the model's forward graph "
                         "only (not compiled, no train function).")
            return notes, reader.find_fetches(
                graph, list(model.outputs), source="the model's outputs")
        notes.extend(note.replace("; compiled with", "; planned with")
                     + (" Change it with --optimizer." if "TF2" in note
                        else "") for note in load_notes)
        saved = getattr(model, "optimizer", None) is not None
        if saved and args.loss is None and args.optimizer is None:
            if not load_notes:
                notes.append("Compiled with the saved loss and optimizer "
                             "(%s)." % type(model.optimizer).__name__)
        else:
            loss = args.loss or getattr(model, "loss", None) or "mse"
            optimizer = args.optimizer or (
                model.optimizer if saved else "adam")
            try:
                model.compile(optimizer=optimizer, loss=loss)
            except (ValueError, TypeError) as e:
                raise PlanError("cannot compile the Keras model with loss=%r "
                                "and optimizer=%r: %s; choose others with "
                                "--loss and --optimizer"
                                % (loss, optimizer, e)) from None
            if not saved:
                notes.append(
                    "The model was saved without a training configuration; "
                    "compiled with loss=%r and optimizer=%r (change with "
                    "--loss and --optimizer; optimizer slots count as device "
                    "memory)." % (loss if isinstance(loss, str) else
                                  getattr(loss, "__name__", loss),
                                  optimizer if isinstance(optimizer, str)
                                  else type(optimizer).__name__))
        if not hasattr(model.optimizer, "get_updates"):
            raise PlanError(
                "the optimizer %s cannot build a graph-mode training step; "
                "%s" % (type(model.optimizer).__name__, _CLI_FIX))
        # The training graph fit() would run: forward, backward, updates.
        model._make_train_function()
        _shape_targets(model)
        # Named as a MetaGraph's train op is, for --oracle and `verify`.
        updates = getattr(model.train_function, "updates_op", None)
        if updates is not None:
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP,
                                           updates)
    return notes, reader.keras_train_fetches(graph, model)


def _pick_meta_graph(saved_model, path, tag):
    metas = list(saved_model.meta_graphs)
    if not metas:
        raise PlanError("the SavedModel %s holds no MetaGraph" % path)
    available = [sorted(m.meta_info_def.tags) for m in metas]
    if tag:
        wanted = sorted(t.strip() for t in tag.split(",") if t.strip())
        for meta, tags in zip(metas, available):
            if tags == wanted:
                return meta, tags
        raise PlanError("the SavedModel %s has no MetaGraph tagged %s; it has "
                        "%s. Pass one of those to --tag."
                        % (path, ",".join(wanted), "; ".join(
                            ",".join(t) for t in available)))
    for meta, tags in zip(metas, available):
        if "train" in tags:
            return meta, tags
    return metas[0], available[0]


def _load_savedmodel(path, graph, args):
    from tensorflow.core.protobuf import saved_model_pb2
    from google.protobuf import text_format
    import tensorflow as tf
    saved_model = saved_model_pb2.SavedModel()
    pb = os.path.join(path, "saved_model.pb")
    if os.path.exists(pb):
        with open(pb, "rb") as f:
            saved_model.ParseFromString(f.read())
    else:
        with open(os.path.join(path, "saved_model.pbtxt"),
                  encoding="utf-8") as f:
            text_format.Merge(f.read(), saved_model)
    meta, tags = _pick_meta_graph(saved_model, path, args.tag)
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
    return ["Loaded the MetaGraph tagged %s." % ",".join(tags)]


def load_graph(path, args):
    """Load `path` into a fresh graph.

    Args:
      path: a .meta file, a SavedModel folder or a Keras model.
      args: parsed ``plan`` arguments (for --loss, --optimizer, --tag).

    Returns:
      A `LoadedGraph`.

    Raises:
      PlanError: with what went wrong and what to do.
    """
    from tflms.tf import keras3_trace
    import tensorflow as tf
    if not os.path.exists(path):
        raise PlanError("%s does not exist" % path)
    if is_keras3_plan(path, args):
        traced = keras3_trace.load(path, args.batch_size, args.loss,
                                  args.optimizer, args.inference)
        return LoadedGraph(
            graph=traced.graph, training=traced.training, notes=traced.notes,
            kind="Keras 3 model (%s)" % os.path.splitext(path.lower())[1],
            fetches=traced.fetches, traced=traced)
    graph = tf.Graph()
    lower = path.lower()
    fetches = None
    if os.path.isdir(path):
        if _is_keras_savedmodel(path):
            kind = "Keras SavedModel"
            notes, fetches = _load_keras(path, graph, args)
        elif _is_savedmodel(path):
            kind = "SavedModel"
            notes = _load_savedmodel(path, graph, args)
        else:
            raise PlanError(
                "%s is a folder without saved_model.pb; GRAPH must be a "
                "MetaGraph file (.meta), a SavedModel folder or a Keras model "
                "(.h5, .keras, or a Keras SavedModel folder)" % path)
    elif lower.endswith(_KERAS_EXTENSIONS):
        kind = "Keras model (%s)" % os.path.splitext(lower)[1]
        notes, fetches = _load_keras(path, graph, args)
    elif lower.endswith(".meta"):
        kind = "MetaGraph"
        with graph.as_default():
            try:
                tf.compat.v1.train.import_meta_graph(path)
            except Exception as e:
                raise PlanError("cannot import the MetaGraph %s: %s"
                                % (path, e)) from None
        notes = []
    else:
        raise PlanError(
            "cannot tell what %s is from its name; GRAPH must be a MetaGraph "
            "file (.meta), a SavedModel folder or a Keras model (.h5, .keras, "
            "or a Keras SavedModel folder)" % path)

    training = _has_backward(graph)
    if not training:
        from tflms.graph_index import PARTITIONED_CALL_TYPES
        calls = [op for op in graph.get_operations()
                 if op.type in PARTITIONED_CALL_TYPES]
        if calls:
            raise PlanError(
                "%s keeps its computation inside TensorFlow 2 functions "
                "(%d %s ops), which LMS cannot rewrite: LMS works on "
                "tf.compat.v1 graphs. Save a Keras model with model.save() "
                "(.h5 or a Keras SavedModel folder), or export the training "
                "graph as a MetaGraph (tf.compat.v1.train.export_meta_graph) "
                "and plan that." % (path, len(calls), calls[0].type))
    return LoadedGraph(graph=graph, kind=kind, training=training, notes=notes,
                       fetches=fetches)


def is_keras3_plan(path, args):
    """`tflms plan`, `verify` or `capacity` of a file saved by Keras 3 where
    Keras 3 is installed, in a process whose eager execution is on (the
    command's own is): traced as a `tf.function` (`tflms.tf.keras3_trace`),
    or trained with and without ``lms.function`` (`tflms.tf.verify_keras3`)."""
    from tflms.tf import keras3_trace
    import tensorflow as tf
    return (getattr(args, "command", "plan") in ("plan", "verify",
                                                 "capacity")
            and path.lower().endswith(_KERAS_EXTENSIONS)
            and os.path.isfile(path) and keras3_trace.is_keras3_file(path)
            and tf.executing_eagerly() and keras3_trace.keras3() is not None)
