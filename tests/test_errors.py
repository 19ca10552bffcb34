"""Every error tflms defines is an `LMSError`, and keeps the built-in base
that users caught it by before `LMSError` existed.

The classes are found by importing every module of the package, so an
error added later without `LMSError`, or without an entry in `BASES`,
fails here.
"""

import importlib
import inspect
import pkgutil

import pytest

import tflms
from tflms.errors import LMSError

# Error class -> the built-in exception it derived from before LMSError.
BASES = {
    "tflms.autotune.report.AutotuneError": ValueError,
    "tflms.budget.NoGpuError": ValueError,
    "tflms.cli.loading.PlanError": Exception,
    "tflms.dag_levels.GraphCycleError": ValueError,
    "tflms.offload.OffloadUnsupportedError": ValueError,
    "tflms.devices.DeviceStringError": ValueError,
    "tflms.results.EagerModeError": RuntimeError,
    "tflms.simulator.buffers.BatchSizeError": ValueError,
    "tflms.stages.contract.StageContractError": AssertionError,
    "tflms.stages.host.HostMemoryError": ValueError,
    "tflms.tf.compat.UnsupportedStackError": RuntimeError,
    "tflms.tf.distributed.RankMismatchError": RuntimeError,
    "tflms.tf.keras3_trace.Keras3PlanError": ValueError,
    "tflms.tf.lms_function.UnsupportedFunctionError": ValueError,
    "tflms.tf.offload_rewrite.SlotsOnDeviceError": ValueError,
    "tflms.tf.verify.VerifyError": ValueError,
}


def _defined_errors():
    """Qualified name -> class, for every exception class a tflms module
    defines."""
    found = {}
    for info in pkgutil.walk_packages(tflms.__path__, "tflms."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (issubclass(cls, BaseException)
                    and cls.__module__ == module.__name__):
                found["%s.%s" % (cls.__module__, cls.__qualname__)] = cls
    return found


def test_every_error_is_listed_with_its_base():
    found = _defined_errors()
    assert sorted(found) == sorted(set(BASES) | {"tflms.errors.LMSError"})


@pytest.mark.parametrize("name", sorted(BASES))
def test_an_error_is_an_lms_error_and_keeps_its_base(name):
    module, _, cls_name = name.rpartition(".")
    cls = getattr(importlib.import_module(module), cls_name)
    assert issubclass(cls, LMSError)
    assert issubclass(cls, BASES[name])


def test_the_package_exports_the_base():
    assert tflms.LMSError is LMSError
    assert "LMSError" in tflms.__all__
    assert issubclass(tflms.EagerModeError, tflms.LMSError)
    assert issubclass(tflms.UnsupportedStackError, tflms.LMSError)
