"""`PlanningContext`: built once per plan, it holds the roles, the budgets
and the models every stage shares."""

import pytest

from tflms import budget
from tflms import planner
from tflms.context import Budgets, Judging, PlanningContext
from tflms.settings import Settings

import _literal as L


def test_budget_is_worked_out_only_when_tuning():
    index = L.chain()
    tuned = L.context(index, budget_units=6)
    assert tuned.budget_bytes == 6 * L.U
    fixed = L.context(index, swapout_threshold=3, swapin_ahead=1,
                      swapin_groupby=0)
    assert fixed.budget_bytes is None
    assert fixed.requested == planner.SwapParams(3, 1, 0, 0)


def test_tuning_without_a_gpu_or_a_budget_names_the_setting():
    with pytest.raises(budget.NoGpuError, match="autotune_gpu_mem"):
        Budgets.read(Settings(), L.EXACT, list_devices=lambda: [])


def test_a_device_that_matches_nothing_is_refused():
    with pytest.raises(ValueError, match="gpu_device='/device:GPU:7' matches "
                       "no operation"):
        PlanningContext.create(L.chain(), Settings(gpu_device="/device:GPU:7",
                                                   swapout_threshold=3,
                                                   swapin_ahead=1,
                                                   swapin_groupby=0))


def test_models_are_made_once_per_index():
    index, other = L.chain(), L.chain(4)
    context = L.context(index, budget_units=6)
    model = context.model(index)
    assert context.model(index) is model
    assert context.model(other) is not model
    assert context.model(other).index is other
    timer = context.timer(index)
    assert context.timer(index) is timer
    assert timer.gpu is context.gpu
    assert timer.interconnect is context.interconnect


def test_hardware_comes_from_the_settings_unless_given():
    index = L.chain()
    context = L.context(index, budget_units=6, gpu="A100-SXM4-40GB",
                        interconnect="pcie3")
    assert (context.gpu.name, context.interconnect.name) == (
        "A100-SXM4-40GB", "pcie3")
    settings = Settings(autotune_gpu_mem=1.0)
    other = PlanningContext.create(index, settings,
                                   budgets=Budgets.read(settings, L.EXACT),
                                   judging=Judging(interconnect="nvlink2"))
    assert other.interconnect.name == "nvlink2"
