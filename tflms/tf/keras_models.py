"""Keras 2 models saved with TF2 optimizers, loaded for graph-mode training.

Keras 2.11+ optimizers (``tf.keras.optimizers.SGD``, ``Adam``..., which is
what ``model.compile("sgd")`` makes in eager mode) cannot build a graph-mode
training step: they have no ``get_updates``, and ``model.fit()`` in graph
mode fails inside Keras with ``AttributeError: 'SGD' object has no attribute
'get_updates'`` before any callback runs. Their ``optimizers.legacy``
namesakes can, and take the same settings. `load_model` loads a saved model
(``.h5``, ``.keras``, Keras SavedModel) into the current graph with Keras 2
and recompiles it with the graph-mode optimizer, so LMS can then train it as
a callback; `graph_mode_optimizer` converts one optimizer. ``tflms plan``
uses the same code.

    tf.compat.v1.disable_eager_execution()
    model = tflms.tf.keras_models.load_model("model.h5")
    model.fit(x, y, callbacks=[LMS()])
"""

import json
import os
import zipfile

import tensorflow as tf

from tflms.tf import compat
from tflms._logging import Logger

__all__ = ["graph_mode_optimizer", "load_model", "saved_keras_version",
           "not_a_model_file"]

# Settings of TF2 (Keras 2.11+) optimizers that their legacy graph-mode
# counterparts do not have, with the values that mean "off".
_TF2_ONLY_SETTINGS = {"weight_decay": (None, 0, 0.0), "use_ema": (False,)}
_TF2_IGNORED_SETTINGS = ("ema_momentum", "ema_overwrite_frequency",
                         "jit_compile", "is_legacy_optimizer")

_LIBRARY_FIX = ("compile the model with a graph-mode optimizer from "
                "%s.optimizers.legacy before fit()")


def _keras_name(keras):
    return keras.__name__.split(".")[0]


def _require_keras2():
    keras = compat.keras2()
    if keras is None:
        raise compat.UnsupportedStackError(compat.keras3_message(
            "Loading a Keras model for graph-mode training"))
    return keras


def _optimizer_config(optimizer):
    """`optimizer.get_config()` of a TF2 optimizer, also in a graph.

    Loaded into a graph, its learning rate is a graph variable, which
    get_config cannot read (it calls .numpy()); its initial value, the
    saved one, is read in a throwaway session instead."""
    rate = getattr(optimizer, "_learning_rate", None)
    if not isinstance(rate, tf.Variable) or tf.executing_eagerly():
        return dict(optimizer.get_config())
    with tf.compat.v1.Session(graph=rate.graph) as session:
        session.run(rate.initializer)
        value = float(session.run(rate))
    optimizer._learning_rate = value
    try:
        return dict(optimizer.get_config())
    finally:
        optimizer._learning_rate = rate


def _rate_text(rate):
    return "%.6g" % rate if isinstance(rate, (int, float)) else "a schedule"


def _from_config(name, config, keras, fix):
    """(legacy optimizer `name` with the TF2 settings `config`, note)."""
    config = dict(config)
    package = _keras_name(keras)
    legacy = getattr(getattr(keras.optimizers, "legacy", None), name, None)
    if legacy is None:
        raise compat.UnsupportedStackError(
            "the model was saved with the optimizer %s, which cannot build a "
            "graph-mode training step and has no graph-mode equivalent in "
            "%s.optimizers.legacy; %s" % (name, package, fix))
    for key, off in _TF2_ONLY_SETTINGS.items():
        if key in config and config.pop(key) not in off:
            raise compat.UnsupportedStackError(
                "the model was saved with %s(%s=...), a setting the "
                "graph-mode optimizer %s.optimizers.legacy.%s does not "
                "have; %s"
                % (name, key, package, name, fix))
    for key in _TF2_IGNORED_SETTINGS:
        config.pop(key, None)
    for key in ("clipnorm", "clipvalue", "global_clipnorm"):
        if key in config and config[key] is None:
            del config[key]
    try:
        converted = legacy.from_config(config)
    except (TypeError, ValueError) as e:
        raise compat.UnsupportedStackError(
            "cannot make the graph-mode optimizer %s.optimizers.legacy.%s "
            "from the saved settings %r: %s; %s"
            % (package, name, config, e, fix)) from None
    note = ("The saved optimizer %s is a TF2 optimizer, which cannot build a "
            "graph-mode training step; compiled with its graph-mode "
            "equivalent %s.optimizers.legacy.%s and the same settings "
            "(learning_rate=%s)." % (name, package, name,
                                     _rate_text(config.get("learning_rate"))))
    return converted, note


def _convert(optimizer, keras, fix):
    if hasattr(optimizer, "get_updates"):
        return optimizer, None
    return _from_config(type(optimizer).__name__, _optimizer_config(optimizer),
                        keras, fix)


def graph_mode_optimizer(optimizer):
    """A graph-mode optimizer equal to `optimizer`.

    Args:
      optimizer: a Keras 2 optimizer. A legacy (graph-mode) one is returned
        as is; a TF2 one (``keras.optimizers.SGD``...) is converted to its
        ``keras.optimizers.legacy`` namesake with the same settings.

    Raises:
      UnsupportedStackError: no Keras 2 is installed, the optimizer has no
        legacy namesake (e.g. AdamW), or it uses a setting the legacy one
        lacks (``weight_decay``, ``use_ema``).
    """
    keras = _require_keras2()
    return _convert(optimizer, keras, _LIBRARY_FIX % _keras_name(keras))[0]


def _archive_compile_config(path):
    """(optimizer config, compile config) saved in a `.keras` archive, or
    (None, None).

    Keras 2 cannot compile a `.keras` model saved with a TF2 optimizer while
    loading it into a graph (it then loads it uncompiled and warns about a
    "custom compile()"); the settings are still in the archive."""
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None, None
    compiled = config.get("compile_config") or {}
    optimizer = compiled.get("optimizer")
    if not isinstance(optimizer, dict) or "class_name" not in optimizer:
        return None, None
    return optimizer, compiled


def saved_keras_version(path):
    """The Keras version a saved model file records (``'3.5.0'``), or None.

    A ``.keras`` archive keeps it in ``metadata.json``, an HDF5 file in its
    root attribute ``keras_version``; a folder, a damaged file or one that
    does not say gives None."""
    path = str(path)
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                version = json.loads(archive.read("metadata.json")).get(
                    "keras_version")
        except (OSError, KeyError, ValueError, AttributeError,
                zipfile.BadZipFile):
            return None
        return version if isinstance(version, str) else None
    try:
        import h5py
        if not h5py.is_hdf5(path):
            return None
        with h5py.File(path, "r") as f:
            version = f.attrs.get("keras_version")
    except (ImportError, OSError, ValueError):
        return None
    if isinstance(version, bytes):
        version = version.decode("utf-8", "replace")
    return version if isinstance(version, str) else None


def _is_keras3(version):
    try:
        return version is not None and int(version.split(".")[0]) >= 3
    except ValueError:
        return False


def not_a_model_file(path):
    """Why the file `path` cannot be a saved Keras model, from its first
    bytes (an ``.h5`` that is not HDF5, a ``.keras`` that is not a zip
    archive), or None when it may be one (folders included)."""
    path = str(path)
    if not os.path.isfile(path):
        return None
    lower = path.lower()
    if lower.endswith((".h5", ".hdf5")):
        try:
            import h5py
        except ImportError:
            return None
        if not h5py.is_hdf5(path):
            return ("%s is not an HDF5 file (it does not start with the HDF5 "
                    "signature), so it is no model saved by Keras' "
                    "model.save(); check the path, or save the model again"
                    % path)
    elif lower.endswith(".keras") and not zipfile.is_zipfile(path):
        return ("%s is not a zip archive, so it is no .keras model saved by "
                "model.save(); check the path, or save the model again"
                % path)
    return None


def _keras3_file_message(path, version, keras, error):
    return (
        "%s was saved by Keras %s, and Keras 2 (%s %s, which LMS trains "
        "with: Keras 3 has no graph to rewrite) cannot load a Keras 3 file. "
        "Build the model with Keras 2 (`import tf_keras as keras`, or "
        "tf.keras with TF_USE_LEGACY_KERAS=1 set before Python starts) and "
        "save it from there; a Keras 3 file cannot be converted. To plan "
        "it, or to check that it trains the same with LMS, run `tflms "
        "plan` or `tflms verify` on TensorFlow 2.16+ with Keras 3 "
        "(docs/plan.md). (Keras 2's own error: %s)" % (
            path, version, _keras_name(keras),
            getattr(keras, "__version__", ""), error))


def _names(value):
    """`value` if it is None, a string or a list of strings (what can be
    passed to compile() as saved), else False."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return False


def _recompile(model, optimizer, loss, metrics=None, weighted_metrics=None,
               loss_weights=None):
    model.compile(
        optimizer=optimizer, loss=loss,
        metrics=metrics if metrics is not None else getattr(
            model, "_compile_metrics", None),
        loss_weights=loss_weights if loss_weights is not None else getattr(
            model, "loss_weights", None),
        weighted_metrics=weighted_metrics if weighted_metrics is not None
        else getattr(model, "_compile_weighted_metrics", None))


def _apply_loaded_weights(model, graph, known):
    """Run the weight assignments a `.keras` load left in the graph.

    Keras 2 loads a `.keras` archive's weights with ``variable.assign()``,
    which in graph mode only adds an op: without this, the model would train
    from freshly initialized weights. The assignments made while loading
    that are not variable initializers run once, in creation order, in
    Keras' session (which initializes the variables first)."""
    initializers = set()
    for variable in tf.compat.v1.global_variables():
        initializers.add(variable.initializer.name)
    assigns = [op for op in graph.get_operations()
               if op.name not in known and op.name not in initializers
               and op.type in ("AssignVariableOp", "Assign")]
    if not assigns:
        return
    backend = compat.keras_backend_for(model)
    session = backend.get_session()
    for op in assigns:
        session.run(op)


def _load(path, compile=True, convert=True, fix=None):
    """`load_model` returning (model, notes); `convert=False` leaves a TF2
    optimizer as it is (``tflms plan --optimizer``)."""
    keras = _require_keras2()
    fix = fix or _LIBRARY_FIX % _keras_name(keras)
    graph = tf.compat.v1.get_default_graph()
    known = set(op.name for op in graph.get_operations())
    try:
        model = keras.models.load_model(path, compile=compile)
    except (ImportError, OSError, ValueError, TypeError, KeyError,
            AttributeError) as e:
        version = saved_keras_version(path)
        if _is_keras3(version):
            raise compat.UnsupportedStackError(_keras3_file_message(
                path, version, keras, e)) from None
        raise
    notes = []
    if str(path).lower().endswith(".keras") and not tf.executing_eagerly():
        _apply_loaded_weights(model, graph, known)
    if not compile or not convert:
        return model, notes
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        converted, note = _convert(optimizer, keras, fix)
        if note:
            _recompile(model, converted, getattr(model, "loss", None))
            notes.append(note)
    elif str(path).lower().endswith(".keras"):
        config, compiled = _archive_compile_config(path)
        if config is not None:
            converted, note = _from_config(
                config["class_name"], config.get("config", {}), keras, fix)
            loss = compiled.get("loss")
            metrics = _names(compiled.get("metrics"))
            weighted = _names(compiled.get("weighted_metrics"))
            if isinstance(loss, str) and metrics is not False \
                    and weighted is not False:
                _recompile(model, converted, loss, metrics, weighted,
                           compiled.get("loss_weights"))
                notes.append(note or "Compiled with the saved optimizer.")
            else:
                notes.append(
                    "The .keras archive's loss %r or metrics %r cannot be "
                    "restored in graph mode; the model was loaded without "
                    "compiling: compile it with a graph-mode optimizer from "
                    "%s.optimizers.legacy." % (
                        loss, compiled.get("metrics"), _keras_name(keras)))
    return model, notes


def load_model(path, compile=True):
    """Load a Keras 2 model for graph-mode training.

    Like ``keras.models.load_model`` (with Keras 2: ``tf.keras`` on
    TensorFlow 2.15, tf_keras on 2.16+), into the default graph; a model
    saved with a TF2 optimizer is recompiled with its graph-mode namesake,
    with the same settings, loss and metrics, and a log line says so. Call
    ``tf.compat.v1.disable_eager_execution()`` first to train it with LMS.

    Raises:
      UnsupportedStackError: see `graph_mode_optimizer`.
    """
    model, notes = _load(path, compile=compile)
    log = Logger()
    for note in notes:
        log.warning(note)
    return model
