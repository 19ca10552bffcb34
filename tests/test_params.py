"""Every constructor argument and property: accepted values and the error
message for each bad one."""

import pytest
import tensorflow as tf

from tflms import LMS


@pytest.mark.parametrize("kwargs, message", [
    ({"swapout_threshold": 0},
     r"swapout_threshold must be a positive int or -1 \(auto\); got 0"),
    ({"swapout_threshold": -2}, r"swapout_threshold .* got -2"),
    ({"swapout_threshold": 1.5}, r"swapout_threshold .* got 1.5"),
    ({"swapout_threshold": "3"}, r"swapout_threshold .* got '3'"),
    ({"swapout_threshold": True}, r"swapout_threshold .* got True"),
    ({"swapin_ahead": 0},
     r"swapin_ahead must be a positive int or -1 \(auto\); got 0"),
    ({"swapin_ahead": None}, r"swapin_ahead .* got None"),
    ({"swapin_groupby": -3},
     r"swapin_groupby must be an int >= 0 or -1 \(auto\); got -3"),
    ({"sync_mode": 4}, r"sync_mode must be 0 \(async\), 1 .* got 4"),
    ({"sync_mode": "1"}, r"sync_mode .* got '1'"),
    ({"serialization": "3:5"}, r"serialization must be a list .* got '3:5'"),
    ({"serialization": ["3-5"]}, r"serialization entry '3-5' cannot be parsed"),
    ({"serialization": ["1:2:3:4"]}, r"serialization entry '1:2:3:4'"),
    ({"serialization": [-1]}, r"serialization level must be >= 0; got -1"),
    ({"serialization": [1.0]}, r"serialization entry 1.0 cannot be parsed"),
    ({"serialization_by_size": -1},
     r"serialization_by_size must be a number of GiB >= 0 .* got -1"),
    ({"debug_level": 3}, r"debug_level must be 1 or 2; got 3"),
    ({"debug": "yes"}, r"debug must be True or False; got 'yes'"),
    ({"cpu_device": "/gpu:0"},
     r"cpu_device must name a CPU device such as '/cpu:0'; got '/gpu:0'"),
    ({"cpu_device": ""}, r"cpu_device must be a device string"),
    ({"gpu_device": "/cpu:0"}, r"gpu_device must name an accelerator"),
    ({"gpu_device": 0}, r"gpu_device must be a device string"),
])
def test_bad_constructor_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LMS(**kwargs)


def test_good_constructor_arguments():
    lms = LMS(swapout_threshold=3, swapin_groupby=0, swapin_ahead=2,
              sync_mode=3, serialization=[1, "3:5", " 7 ", "10:"],
              serialization_by_size=0.5, debug=True, debug_level=2,
              cpu_device="/device:CPU:0", gpu_device="/device:GPU:1")
    assert (lms.swapout_threshold, lms.swapin_ahead, lms.swapin_groupby,
            lms.sync_mode) == (3, 2, 0, 3)
    assert LMS().swapout_threshold == -1


@pytest.mark.parametrize("name, value, message", [
    ("batch_size", 0, r"batch_size must be a positive int or None; got 0"),
    ("batch_size", 2.0, r"batch_size .* got 2.0"),
    ("is_training", "no", r"is_training must be True or False; got 'no'"),
    ("autotune_gpu_mem", 0, r"autotune_gpu_mem must be a positive number"),
    ("autotune_gpu_mem", "8", r"autotune_gpu_mem .* got '8'"),
    ("autotune_plot", 2, r"autotune_plot must be True or False; got 2"),
    ("excl_output_by_scopes", "conv1",
     r"excl_output_by_scopes must be a set of strings, e.g. \{'conv1'\}; "
     r"got 'conv1'"),
    ("incl_input_by_types", {"Conv2D", 3},
     r"incl_input_by_types must hold non-empty strings; got 3"),
    ("plot_dir", "", r"plot_dir must be a folder path"),
])
def test_bad_properties(name, value, message):
    lms = LMS()
    with pytest.raises(ValueError, match=message):
        setattr(lms, name, value)


def test_properties_round_trip_and_are_per_instance():
    a, b = LMS(), LMS()
    a.batch_size = 8
    a.is_training = False
    a.autotune_gpu_mem = 16
    a.autotune_plot = True
    a.excl_output_by_types = ["Conv2D"]
    a.incl_input_by_scopes = {"gradients"}
    assert (a.batch_size, a.is_training, a.autotune_gpu_mem,
            a.autotune_plot) == (8, False, 16.0, True)
    assert a.excl_output_by_types == {"Conv2D"}
    assert a.incl_input_by_scopes == {"gradients"}
    # No state shared between instances through mutable defaults.
    assert b.incl_input_by_scopes == set() and b.batch_size is None


def test_is_a_hook_and_a_keras_callback():
    lms = LMS()
    assert isinstance(lms, tf.compat.v1.train.SessionRunHook)
    assert isinstance(lms, tf.keras.callbacks.Callback)
