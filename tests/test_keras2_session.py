"""`tflms.tf.keras2_session.renew_keras_session`: after LMS edits a Keras 2
graph the variables move to a new session that sees the edits, and nothing
happens where no Keras session runs the graph."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS
from tflms.tf import compat
from tflms.tf import swaps_ran
from tflms.tf.keras2_session import renew_keras_session
from tflms._logging import Logger


# What TensorFlow itself decides: run on both stacks (tools/run_tests.sh).
pytestmark = pytest.mark.both_stacks


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
        assert old._closed
        np.testing.assert_array_equal(
            new.run(kernel), np.arange(12, dtype=np.float32).reshape(4, 3))


def test_an_active_default_session_is_not_replaced(caplog):
    caplog.set_level(logging.WARNING)
    graph = tf.Graph()
    _, model = _model_in(graph)
    with graph.as_default(), tf.compat.v1.Session(graph=graph).as_default():
        assert renew_keras_session(graph, Logger(), model) is False
    assert "A default session on this graph is active" in caplog.text


def _swap_ops_that_ran(session, fetch, feed):
    """Names of LMS's swap ops in the partition graphs of one run."""
    options = tf.compat.v1.RunOptions(output_partition_graphs=True)
    metadata = tf.compat.v1.RunMetadata()
    session.run(fetch, feed, options=options, run_metadata=metadata)
    return swaps_ran.swap_ops_in_graph_defs(metadata.partition_graphs)


@pytest.mark.numerics
def test_the_new_session_runs_the_edited_step_from_the_same_values():
    """A session that ran the step before LMS edited it keeps running the
    old step (TensorFlow ignores edits to ops it already copied); the
    renewed session runs the swap ops and trains on from the same values
    as a graph without LMS."""
    results = {}
    for use_lms in (False, True):
        graph = tf.Graph()
        keras, model = _model_in(graph)
        backend = compat.keras_backend_for(model)
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [8, 4], name="x")
            hidden = keras.layers.Dense(16, activation="relu")(x)
            loss = tf.reduce_sum(tf.square(model(hidden[:, :4] + x)))
            train = tf.compat.v1.train.GradientDescentOptimizer(
                0.01).minimize(loss)
            old = backend.get_session()
            # The same starting weights in both graphs.
            weights = tf.compat.v1.trainable_variables()
            backend.batch_set_value([
                (w, np.cos(np.arange(np.prod(w.shape))).reshape(w.shape))
                for w in weights])
            feed = {x: np.linspace(-1, 1, 32).reshape(8, 4)}
            old.run(train, feed)
            if use_lms:
                LMS(swapout_threshold=1, swapin_ahead=1,
                    swapin_groupby=0).run(graph, fetches=[train])
                # A second step on the old session: no swap op runs.
                assert _swap_ops_that_ran(old, train, feed) == {}
                before = old.run(weights)
                assert renew_keras_session(graph, Logger(), model) is True
                new = backend.get_session()
                for value, weight in zip(before, weights):
                    np.testing.assert_array_equal(new.run(weight), value)
                # The third step on the new one: they do.
                assert _swap_ops_that_ran(new, train, feed)
            else:
                new = old
                new.run(train, feed)
                new.run(train, feed)
            results[use_lms] = new.run([loss] + weights, feed)
    for without, with_lms in zip(results[False], results[True]):
        np.testing.assert_allclose(with_lms, without, rtol=1e-6)
