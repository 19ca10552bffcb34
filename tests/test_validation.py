"""tflms.validation: each check returns the normalised value or raises a
`ValueError` naming the setting, the value and what is allowed.

tests/test_settings.py pins the message of every bad value through
`Settings` and `LMS`; this file tests what the checks return, the values
at their edges, and that they take numpy's scalars without loading numpy.
"""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tflms import hardware
from tflms import validation as v

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("check, name", [
    (v.check_threshold, "swapout_threshold"), (v.check_ahead, "swapin_ahead")])
def test_swap_counts_take_auto_and_positive_ints(check, name):
    assert check(v.AUTO) == -1
    assert check(1) == 1
    # numpy's integers are ints; they come back as Python ints.
    value = check(np.int64(7))
    assert value == 7 and type(value) is int
    for bad in (0, -2, 2.0, True, np.float32(3), None, "4"):
        with pytest.raises(ValueError, match=name + " must be a positive int "
                           "or -1"):
            check(bad)


def test_groupby_takes_zero_and_sync_mode_takes_four_modes():
    assert v.check_groupby(0) == 0 and v.check_groupby(v.AUTO) == -1
    with pytest.raises(ValueError, match="swapin_groupby .* got -2"):
        v.check_groupby(-2)
    assert [v.check_sync_mode(m) for m in range(4)] == [0, 1, 2, 3]
    for bad in (-1, 4, v.AUTO, 1.0):
        with pytest.raises(ValueError, match="sync_mode"):
            v.check_sync_mode(bad)


def test_booleans_take_0_1_and_numpy_bools_and_refuse_none():
    for value, expected in ((True, True), (0, False), (1, True),
                            (np.bool_(True), True), (np.bool_(False), False)):
        got = v.check_bool("debug", value)
        assert got is expected, value
    for bad in (None, 2, "True", 1.0):
        with pytest.raises(ValueError, match="debug must be True or False"):
            v.check_bool("debug", bad)
    # recompute has a third answer, None (auto-tuned plans decide).
    assert v.check_recompute(None) is None
    assert v.check_recompute(np.bool_(True)) is True
    with pytest.raises(ValueError, match="recompute must be None"):
        v.check_recompute(2)


@pytest.mark.parametrize("check, name", [(v.check_gpu_mem, "autotune_gpu_mem"),
                                         (v.check_host_mem,
                                          "autotune_host_mem")])
def test_memory_sizes_are_finite_positive_gib(check, name):
    assert check(None) is None
    value = check(16)
    assert value == 16.0 and type(value) is float
    assert check(np.float32(0.5)) == 0.5
    for bad in (0, -1, math.inf, math.nan, True, "16"):
        with pytest.raises(ValueError, match=name + " must be a positive "
                           "number of GiB or None"):
            check(bad)


def test_serialization_by_size_zero_turns_it_off():
    assert v.check_serialization_by_size(0) == 0.0
    assert v.check_serialization_by_size(np.int32(2)) == 2.0
    for bad in (math.nan, -0.1, False):
        with pytest.raises(ValueError, match="serialization_by_size"):
            v.check_serialization_by_size(bad)


def test_devices_are_kept_as_given_and_checked_for_their_kind():
    assert v.check_cpu_device("/device:CPU:0") == "/device:CPU:0"
    assert v.check_cpu_device("/job:worker/task:1/cpu:0") == \
        "/job:worker/task:1/cpu:0"
    assert v.check_gpu_device(None) is None
    assert v.check_gpu_device("/gpu:1") == "/gpu:1"
    with pytest.raises(ValueError, match=r"gpu_device='/gpu:x' is not a "
                       r"device string \(.*\); use e.g. '/cpu:0'"):
        v.check_gpu_device("/gpu:x")
    # A job without a device names no device type.
    with pytest.raises(ValueError, match="gpu_device must name a device type "
                       "and index"):
        v.check_gpu_device("/job:worker")


def test_batch_size_is_a_positive_int_or_none():
    assert v.check_batch_size(None) is None
    assert v.check_batch_size(np.int16(32)) == 32
    for bad in (0, -1, 8.0, True):
        with pytest.raises(ValueError, match="batch_size must be a positive "
                           "int or None; got"):
            v.check_batch_size(bad)


def test_gpu_and_interconnect_name_the_known_ones():
    for gpu in hardware.GPUS:
        assert v.check_gpu(gpu) == gpu
    with pytest.raises(ValueError, match="gpu must be one of %s" %
                       ", ".join(hardware.GPUS)):
        v.check_gpu("a100x")
    for link in list(hardware.INTERCONNECTS) + [hardware.INSTANT.name]:
        assert v.check_interconnect(link) == link
    with pytest.raises(ValueError, match="or %r to count copies as taking "
                       "no time; got 'pcie9'" % hardware.INSTANT.name):
        v.check_interconnect("pcie9")


def test_name_sets_are_frozen_and_refuse_a_bare_string():
    assert v.check_name_set("excl_output_by_types", ["Conv2D", "Conv2D"]) \
        == frozenset({"Conv2D"})
    assert v.check_name_set("excl_output_by_types", ()) == frozenset()
    # A string would be read as its characters.
    for bare in ("Conv2D", b"Conv2D", 3):
        with pytest.raises(ValueError, match=r"excl_output_by_types must be "
                           r"a set of strings, e.g. \{'conv1'\}"):
            v.check_name_set("excl_output_by_types", bare)
    with pytest.raises(ValueError, match="must hold non-empty strings; got "
                       "'', 1"):
        v.check_name_set("excl_output_by_types", {"ok", "", 1})
    assert v.check_plot_dir("autotune_plot_dir", "plots") == "plots"
    with pytest.raises(ValueError, match="autotune_plot_dir must be a folder "
                       "path; got ''"):
        v.check_plot_dir("autotune_plot_dir", "")


def test_the_checks_load_neither_numpy_nor_tensorflow():
    code = ("import sys\n"
            "from tflms import validation\n"
            "assert validation.check_bool('debug', 1) is True\n"
            "print(sorted(m for m in ('numpy', 'tensorflow') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=REPO)).stdout
    assert out.strip() == "[]"
