"""Every setting: accepted values and the error message for each bad one,
checked through `tflms.settings.Settings` (the one place the checks live)
and through the `LMS` constructor and properties made from it."""

import pytest

from tflms import LMS, settings

FILTERS = settings.FILTER_NAMES


BAD_CONSTRUCTOR_ARGUMENTS = [
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
    ({"serialization": ["3-5"]},
     r"serialization entry '3-5' cannot be parsed"),
    ({"serialization": ["1:2:3:4"]}, r"serialization entry '1:2:3:4'"),
    ({"serialization": [-1]}, r"serialization level must be >= 0; got -1"),
    ({"serialization": [1.0]}, r"serialization entry 1.0 cannot be parsed"),
    ({"serialization_by_size": -1},
     r"serialization_by_size must be a number of GiB >= 0 .* got -1"),
    ({"debug_level": 3}, r"debug_level must be 1 or 2; got 3"),
    ({"debug": "yes"}, r"debug must be True or False; got 'yes'"),
    ({"recompute": "on"},
     r"recompute must be None \(recompute where it shortens an auto-tuned "
     r"plan's predicted step\), True .* or False \(never\); got 'on'"),
    ({"cpu_device": "/gpu:0"},
     r"cpu_device must name a CPU device such as '/cpu:0'; got '/gpu:0'"),
    ({"cpu_device": ""}, r"cpu_device must be a device string"),
    ({"gpu_device": "/cpu:0"}, r"gpu_device must name an accelerator"),
    ({"gpu_device": 0}, r"gpu_device must be a device string"),
    ({"offload_optimizer": "yes"},
     r"offload_optimizer must be True \(optimizer slots and updates on the "
     r"host, cpu_device\), 'auto' \(there only when no plan fits "
     r"without\) or False .* got 'yes'"),
    ({"offload_optimizer": None}, r"offload_optimizer must be .* got None"),
]


@pytest.mark.parametrize("kwargs, message", BAD_CONSTRUCTOR_ARGUMENTS)
def test_bad_constructor_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LMS(**kwargs)


def test_good_constructor_arguments():
    lms = LMS(swapout_threshold=3, swapin_groupby=0, swapin_ahead=2,
              sync_mode=3, recompute=True,
              serialization=[1, "3:5", " 7 ", "10:"],
              serialization_by_size=0.5, debug=True, debug_level=2,
              cpu_device="/device:CPU:0", gpu_device="/device:GPU:1",
              offload_optimizer=True)
    assert lms.offload_optimizer is True
    assert LMS(offload_optimizer="auto").offload_optimizer == "auto"
    assert (lms.swapout_threshold, lms.swapin_ahead, lms.swapin_groupby,
            lms.sync_mode) == (3, 2, 0, 3)
    # The default, None, recomputes when auto-tuning only.
    assert lms.recompute is True and LMS().recompute is None
    assert LMS(recompute=False).recompute is False
    assert LMS().swapout_threshold == -1


BAD_PROPERTIES = [
    ("batch_size", 0, r"batch_size must be a positive int or None; got 0"),
    ("batch_size", 2.0, r"batch_size .* got 2.0"),
    ("is_training", "no", r"is_training must be True or False; got 'no'"),
    ("order_peaks", "yes", r"order_peaks must be True or False; got 'yes'"),
    ("autotune_gpu_mem", 0, r"autotune_gpu_mem must be a positive number"),
    ("autotune_gpu_mem", "8", r"autotune_gpu_mem .* got '8'"),
    ("autotune_host_mem", 0, r"autotune_host_mem must be a positive number"),
    ("autotune_host_mem", "64", r"autotune_host_mem .* got '64'"),
    ("autotune_plot", 2, r"autotune_plot must be True or False; got 2"),
    ("grappler_check", "yes",
     r"grappler_check must be True or False; got 'yes'"),
    ("grappler_repair", "auto",
     r"grappler_repair must be True or False; got 'auto'"),
    ("excl_output_by_scopes", "conv1",
     r"excl_output_by_scopes must be a set of strings, e.g. \{'conv1'\}; "
     r"got 'conv1'"),
    ("incl_input_by_types", {"Conv2D", 3},
     r"incl_input_by_types must hold non-empty strings; got 3"),
    ("plot_dir", "", r"plot_dir must be a folder path"),
    ("interconnect", "pcie6",
     r"^interconnect must be one of pcie3, pcie4, pcie5, nvlink2, "
     r"nvlink-c2c, or 'instant' to count copies as taking no time; got "
     r"'pcie6'$"),
    ("gpu", "P100",
     r"^gpu must be one of V100-SXM2-16GB, V100-SXM2-32GB, A100-SXM4-40GB, "
     r"A100-SXM4-80GB, H100-SXM5-80GB, H100-PCIe-80GB \(the GPU whose op "
     r"times pace the "
     r"copies when counting their memory\); got 'P100'$"),
] + [(name, value, message % name)
     for name in FILTERS for value, message in (
         ("conv1", r"%s must be a set of strings, e.g. \{'conv1'\}; "
                   r"got 'conv1'"),
         ({""}, r"%s must hold non-empty strings; got "))]


@pytest.mark.parametrize("name, value, message", BAD_PROPERTIES)
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
    a.incl_input_by_scopes = a.incl_input_by_scopes | {"gradients"}
    assert (a.batch_size, a.is_training, a.autotune_gpu_mem,
            a.autotune_plot) == (8, False, 16.0, True)
    assert a.excl_output_by_types == {"Conv2D"}
    assert a.incl_input_by_scopes == {"gradients"}
    # No state shared between instances through mutable defaults.
    assert b.incl_input_by_scopes == set() and b.batch_size is None


def _bad_values():
    """``(setting, bad value, message)`` for every pinned bad value."""
    rows = [(name, value, message) for kwargs, message in
            BAD_CONSTRUCTOR_ARGUMENTS for name, value in kwargs.items()]
    return rows + list(BAD_PROPERTIES)


def test_every_setting_has_a_pinned_bad_value():
    pinned = {name for name, _, _ in _bad_values()}
    assert pinned == {f.name for f in settings.fields()}


@pytest.mark.parametrize("name, value, message", _bad_values())
def test_settings_reject_bad_values(name, value, message):
    with pytest.raises(ValueError, match=message):
        settings.Settings(**{name: value})
    with pytest.raises(ValueError, match=message):
        settings.Settings().replace(**{name: value})


def test_settings_are_frozen_and_reject_unknown_names():
    chosen = settings.Settings(swapout_threshold=3)
    with pytest.raises(AttributeError):
        chosen.swapout_threshold = 4
    with pytest.raises(ValueError, match=r"unknown LMS setting\(s\) "
                       r"swapout_treshold; the settings are "
                       r"swapout_threshold, "):
        chosen.replace(swapout_treshold=4)


def test_constructor_settings_are_read_only_properties():
    lms = LMS(swapout_threshold=3)
    for field in settings.fields(settings.CONSTRUCTOR):
        with pytest.raises(AttributeError):
            setattr(lms, field.name, getattr(lms, field.name))
    assert lms.settings == settings.Settings(swapout_threshold=3)


def test_lms_exposes_every_setting():
    """Every setting reads back from an LMS; the constructor's are taken
    by name (all at once, as given), the others only as attributes."""
    lms = LMS()
    for field in settings.fields():
        assert getattr(lms, field.name) == field.default, field.name
    given = {f.name: f.default for f in settings.fields(settings.CONSTRUCTOR)}
    lms = LMS(**given)
    assert {name: getattr(lms, name) for name in given} == given
    for field in settings.fields(settings.PROPERTY):
        with pytest.raises(TypeError, match=field.name):
            LMS(**{field.name: field.default})


def test_values_are_normalised_once():
    chosen = settings.Settings(
        serialization=[1, " 3:5 "], autotune_gpu_mem=16,
        excl_output_by_types=["Conv2D", "Conv2D"])
    assert chosen.serialization == (1, " 3:5 ")
    assert chosen.serialization_levels == (slice(1, 2), slice(3, 5))
    assert chosen.autotune_gpu_mem == 16.0
    assert chosen.excl_output_by_types == frozenset({"Conv2D"})
    # Checking a checked value changes nothing (LMS(**settings) is safe).
    assert settings.Settings(**{f.name: getattr(chosen, f.name)
                                for f in settings.fields()}) == chosen
