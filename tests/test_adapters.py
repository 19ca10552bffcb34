"""The entry points' adapters (tflms/tf/adapters/): which adapter serves
which graph or model, the Session adapter's protocol step by step, and its
witness that the swap ops ran (`session.swaps_in_run_metadata`). The Keras 3
fit adapters are trained in test_keras3_fit.py and
test_keras3_distributed.py, the multi-worker one in test_multi_worker.py."""

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS, EagerModeError, Outcome
from tflms._logging import Logger
from tflms.tf import adapters
from tflms.tf import compat
from tflms.tf.adapters import graph_step
from tflms.tf.adapters import keras2
from tflms.tf.adapters import multi_worker_step
from tflms.tf.adapters import rewrite
from tflms.tf.adapters import session
from tflms.tf.adapters import tf_function

from tests import _graphs

FIXED = dict(swapout_threshold=2, swapin_ahead=1, swapin_groupby=0)
QUIET = Logger()


def test_each_graph_goes_to_its_adapter():
    graph, _ = _graphs.dense_net()
    lms = LMS(**FIXED)
    assert type(adapters.graph_adapter(graph, lms.settings, QUIET)) is (
        session.SessionGraph)

    @tf.function
    def step(x):
        return tf.reduce_sum(x * 2.0)

    func_graph = step.get_concrete_function(
        tf.TensorSpec([4], tf.float32)).graph
    assert type(adapters.graph_adapter(func_graph, lms.settings,
                                           QUIET)) is (
        tf_function.FunctionStep)
    # A function graph reading no distributed variable is no worker's step.
    assert not multi_worker_step.MultiWorkerStep.accepts(func_graph)
    assert not session.SessionGraph.accepts(func_graph)
    with pytest.raises(ValueError, match=r"^graph must be a tf.Graph; got 3"):
        adapters.graph_adapter(3, lms.settings, QUIET)


def test_the_registries_ask_specialised_adapters_first():
    # A subclass is asked before the adapter it specialises, or it would
    # never be chosen.
    for registry in (adapters.GRAPH_ADAPTERS, adapters.FIT_ADAPTERS):
        for i, early in enumerate(registry):
            for late in registry[i + 1:]:
                assert not issubclass(late, early), (late, early)
    assert adapters.GRAPH_ADAPTERS[-1] is session.SessionGraph
    assert issubclass(multi_worker_step.MultiWorkerStep,
                      tf_function.FunctionStep)


def test_the_session_adapter_finds_indexes_plans_and_applies():
    graph, handles = _graphs.dense_net(depth=6)
    lms = LMS(**FIXED)
    adapter = adapters.graph_adapter(graph, lms.settings, QUIET,
                                     [handles["train"]])
    found = adapter.find_step()
    assert isinstance(found, graph_step.TrainingStep)
    assert [op.name for op in found.fetches.ops] == ["train"]
    index = adapter.index(found)
    assert [index.names[f] for f in index.fetches] == ["train"]
    # The step is the fetch's fan-in: the gradients never read the loss's
    # value, so the loss op is not in it.
    assert "dense0/Relu" in index.id_of and "loss" not in index.id_of
    before = len(graph.get_operations())
    result = adapter.rewrite()
    assert result.outcome is Outcome.REWRITTEN
    added = len(result.swapout_ops) + len(result.swapin_ops)
    assert added > 0
    assert len(graph.get_operations()) == before + added
    # The graph holds the swap ops now: a second adapter leaves it alone.
    again = adapters.graph_adapter(graph, lms.settings, QUIET,
                                   [handles["train"]]).rewrite()
    assert again.outcome is Outcome.ALREADY_REWRITTEN


def test_the_two_rewrites_take_settings_not_an_lms():
    # Below LMS: a Session graph and a function graph, each rewritten from
    # settings alone; each refuses the other's graph with what to do.
    graph, handles = _graphs.dense_net(depth=6)
    settings = LMS(**FIXED).settings
    result = rewrite.rewrite_session_graph(graph, settings,
                                           fetches=[handles["train"]])
    assert result.outcome is Outcome.REWRITTEN and result.swapout_ops

    @tf.function
    def step(x):
        return tf.reduce_sum(x * 2.0)

    func_graph = step.get_concrete_function(
        tf.TensorSpec([4], tf.float32)).graph
    with pytest.raises(ValueError, match=r"^graph must be a tf.function's "
                       r"graph \(a FuncGraph\); got .*lms.run\(graph\)"):
        rewrite.rewrite_function_graph(graph, settings)
    with pytest.raises(EagerModeError, match="LMS cannot edit the graph of "
                       "a tf.function"):
        rewrite.rewrite_session_graph(func_graph, settings)


def test_rewrites_own_already_rewritten():
    # One LMS's record: the graph it planned gets the same answer, which
    # is not new (no Keras session renewed for it); its settings are read
    # at each rewrite.
    graph, handles = _graphs.dense_net(depth=6)
    lms = LMS(**FIXED)
    rewrites = lms.rewrites
    lms.batch_size = 7
    assert rewrites.settings.batch_size == 7
    lms.batch_size = None
    first = rewrites.session_graph(graph, [handles["train"]])
    assert first.rewritten and rewrites.is_new(first)
    assert rewrites.earlier(graph) is first
    again = rewrites.session_graph(graph, [handles["train"]])
    assert again is first and not rewrites.is_new(again)
    assert lms.last_run is first
    # Another object sees the graph's own mark instead.
    other = LMS(**FIXED).rewrites.session_graph(graph, [handles["train"]])
    assert other.outcome is Outcome.ALREADY_REWRITTEN


def test_the_session_witness_names_the_swap_ops_that_ran():
    graph, handles = _graphs.dense_net(depth=6)
    lms = LMS(**FIXED)
    result = lms.run(graph)
    assert result.rewritten
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(handles["init"])
        metadata = tf.compat.v1.RunMetadata()
        sess.run(handles["train"], handles["feed"],
                 options=_graphs.trace_options(), run_metadata=metadata)
    ran = session.swaps_in_run_metadata(result, metadata)
    assert ran.all_ran, str(ran)
    assert set(ran.ran) == set(result.swapout_ops) | set(result.swapin_ops)
    assert all(d.lower().endswith("cpu:0") for d in ran.ran.values())
    # A step that never ran them: all missing, none claimed.
    empty = session.swaps_in_run_metadata(result, tf.compat.v1.RunMetadata())
    assert (empty.ran, empty.all_ran) == ({}, False)
    assert len(empty.missing) == len(empty.expected) > 0


def test_a_keras2_model_goes_to_the_keras2_adapter():
    keras = compat.keras2()
    graph = tf.Graph()
    with graph.as_default():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse")
        lms = LMS(**FIXED)
        adapter = adapters.fit_adapter(lms.rewrites, model)
        assert type(adapter) is keras2.Keras2Fit
        assert adapter.model is model
        # set_model picks the same adapter for the same model again, so a
        # fit's later calls reach the adapter that planned.
        lms.set_model(model)
        first = lms._fit
        lms.set_model(model)
        assert lms._fit is first
        x = np.ones((4, 8), np.float32)
        model.fit(x, np.zeros((4, 2), np.float32), batch_size=4, epochs=1,
                  verbose=0, callbacks=[lms])
    assert lms.last_run.outcome is Outcome.REWRITTEN
