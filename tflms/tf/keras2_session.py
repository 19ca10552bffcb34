"""Keras glue for the LMS callback: one job, keeping Keras' session in step
with the edited graph.

A TensorFlow session copies the graph into the runtime the first time it
runs anything after new ops were added. Edits made afterwards to ops it has
already copied (such as rerouting an input to a swap-in) are ignored by that
session, with only a C++ warning ("This mutation will have no effect").
Keras creates its session and initializes variables before callbacks are
set up (at model load, at compile, at the first predict...), so after LMS
edits a Keras graph, the variable values move to a fresh session that sees
the edited graph.
"""

import tensorflow as tf

from tflms.tf import compat

__all__ = ["renew_keras_session"]


def renew_keras_session(graph, log, model=None):
    """Give Keras a new session on `graph`, with the current variable values.

    Does nothing when Keras has no session on this graph yet.

    Args:
      graph: the `tf.Graph` LMS just edited.
      log: a `tflms._logging.Logger`.
      model: the Keras model being trained; its package (keras 2.x on
        TensorFlow 2.15, tf_keras on 2.16+) tells which backend holds the
        session.

    Returns:
      True if a new session was made.
    """
    # The Keras 2 backend module (keras.src.backend / tf_keras.src.backend)
    # holds the session Keras uses in graph mode; the public
    # tf.compat.v1.keras.backend exposes get/set_session but not the cached
    # session without creating one.
    backend = (compat.keras_backend_for(model) if model is not None
               else compat.keras2_backend())
    default = tf.compat.v1.get_default_session()
    if default is not None and default.graph is graph:
        log.warning(
            "A default session on this graph is active (a `with sess."
            "as_default():` block). Sessions that already ran the graph do "
            "not see LMS's edits: call LMS before that session first runs, "
            "or create the session after model.fit() has started.")
        return False
    old = getattr(backend._SESSION, "session", None)
    if old is None or old.graph is not graph:
        return False
    with graph.as_default():
        variables = list(backend._get_variables(graph))
        flags = old.run([tf.compat.v1.is_variable_initialized(v)
                         for v in variables]) if variables else []
        initialized = [v for v, f in zip(variables, flags) if f]
        values = old.run(initialized) if initialized else []
    new = tf.compat.v1.Session(graph=graph, config=old._config)
    backend.set_session(new)
    with graph.as_default():
        backend.batch_set_value(list(zip(initialized, values)))
    old.close()
    log.info("Moved %d Keras variables to a new session so that the edited "
             "graph takes effect" % len(initialized), 1)
    return True
