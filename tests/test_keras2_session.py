"""`tflms.tf.keras2_session.renew_keras_session`: after LMS edits a Keras 2 graph the
variables move to a new session that sees the edits, and nothing happens
where no Keras session runs the graph."""

import logging

import numpy as np
import tensorflow as tf

from tflms.tf import compat
from tflms.tf.keras2_session import renew_keras_session
from tflms._logging import Logger


def _model_in(graph):
    keras = compat.keras2()
    with graph.as_default():
        model = keras.Sequential([keras.Input((4,)),
                                  keras.layers.Dense(3, name="dense")])
    return keras, model


def test_no_keras_session_on_the_graph_is_left_alone():
    graph = tf.Graph()
    _, model = _model_in(graph)
    assert renew_keras_session(tf.Graph(), Logger(), model) is False


def test_variables_move_to_a_new_session_with_their_values():
    graph = tf.Graph()
    _, model = _model_in(graph)
    backend = compat.keras_backend_for(model)
    with graph.as_default():
        old = backend.get_session()  # makes and initializes the variables
        kernel = model.get_layer("dense").kernel
        old.run(kernel.assign(np.arange(12, dtype=np.float32).reshape(4, 3)))
        assert renew_keras_session(graph, Logger(), model) is True
        new = backend.get_session()
        assert new is not old
        assert old._closed  # pylint: disable=protected-access
        np.testing.assert_array_equal(
            new.run(kernel), np.arange(12, dtype=np.float32).reshape(4, 3))


def test_an_active_default_session_is_not_replaced(caplog):
    caplog.set_level(logging.WARNING)
    graph = tf.Graph()
    _, model = _model_in(graph)
    with graph.as_default(), tf.compat.v1.Session(graph=graph).as_default():
        assert renew_keras_session(graph, Logger(), model) is False
    assert "A default session on this graph is active" in caplog.text
