"""The plans of the benchmark models, pinned: a change to how planning is
organised must not change what it plans.

Each case builds a benchmark graph (`benchmarks.models`), plans it with
`pipeline.plan` at budgets where the stages engage (auto-tuning, ordering,
fewer waits, recompute, serialization, fixed parameters) and compares a
digest of everything the plan tells the rewriter (swaps, swap-ins,
triggers, waiters, recomputes, control edges, parameters) and of what the
pipeline decided around it (ordering edges, unwaited swap-outs, budget)
with the digest recorded in ``tests/data/plan_digests.json`` for this
TensorFlow version (Keras names and builds ops differently from one version
to the next, so each stack has its own digests).

A deliberate change of plans rewrites the file:
``TFLMS_WRITE_PLAN_DIGESTS=1 python -m pytest tests/test_same_plans.py``
on each stack, and the commit says why the plans changed.

Each graph is planned on the target LMS plans a Session graph on
(`graph_step.step_target`, for a GPU): Grappler's groups left whole.
"""

import hashlib
import json
import os

import pytest
import tensorflow as tf

from benchmarks import models
from tflms.tf import reader
from tflms.tf.adapters import graph_step
from tflms import autotune, pipeline
from tflms.settings import Settings

_DATA = os.path.join(os.path.dirname(__file__), "data", "plan_digests.json")
_WRITE = os.environ.get("TFLMS_WRITE_PLAN_DIGESTS") == "1"
_STACK = "tf" + ".".join(tf.__version__.split(".")[:2])
_GIB = float(1 << 30)
# Swaps only: the tuner's plans before recomputes were on by default.
_SWAPS = dict(recompute=False)

# (case id, builder, builder kwargs, [(share of the activation range or
# None for fixed parameters, Settings keywords)]). On TensorFlow 2.15 the
# ResNet50 plans at 0.45 and the U-Net's at 0.47 take ordering edges, the
# U-Net's also drops swap-out waits, and the recompute ones replace swaps.
# (With in-place writes counted the U-Net's peak is lower and no plan fits
# 0.45 of its activations; at 0.47 the same stages engage as at 0.45
# before.) The swap-only tuned plans say `recompute=False`: their digests
# were recorded when that was the default. The last plan of each case is
# the default settings' (recomputes considered when auto-tuning), recorded
# when that became the default.
CASES = [
    ("keras_resnet50_96", "keras_app", dict(app="ResNet50", image=96), [
        (0.7, _SWAPS), (0.5, _SWAPS), (0.45, _SWAPS),
        (0.45, dict(recompute=True)),
        (0.5, dict(sync_mode=1, recompute=False)),
        (0.45, dict(order_peaks=False, recompute=False)),
        (None, dict(swapout_threshold=40, swapin_ahead=5, swapin_groupby=3)),
        (None, dict(swapout_threshold=30, swapin_ahead=2, swapin_groupby=0,
                    serialization=[3, 4], recompute=True)),
        (0.45, {}),
    ]),
    ("unet3d_48", "unet3d", dict(volume=48), [
        (0.6, _SWAPS), (0.6, dict(recompute=True)), (0.47, _SWAPS),
        (0.47, dict(recompute=True)),
        (None, dict(swapout_threshold=5, swapin_ahead=1, swapin_groupby=0,
                    sync_mode=3)),
        (0.47, {}),
    ]),
    ("transformer_small", "transformer",
     dict(layers=2, seq=64, d_model=64, heads=4, batch=2), [
         (0.5, _SWAPS), (0.6, dict(recompute=True)), (0.5, {}),
     ]),
    ("deep_mlp_3000", "deep_mlp", dict(num_ops=3000), [
        (0.4, _SWAPS), (None, dict(swapout_threshold=10, swapin_ahead=3,
                                   swapin_groupby=2)),
        (0.4, {}),
    ]),
]


# How each stack builds the graphs planned: run on both (tools/run_tests.sh).
pytestmark = pytest.mark.both_stacks


def _budget_gib(index, roles, batch, share):
    """Resident bytes plus `share` of the activations, as a GiB setting
    (`autotune_gpu_mem` before the 0.9 memory ratio)."""
    without = pipeline.simulate_without(index, roles,
                                        Settings(batch_size=batch))
    resident = without.resident_device_bytes
    target = resident + share * (without.peak_device_bytes - resident)
    return target / autotune.DEFAULT_MEM_RATIO / _GIB


def _target(settings):
    return graph_step.step_target(settings, here=False)


def _digest(planned):
    plan = planned.plan
    text = repr((plan, planned.ordering_edges, planned.unwaited,
                 planned.budget_bytes, planned.autotuned))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plans(name, kwargs, budgets):
    built = models.build(name, **kwargs)
    index = reader.build_index(built.graph, [built.train_op])
    # On the target LMS plans every step on, for a GPU (the same on
    # every machine, whatever TF_ENABLE_ONEDNN_OPTS says).
    roles = pipeline.classify(index, Settings(), _target(Settings()))
    out = []
    for share, extra in budgets:
        settings = dict(batch_size=built.batch_size, **extra)
        if share is not None:
            settings["autotune_gpu_mem"] = _budget_gib(
                index, roles, built.batch_size, share)
        try:
            settings = Settings(**settings)
            planned = pipeline.plan(index, settings, env={},
                                    target=_target(settings))
            out.append(_digest(planned))
        except autotune.AutotuneError:
            out.append("no plan")
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plans_are_the_recorded_ones(case):
    case_id, name, kwargs, budgets = case
    got = _plans(name, kwargs, budgets)
    recorded = {}
    if os.path.exists(_DATA):
        with open(_DATA) as f:
            recorded = json.load(f)
    if _WRITE:
        recorded.setdefault(_STACK, {})[case_id] = got
        with open(_DATA, "w") as f:
            json.dump(recorded, f, indent=1, sort_keys=True)
            f.write("\n")
        return
    assert _STACK in recorded, (
        "no plan digests recorded for %s; record them with "
        "TFLMS_WRITE_PLAN_DIGESTS=1 (see the module docstring)" % _STACK)
    assert got == recorded[_STACK][case_id]
    # Each case plans something: a digest list of only "no plan" would pin
    # nothing.
    assert any(d != "no plan" for d in got)
