"""Bad input: each gets a clear error (or, where harmless, a logged warning)
and the graph is left exactly as it was.

test_settings.py pins the common constructor and property errors and
test_rewrite.py the first filter, finalized-graph and not-a-graph errors;
this file fills the gaps: the other wrong types and values of every
argument and property, every filter with an unknown scope and an unknown
type, a filter set changed in place after it was assigned, auto-tuning
without a batch size or a GPU size, a graph without training ops, and the
graph of a tf.function.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS, EagerModeError
from tflms import autotune
from tflms import budget
from tflms import simulator

from _graphs import dense_net

FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
FILTERS = ("excl_output_by_scopes", "excl_output_by_types",
           "excl_input_by_scopes", "excl_input_by_types",
           "incl_output_by_scopes", "incl_output_by_types",
           "incl_input_by_scopes", "incl_input_by_types")


def signature(graph):
    return graph.as_graph_def().SerializeToString(deterministic=True)


@pytest.fixture(scope="module")
def mlp():
    """One MLP training graph; every test checks it is left unchanged, so
    they can share it."""
    graph, _ = dense_net(depth=3, width=16)
    return graph


# ---- constructor -----------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"swapout_threshold": None}, r"swapout_threshold .* got None"),
    # repr of a numpy scalar: 2.0 with numpy 1, np.float32(2.0) with numpy 2.
    ({"swapout_threshold": np.float32(2)},
     r"swapout_threshold .* got (2\.0|np\.float32\(2\.0\))$"),
    ({"swapin_ahead": -2}, r"swapin_ahead must be a positive int or -1 "
                           r"\(auto\); got -2"),
    ({"swapin_ahead": 1.5}, r"swapin_ahead .* got 1.5"),
    ({"swapin_ahead": "1"}, r"swapin_ahead .* got '1'"),
    ({"swapin_ahead": True}, r"swapin_ahead .* got True"),
    ({"swapin_groupby": 0.5}, r"swapin_groupby must be an int >= 0 or -1 "
                              r"\(auto\); got 0.5"),
    ({"swapin_groupby": "0"}, r"swapin_groupby .* got '0'"),
    ({"swapin_groupby": False}, r"swapin_groupby .* got False"),
    ({"sync_mode": -1}, r"sync_mode must be 0 \(async\), 1 \(sync swap-outs\)"
                        r", 2 \(sync swap-ins\) or 3 \(both\); got -1"),
    ({"sync_mode": True}, r"sync_mode .* got True"),
    ({"sync_mode": 2.0}, r"sync_mode .* got 2.0"),
    ({"serialization": None}, r"serialization must be a list of level "
                              r"indices or 'a:b' slice strings, e.g. "
                              r"\[1, '3:5'\]; got None"),
    ({"serialization": 5}, r"serialization must be a list .* got 5"),
    ({"serialization": [True]},
     r"serialization entries must be ints or 'a:b' strings; got True"),
    ({"serialization": ["a:b"]}, r"serialization entry 'a:b' cannot be "
                                 r"parsed; use a level index such as 7 or a "
                                 r"Python slice string such as '3:5'"),
    ({"serialization": ["1:9:0"]}, r"serialization entry '1:9:0' cannot be "
                                   r"parsed"),
    ({"serialization": ["-2"]}, r"serialization entry '-2' cannot be parsed"),
    ({"serialization": [None]}, r"serialization entry None cannot be parsed"),
    ({"serialization_by_size": "1"},
     r"serialization_by_size must be a number of GiB >= 0 \(0 turns it "
     r"off\); got '1'"),
    ({"serialization_by_size": True}, r"serialization_by_size .* got True"),
    ({"serialization_by_size": math.nan}, r"serialization_by_size .* got nan"),
    ({"serialization_by_size": None}, r"serialization_by_size .* got None"),
    ({"debug": None}, r"debug must be True or False; got None"),
    ({"debug": 2}, r"debug must be True or False; got 2"),
    ({"debug": np.array([1, 0])}, r"debug must be True or False; got "
                                  r"array\(\[1, 0\]\)"),
    ({"debug_level": 0}, r"debug_level must be 1 or 2; got 0"),
    ({"debug_level": "2"}, r"debug_level must be 1 or 2; got '2'"),
    ({"debug_level": True}, r"debug_level must be 1 or 2; got True"),
    ({"cpu_device": None}, r"cpu_device must be a device string such as "
                           r"'/cpu:0'; got None"),
    ({"cpu_device": "garbage"}, r"cpu_device='garbage' is not a device "
                                r"string .*; use e.g. '/cpu:0' or "
                                r"'/device:GPU:1'"),
    ({"cpu_device": "/device:GPU:0"},
     r"cpu_device must name a CPU device such as '/cpu:0'; got "
     r"'/device:GPU:0'"),
    ({"cpu_device": "/job:localhost"}, r"cpu_device must name a CPU device"),
    ({"gpu_device": ""}, r"gpu_device must be a device string such as "
                         r"'/cpu:0'; got ''"),
    ({"gpu_device": "/gpu:x"}, r"gpu_device='/gpu:x' is not a device string"),
    ({"gpu_device": "/job:worker/task:1"},
     r"gpu_device must name a device type and index such as "
     r"'/device:GPU:0' \(or be None for every device but the host "
     r"cpu_device\); got "
     r"'/job:worker/task:1'"),
    ({"gpu_device": "/device:CPU:0"},
     r"gpu_device must name an accelerator such as '/device:GPU:0'"),
])
def test_bad_constructor_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LMS(**kwargs)


def test_good_unusual_constructor_arguments():
    """Numpy integers, 0/1 flags and Python slice strings with steps or
    negative bounds are fine."""
    lms = LMS(swapout_threshold=np.int64(3), swapin_ahead=np.int32(2),
              swapin_groupby=np.int8(0), sync_mode=np.int64(1),
              serialization=["1:9:2", "-3:"], serialization_by_size=math.inf,
              debug=np.bool_(True), debug_level=np.int64(2),
              gpu_device="/job:worker/task:1/device:GPU:0")
    assert (lms.swapout_threshold, lms.swapin_ahead, lms.swapin_groupby,
            lms.sync_mode) == (3, 2, 0, 1)
    assert all(type(v) is int for v in (lms.swapout_threshold,  # noqa: E721
                                        lms.sync_mode))


# ---- properties ------------------------------------------------------------
@pytest.mark.parametrize("name, value, message", [
    ("batch_size", -4, r"batch_size must be a positive int or None; got -4"),
    ("batch_size", True, r"batch_size .* got True"),
    ("batch_size", "8", r"batch_size .* got '8'"),
    ("is_training", None, r"is_training must be True or False; got None"),
    ("is_training", "True", r"is_training must be True or False; got 'True'"),
    ("is_training", 2, r"is_training .* got 2"),
    ("autotune_gpu_mem", -1, r"autotune_gpu_mem must be a positive number of "
                             r"GiB or None \(use the GPU's own memory\); "
                             r"got -1"),
    ("autotune_gpu_mem", True, r"autotune_gpu_mem .* got True"),
    ("autotune_gpu_mem", math.inf, r"autotune_gpu_mem .* got inf"),
    ("autotune_gpu_mem", math.nan, r"autotune_gpu_mem .* got nan"),
    ("autotune_host_mem", -2, r"autotune_host_mem must be a positive number "
                              r"of GiB or None \(this machine's physical "
                              r"memory divided by the processes on it\); "
                              r"got -2"),
    ("autotune_host_mem", math.inf, r"autotune_host_mem .* got inf"),
    ("autotune_plot", None, r"autotune_plot must be True or False; got None"),
    ("autotune_plot", "yes", r"autotune_plot .* got 'yes'"),
    ("plot_dir", None, r"plot_dir must be a folder path; got None"),
    ("plot_dir", 3, r"plot_dir must be a folder path; got 3"),
] + [(name, value, message) for name in FILTERS for value, message in (
    (None, r"%s must be a set of strings, e.g. \{'conv1'\}; got None"
     % name),
    (5, r"%s must be a set of strings.* got 5" % name),
    (b"conv1", r"%s must be a set of strings.* got b'conv1'" % name),
    ([""], r"%s must hold non-empty strings; got ''" % name),
    ({"conv1", None}, r"%s must hold non-empty strings; got None" % name),
)])
def test_bad_properties(name, value, message):
    lms = LMS()
    before = getattr(lms, name)
    with pytest.raises(ValueError, match=message):
        setattr(lms, name, value)
    assert getattr(lms, name) == before  # the old value is kept


@pytest.mark.parametrize("name", ["swapout_threshold", "swapin_ahead",
                                  "swapin_groupby", "sync_mode"])
def test_constructor_only_settings_cannot_be_assigned(name):
    """They are validated once, in the constructor; assigning one later is
    an error rather than a silent no-op."""
    lms = LMS(**FIXED)
    with pytest.raises(AttributeError, match=name):
        setattr(lms, name, 2)


# ---- filters at run time ----------------------------------------------------
@pytest.mark.parametrize("name", FILTERS)
def test_unknown_filter_names_are_errors(name, mlp):
    before = signature(mlp)
    kind = name.rsplit("_", 1)[1]  # scopes / types
    pair = name.rsplit("_by_", 1)[0]
    setting = "%s_by_scopes/%s_by_types" % (pair, pair)
    lms = LMS(**FIXED)
    if kind == "scopes":
        setattr(lms, name, {"dense0", "no_such_scope"})
        message = (r"%s: no operation in the graph is in scope "
                   r"'no_such_scope'; check the spelling against the op "
                   r"names" % setting)
    else:
        setattr(lms, name, {"MatMul", "matmul"})
        message = (r"%s: no operation in the graph has type 'matmul'; op "
                   r"types are case-sensitive names such as 'Conv2D'"
                   % setting)
    with pytest.raises(ValueError, match=message):
        lms.run(mlp)
    assert signature(mlp) == before
    assert lms.last_run is None


def test_filter_sets_are_frozen():
    """A filter is checked when it is set; it cannot be changed in place
    afterwards, where no check would see it."""
    lms = LMS(**FIXED)
    lms.excl_output_by_types = ["Conv2D"]
    assert lms.excl_output_by_types == frozenset({"Conv2D"})
    with pytest.raises(AttributeError):
        lms.excl_output_by_types.add("MatMul")
    with pytest.raises(ValueError, match=r"excl_output_by_types must hold "
                                         r"non-empty strings; got 7"):
        lms.excl_output_by_types = {"Conv2D", 7}
    assert lms.excl_output_by_types == frozenset({"Conv2D"})


def test_filters_that_exclude_everything_change_nothing(mlp):
    """Valid filters that leave no candidate: nothing to do, no error."""
    before = signature(mlp)
    lms = LMS(**FIXED)
    lms.incl_output_by_types = {"Mean"}  # the loss: a scalar
    lms.excl_input_by_scopes = {"gradients"}
    # The loss is in the step when it is fetched (the gradients do not
    # read its value).
    result = lms.run(mlp, fetches=mlp.get_collection(
        tf.compat.v1.GraphKeys.TRAIN_OP) + ["loss:0"])
    assert result.swapout_ops == () and result.control_edges == 0
    assert signature(mlp) == before


def test_serialization_beyond_the_last_level_changes_nothing(mlp):
    before = signature(mlp)
    result = LMS(swapout_threshold=10000, swapin_ahead=1, swapin_groupby=0,
                 serialization=[5000, "6000:"]).run(mlp)
    assert result.swapout_ops == () and result.control_edges == 0
    assert signature(mlp) == before


# ---- auto-tuning without what it needs -------------------------------------
def unknown_batch_graph():
    graph, _ = dense_net(depth=3, width=16, batch=None)
    return graph


def test_autotune_without_batch_size_says_what_to_set():
    graph = unknown_batch_graph()
    before = signature(graph)
    lms = LMS()
    lms.autotune_gpu_mem = 1
    with pytest.raises(simulator.BatchSizeError, match=(
            r"LMS cannot size tensor 'x:0' \(shape \(\?, 32\)\) without the "
            r"mini-batch size: set lms.batch_size = <your mini-batch size> "
            r"or set swapout_threshold, swapin_ahead and swapin_groupby by "
            r"hand")):
        lms.run(graph)
    assert signature(graph) == before
    # Fixed parameters never need the batch size; with it, tuning works.
    assert LMS(**FIXED).run(unknown_batch_graph()).swapout_ops
    lms.batch_size = 16
    lms.run(graph)  # fits in 1 GiB: not needed, or a plan; no error


def test_autotune_without_a_gpu_or_its_size(monkeypatch):
    monkeypatch.setattr(budget, "_list_local_devices", lambda: [])
    graph, _ = dense_net(depth=3, width=16)
    before = signature(graph)
    with pytest.raises(autotune.NoGpuError, match=(
            r"LMS auto-tuning needs the GPU memory size, but TensorFlow sees "
            r"no GPU on this machine. Set lms.autotune_gpu_mem = <GiB of the "
            r"GPU you plan for>")):
        LMS().run(graph)
    assert signature(graph) == before


# ---- graphs LMS should not or cannot edit ----------------------------------
def forward_only_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 16])
        h = x
        for i in range(4):
            h = tf.compat.v1.layers.dense(h, 16, activation=tf.nn.relu,
                                          name="d%d" % i)
        tf.reduce_mean(h, name="out")
    return g


def test_graph_without_training_ops_logs_a_warning(caplog):
    """Harmless (nothing is read far away, so nothing is swapped), but
    is_training=True on a forward-only graph is most likely a mistake."""
    import logging
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    logging.getLogger("tensorflow").propagate = True
    caplog.set_level(logging.WARNING, logger="tensorflow")
    graph = forward_only_graph()
    before = signature(graph)
    result = LMS(**FIXED).run(graph)
    assert result.swapout_ops == ()
    assert signature(graph) == before
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "[LMS]" in r.getMessage()]
    assert any("no training operations" in w and "is_training = False" in w
               for w in warnings), warnings
    caplog.clear()
    lms = LMS(**FIXED)
    lms.is_training = False
    lms.run(forward_only_graph())
    assert not [r for r in caplog.records if "no training operations"
                in r.getMessage()]


def tf_function_graph():
    @tf.function
    def step(x):
        h = x
        for _ in range(4):
            h = tf.nn.relu(tf.matmul(h, h))
        return tf.reduce_sum(h)
    return step.get_concrete_function(
        tf.TensorSpec([8, 8], tf.float32)).graph


FUNCTION_MESSAGE = (r"LMS cannot edit the graph of a tf.function \(FuncGraph "
                    r"'.*step.*'\).*Call tf.compat.v1.disable_eager_execution"
                    r"\(\) at the start of your program")


def test_the_graph_of_a_tf_function_is_refused():
    graph = tf_function_graph()
    before = signature(graph)
    with pytest.raises(EagerModeError, match=FUNCTION_MESSAGE):
        LMS(**FIXED).run(graph)
    # run() with no graph while the function graph is the default one, as
    # when LMS is called inside a tf.function being traced.
    with graph.as_default():
        with pytest.raises(EagerModeError, match=FUNCTION_MESSAGE):
            LMS(**FIXED).run()
    assert signature(graph) == before
