"""The `LMS` object itself (tflms/lms.py): its settings as attributes,
`run()`'s answers for a graph it has planned, rewritten or cannot edit,
and the summary line it logs (tflms/run_log.py; its other lines:
tests/test_run_log.py). How plans are made and trained is tested
elsewhere (test_pipeline, test_integrations...)."""

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS, Outcome
from tflms import run_log
from tflms.tf.lms_function import LMSFunction
from tflms import settings as S
from tflms.results import EagerModeError

from tests import _graphs

FIXED = dict(swapout_threshold=2, swapin_ahead=1, swapin_groupby=0)


def test_constructor_arguments_are_its_settings():
    lms = LMS(swapout_threshold=7, swapin_ahead=2, swapin_groupby=1,
              sync_mode=3, recompute=True, serialization=[1, "3:5"],
              gpu_device="/device:GPU:1")
    assert lms.settings == S.Settings(
        swapout_threshold=7, swapin_ahead=2, swapin_groupby=1, sync_mode=3,
        recompute=True, serialization=[1, "3:5"],
        gpu_device="/device:GPU:1")
    assert (lms.swapout_threshold, lms.sync_mode, lms.serialization) == (
        7, 3, (1, "3:5"))


def test_every_setting_is_an_attribute_and_properties_are_checked():
    lms = LMS()
    for field in S.fields():
        assert getattr(lms, field.name) == getattr(lms.settings, field.name)
    lms.batch_size = 32
    lms.autotune_host_mem = 48
    assert (lms.settings.batch_size, lms.settings.autotune_host_mem) == (
        32, 48.0)
    with pytest.raises(ValueError, match=r"autotune_host_mem .* got -1"):
        lms.autotune_host_mem = -1
    assert lms.autotune_host_mem == 48.0  # a refused value changes nothing


def test_a_constructor_setting_cannot_be_set_later():
    lms = LMS(swapout_threshold=5)
    with pytest.raises(AttributeError, match=(
            r"swapout_threshold is set once, in the constructor: "
            r"LMS\(swapout_threshold=9\)")):
        lms.swapout_threshold = 9
    assert lms.swapout_threshold == 5


def test_from_settings_keeps_every_value():
    chosen = S.Settings(swapout_threshold=4, batch_size=8,
                        autotune_gpu_mem=2, is_training=False)
    lms = LMS.from_settings(chosen)
    assert lms.settings is chosen
    assert (lms.swapout_threshold, lms.batch_size, lms.autotune_gpu_mem,
            lms.is_training) == (4, 8, 2, False)
    with pytest.raises(ValueError, match="settings must be a "
                                         "tflms.settings.Settings; got"):
        LMS.from_settings({"swapout_threshold": 4})


def test_a_second_run_on_the_same_graph_gives_the_same_result(lms_log):
    graph, _ = _graphs.dense_net(depth=6, batch=16)
    lms = LMS(**FIXED)
    first = lms.run(graph)
    assert first.outcome is Outcome.REWRITTEN and first.swapout_ops
    ops = len(graph.get_operations())
    again = lms.run(graph)
    assert again is first and lms.last_run is first
    assert len(graph.get_operations()) == ops
    # Another LMS object sees the swap ops and leaves the graph alone.
    other = LMS(**FIXED).run(graph)
    assert other.outcome is Outcome.ALREADY_REWRITTEN
    assert len(graph.get_operations()) == ops
    assert any("already has LMS swap operations" in line
               for line in lms_log())


def test_run_logs_one_summary_line_of_what_it_did(lms_log):
    graph, _ = _graphs.dense_net(depth=6, batch=16)
    result = LMS(**FIXED).run(graph)
    summaries = [line for line in lms_log()
                 if "Large Model Support rewrote the training step" in line]
    assert len(summaries) == 1
    plan = result.planned.plan
    assert ("%d tensors (%s) go to host memory and back each step" % (
        len(plan.swaps), run_log.size_text(plan.swapout_bytes()))
            in summaries[0])
    assert "%d operations added" % (
        len(result.swapout_ops) + len(result.swapin_ops)) in summaries[0]


def test_run_refuses_graphs_it_cannot_edit():
    with pytest.raises(ValueError, match="graph must be a tf.Graph or None"):
        LMS(**FIXED).run("train")
    graph, _ = _graphs.dense_net(depth=2, batch=4)
    graph.finalize()
    with pytest.raises(ValueError, match="the graph is finalized"):
        LMS(**FIXED).run(graph)

    @tf.function
    def step(x):
        with pytest.raises(EagerModeError, match=r"lms.function\(step_fn\)"):
            LMS(**FIXED).run(tf.compat.v1.get_default_graph())
        return x + 1

    step.get_concrete_function(tf.TensorSpec([2], tf.float32))


def test_function_returns_a_callable_bound_to_this_lms():
    # (Running one is test_lms_function's: the tests run in graph mode, and a
    # missing graph in eager mode is test_integrations'.)
    lms = LMS(**FIXED)
    wrapped = lms.function(lambda x: x * 2)
    assert isinstance(wrapped, LMSFunction)
    assert wrapped.rewrites is lms.rewrites
    assert wrapped.results == {}  # nothing traced or planned yet


def _keras_predictions(lms, x):
    """TFLMSv2's own Keras call, from its tests of loading a Keras model
    for prediction: the model built and compiled in graph mode, then
    ``lms.is_training = False; lms.run(keras=True)`` on the default graph
    before predicting. Without `lms` the same model predicts without LMS."""
    from tflms.tf import compat
    keras = compat.keras2()
    graph = tf.Graph()
    with graph.as_default():
        init = keras.initializers.GlorotUniform
        model = keras.Sequential([
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(8, 3, activation="relu",
                                kernel_initializer=init(seed=1)),
            keras.layers.Conv2D(8, 3, activation="relu",
                                kernel_initializer=init(seed=2)),
            keras.layers.MaxPooling2D(2),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu",
                               kernel_initializer=init(seed=3)),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(3, activation="softmax",
                               kernel_initializer=init(seed=4))])
        model.compile(loss="categorical_crossentropy", optimizer="adadelta")
        if lms is not None:
            lms.is_training = False
            result = lms.run(keras=True)
        else:
            result = None
        predictions = model.predict(x, verbose=0)
    return predictions, result


def test_run_takes_the_keras_argument_of_tflmsv2(lms_log):
    """``run(keras=True)``, as TFLMSv2's Keras tests call it, plans the
    Keras graph (learning-phase branches it does not run left out) and the
    model predicts as without LMS; a non-bool is refused."""
    x = np.random.RandomState(0).rand(4, 12, 12, 1).astype(np.float32)
    base, _ = _keras_predictions(None, x)
    lms = LMS(swapout_threshold=1, swapin_ahead=1, swapin_groupby=1)
    predictions, result = _keras_predictions(lms, x)
    assert result.outcome is Outcome.REWRITTEN and result.swapin_ops
    np.testing.assert_array_equal(predictions, base)
    assert any("run(keras=True)" in line for line in lms_log())
    with pytest.raises(ValueError, match="keras must be True .* got 'yes'"):
        LMS().run(tf.Graph(), keras="yes")
