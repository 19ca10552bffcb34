"""The benchmarks' models written by others (issue 22, item 4).

`benchmarks.models.unet3d_recipe` imports segmentation-models-3D only when
it runs, and says how to install it when it is missing; the package is not
a test dependency, so the test that builds it skips without it. The
``thirdparty`` suite's cases name builders and arguments that exist, and
the ``full`` suite runs them too.
"""

import inspect
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import models  # noqa: E402
from benchmarks import suites  # noqa: E402


def test_recipe_unet_names_the_pip_command_when_the_package_is_missing(
        monkeypatch):
    # None in sys.modules makes `import segmentation_models_3D` fail.
    monkeypatch.setitem(sys.modules, "segmentation_models_3D", None)
    with pytest.raises(ImportError, match="pip install --no-deps "
                       "segmentation-models-3D==1.0.4 "
                       "classification-models-3D==1.0.10 "
                       "keras-applications==1.0.8"):
        models.unet3d_recipe(volume=32)


def test_recipe_unet_volume_must_be_a_multiple_of_32():
    with pytest.raises(ValueError, match="volume must be a positive "
                       "multiple of 32 .*; got 48"):
        models.unet3d_recipe(volume=48)


def test_thirdparty_cases_name_builders_and_their_arguments():
    cases = suites.suite("thirdparty")
    assert set(cases) == {"fidelity", "capacity"}
    built = set()
    for section, section_cases in cases.items():
        for case in section_cases:
            builder = models.BUILDERS[case["model"]]
            params = inspect.signature(builder).parameters
            assert set(case["kwargs"]) <= set(params), case
            if section == "capacity":
                assert case["budget_gib"] == 16
                assert case["kwargs"]["batch"] == 1
                assert models.size_key(case["dimension"]) in params
            built.add(case["kwargs"].get("app", case["model"]))
            # The full suite runs every third-party case as well.
            assert case in suites.FULL[section]
    assert built == set(models.KERAS_APPS) | {"unet3d_recipe"}


def test_recipe_unet_trains_in_a_session_graph_and_the_simulator_agrees():
    pytest.importorskip("segmentation_models_3D")
    from tflms.tf import oracle
    from tflms import pipeline
    from tflms.tf import reader
    from tflms.settings import Settings
    built = models.unet3d_recipe(volume=32, backbone="resnet18")
    index = reader.build_index(built.graph)
    assert built.train_op.name in index.step_rule or \
        "train_op collection" in index.step_rule
    roles = pipeline.classify(index, Settings())
    sim = pipeline.simulate_without(index, roles, Settings(batch_size=1))
    measured = oracle.peak_memory(built.graph, built.train_op)
    assert abs(sim.peak_device_bytes / measured.runtime_gpu_peak_bytes
               - 1) < 0.05


def test_keras3_graph_cases_build_keras_app_mostly_with_batch_norm_unfused():
    cases = suites.suite("keras3_graph")
    assert set(cases) == {"capacity"}
    params = inspect.signature(models.keras_app).parameters
    for case in cases["capacity"]:
        assert case["model"] == "keras_app"
        assert set(case["kwargs"]) <= set(params), case
        assert (case["budget_gib"], case["kwargs"]["batch"], case["step"],
                case["tolerance"]) == (16, 1, 32, 0)
    unfused = [c for c in cases["capacity"]
               if not c["kwargs"]["fused_batch_norm"]]
    assert len(unfused) == 4


def test_keras_app_unfused_batch_norm_has_no_fused_op_and_trains():
    import tensorflow as tf
    built = models.keras_app(image=32, classes=10, fused_batch_norm=False)
    types = [op.type for op in built.graph.get_operations()]
    assert not [t for t in types if t.startswith("FusedBatchNorm")]
    # One SquaredDifference per batch-norm layer and call: the model on
    # its own Input and on the placeholders.
    assert types.count("SquaredDifference") == 2 * 53
    fused = models.keras_app(image=32, classes=10)
    assert len(built.graph.get_collection("variables")) == \
        len(fused.graph.get_collection("variables"))
    with tf.compat.v1.Session(graph=built.graph) as sess:
        sess.run(built.init_op)
        feed = built.make_feed()
        before = sess.run(built.loss, feed)
        sess.run(built.train_op, feed)
        after = sess.run(built.loss, feed)
    assert after < before


def test_keras_app_gate_gradients_zero_groups_no_gradients():
    def grouped(built):
        return sum(1 for op in built.graph.get_operations()
                   if op.name.startswith("gradients/") and "/tuple/" in
                   op.name)
    gated = models.keras_app(image=32, classes=10, fused_batch_norm=False)
    ungated = models.keras_app(image=32, classes=10, fused_batch_norm=False,
                               gate_gradients=0)
    assert grouped(gated) > 0
    assert grouped(ungated) == 0
    assert "gate_gradients 0" in ungated.description
