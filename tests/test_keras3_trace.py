"""tflms.tf.keras3_trace: `tflms plan` on a model saved by Keras 3, its
training step traced.

Keras 3 exists on TensorFlow 2.16+ only, and trains in eager mode, so every
Keras 3 step here runs in a subprocess with TF_USE_LEGACY_KERAS unset (the
test process itself has eager execution off). The command's JSON report is
checked number for number against an in-process plan of the same training
step: the model loaded again, its ``train_step`` given to
``LMS().function`` (the public TF2 entry point) with the same settings.
Budgets are derived from the step's own peak, never hard-coded.
"""

import json

import pytest

from _keras3 import needs_keras3, python, save_models

pytestmark = needs_keras3

BATCH = 8
_GIB = float(1 << 30)
# The model both saved files hold (`save_models`).
_LAYERS = (
    "keras.Input((32, 32, 3))",
    'keras.layers.Conv2D(16, 3, padding="same")',
    "keras.layers.BatchNormalization()",
    "keras.layers.ReLU()",
    'keras.layers.Conv2D(16, 3, padding="same")',
    "keras.layers.BatchNormalization()",
    "keras.layers.ReLU()",
    'keras.layers.Conv2D(32, 3, padding="same")',
    "keras.layers.ReLU()",
    "keras.layers.GlobalAveragePooling2D()",
    'keras.layers.Dense(10, activation="softmax")',
)

# The same step planned in-process through LMS.function: for each
# configuration, the model loaded, compiled as asked, its train_step traced
# for one batch and planned with the budget given.
_REFERENCE = r"""
import json
import sys

import numpy as np
import tensorflow as tf
import keras

from tflms import LMS, pipeline

path, batch, configs = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
out = []
for config in configs:
    model = keras.saving.load_model(path)
    if config.get("loss"):
        model.compile(optimizer=config["optimizer"], loss=config["loss"],
                      jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    sparse = "sparse" in config.get("loss", "sparse")
    x = tf.TensorSpec([batch, 32, 32, 3], tf.float32)
    y = (tf.TensorSpec([batch], tf.int32) if sparse
         else tf.TensorSpec([batch, 10], tf.float32))
    lms = LMS()
    lms.batch_size = batch
    lms.autotune_gpu_mem = config["gib"]
    step = lms.function(model.train_step)
    step.get_concrete_function((x, y))
    run = lms.last_run
    planned = pipeline.simulate_plan(run.planned)
    plan = run.plan if run.rewritten else None
    out.append({
        "outcome": run.outcome.value,
        "num_ops": planned.index.num_ops,
        "num_edges": planned.index.num_edges,
        "num_levels": run.planned.original_num_levels,
        "trainable_parameters": int(sum(
            np.prod(v.shape) for v in model.trainable_variables)),
        "variable_bytes": int(sum(planned.index.variable_bytes)),
        "without": int(planned.without_lms.peak_device_bytes),
        "with": int(planned.with_lms.peak_device_bytes),
        "budget": int(planned.budget_bytes),
        "swapped": len(plan.swaps) if plan else 0,
        "swapout_bytes": int(plan.swapout_bytes()) if plan else 0,
        "params": [plan.params.swapout_threshold, plan.params.swapin_ahead,
                   plan.params.swapin_groupby, plan.params.sync_mode]
        if plan else None,
    })
print("REFERENCE " + json.dumps(out))
"""


def _plan(*argv):
    out = python("-m", "tflms", "plan", *[str(a) for a in argv])
    return out


def _plan_json(*argv):
    out = _plan(*argv, "--json", "--no-plots")
    assert out.stdout.strip(), out.stderr[-3000:]
    return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return save_models(tmp_path_factory.mktemp("keras3"), _LAYERS)


def _reference(path, configs):
    out = python("-c", _REFERENCE, path, str(BATCH), json.dumps(configs))
    assert out.returncode == 0, out.stderr[-3000:]
    line = [l for l in out.stdout.splitlines() if l.startswith("REFERENCE ")]
    return json.loads(line[-1][len("REFERENCE "):])


def _assert_same(report, ref):
    assert report["num_ops"] == ref["num_ops"]
    assert report["num_edges"] == ref["num_edges"]
    assert report["num_levels"] == ref["num_levels"]
    assert report["trainable_parameters"] == ref["trainable_parameters"]
    assert report["variable_bytes"] == ref["variable_bytes"]
    assert report["budget_bytes"] == ref["budget"]
    assert report["without_lms"]["peak_bytes"] == ref["without"]
    assert report["with_lms"]["peak_bytes"] == ref["with"]
    assert report["swapped_tensors"] == ref["swapped"]
    assert report["swapout_bytes"] == ref["swapout_bytes"]
    assert report["params"] == (None if ref["params"] is None else dict(zip(
        ("swapout_threshold", "swapin_ahead", "swapin_groupby",
         "sync_mode"), ref["params"])))


def test_a_keras3_file_is_planned_as_its_fit_step(files):
    """With the saved loss and optimizer, and with others from the command
    line: the same numbers as LMS.function on the same train_step."""
    code, big = _plan_json(files["compiled"], "--batch-size", BATCH,
                           "--autotune-gpu-mem", 1000)
    assert code == 0, big
    assert big["kind"] == "Keras 3 model (.keras)"
    assert big["training"] is True and big["lms_needed"] is False
    peak = big["without_lms"]["peak_bytes"]
    # A budget of 80% of the step's own peak: LMS is needed and must fit.
    from tflms import autotune
    gib = 0.8 * peak / autotune.mem_ratio() / _GIB
    configs = [{"gib": gib},
               {"gib": gib, "loss": "categorical_crossentropy",
                "optimizer": "adam"}]
    ref_saved, ref_flags = _reference(files["compiled"], configs)

    code, report = _plan_json(files["compiled"], "--batch-size", BATCH,
                              "--autotune-gpu-mem", "%.12f" % gib)
    assert code == 0, report
    assert ref_saved["outcome"] == "rewritten"
    assert report["lms_needed"] and report["fits"]
    assert report["with_lms"]["peak_bytes"] <= report["budget_bytes"] < peak
    assert report["without_lms"]["peak_bytes"] == peak
    _assert_same(report, ref_saved)
    assert any("saved loss and optimizer (sparse_categorical_crossentropy, "
               "SGD)" in note for note in report["notes"]), report["notes"]
    assert any("model.train_step" in note for note in report["notes"])

    code, flags = _plan_json(files["compiled"], "--batch-size", BATCH,
                             "--autotune-gpu-mem", "%.12f" % gib,
                             "--loss", "categorical_crossentropy",
                             "--optimizer", "adam")
    assert code == 0, flags
    _assert_same(flags, ref_flags)
    # Adam keeps two slots per weight where momentum SGD keeps one.
    assert flags["variable_bytes"] > report["variable_bytes"]
    assert any("replaced by --loss/--optimizer" in note
               for note in flags["notes"]), flags["notes"]


def test_the_oracle_measures_the_function_graph(files):
    """--oracle on the function graph: its captured variables become
    variables for the virtual GPU, so the step's memory is counted; the
    runtime replay agrees with the simulator within a few per cent and the
    plan fits by its measure too."""
    code, big = _plan_json(files["compiled"], "--batch-size", BATCH,
                           "--autotune-gpu-mem", 1000)
    peak = big["without_lms"]["peak_bytes"]
    from tflms import autotune
    gib = 0.8 * peak / autotune.mem_ratio() / _GIB
    code, report = _plan_json(files["compiled"], "--batch-size", BATCH,
                              "--autotune-gpu-mem", "%.12f" % gib, "--oracle")
    assert code == 0, report
    oracle = report["oracle"]
    without = oracle["without_lms"]["runtime_peak_bytes"]
    assert without == pytest.approx(peak, rel=0.05)
    assert without >= report["variable_bytes"] > 0
    with_lms = oracle["with_lms"]
    assert with_lms["runtime_peak_bytes"] == pytest.approx(
        with_lms["simulator_instant_peak_bytes"], rel=0.05)
    assert with_lms["runtime_peak_bytes"] < without


def test_a_file_without_training_configuration_needs_a_loss(files):
    out = _plan(files["bare"], "--batch-size", BATCH, "--autotune-gpu-mem", 1)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "tflms plan: error: the Keras 3 model %s was saved without a "
        "training configuration (no compile() before model.save()), so its "
        "loss is unknown; pass --loss (a Keras loss name such as "
        "sparse_categorical_crossentropy or mse) and --optimizer (default "
        "adam; its slots count as device memory)" % files["bare"])
    code, report = _plan_json(files["bare"], "--batch-size", BATCH,
                              "--autotune-gpu-mem", 1000,
                              "--loss", "sparse_categorical_crossentropy")
    assert code == 0, report
    assert report["training"] is True and report["num_ops"] > 0
    assert any("without a training configuration" in note and
               "optimizer=Adam" in note for note in report["notes"]), \
        report["notes"]


def test_inference_and_a_missing_batch_size(files):
    code, report = _plan_json(files["bare"], "--batch-size", BATCH,
                              "--autotune-gpu-mem", 1000, "--inference")
    assert code == 0, report
    assert report["training"] is False
    assert any("model(x, training=False)" in n for n in report["notes"])
    out = _plan(files["compiled"], "--autotune-gpu-mem", 1)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "tflms plan: error: the Keras 3 model %s has no fixed batch size; "
        "pass --batch-size N (the training step is traced for one batch)"
        % files["compiled"])


_PROBE = r"""
import json

import tensorflow as tf

from benchmarks import capacity, measure, models
from tflms.tf import function_api
from tflms.tf import oracle
from tflms import pipeline
from tflms.settings import Settings

built = models.keras3_app(image=512)
graph_def = oracle.graph_def(built.graph)
handles = {n.name: n for n in graph_def.node if n.op == "VarHandleOp"}
captured = function_api.captured_variables(built.graph)
index = measure.step_index(built)
handle_bytes = sum(
    tf.TensorShape(n.attr["shape"].shape).num_elements()
    * tf.as_dtype(n.attr["dtype"].type).size for n in handles.values())
without = pipeline.simulate_without(
    index, pipeline.classify(index, Settings()), Settings(batch_size=1))
none = capacity.measure_probe("none", built, 16)
budget_gib = 0.6 * none["gpu_peak"] / float(1 << 30)
lms = capacity.measure_probe("tflms", models.keras3_app(image=512),
                             budget_gib)
print("PROBE " + json.dumps({
    "handles": sorted(handles), "captured": sorted(captured),
    "handle_bytes": handle_bytes,
    "variable_bytes": int(sum(index.variable_bytes)),
    "simulated": int(without.peak_device_bytes),
    "none": none["gpu_peak"], "budget": budget_gib * (1 << 30),
    "status": lms["status"], "tflms": lms.get("gpu_peak")}))
"""


def test_the_capacity_probe_of_a_keras3_fit_step():
    """`benchmarks/models.keras3_app` (issue 24 item 8) through the capacity
    probes: the oracle sees the function graph's captured variables as
    variables (every one, at its size), measures the step as the simulator
    counts it, and judges the rewritten function graph."""
    out = python("-c", _PROBE)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [l for l in out.stdout.splitlines() if l.startswith("PROBE ")]
    probe = json.loads(line[-1][len("PROBE "):])
    assert probe["handles"] == probe["captured"] and probe["handles"]
    assert probe["handle_bytes"] == probe["variable_bytes"] > 0
    assert probe["none"] == pytest.approx(probe["simulated"], rel=0.05)
    assert probe["status"] == "swapped"
    assert probe["tflms"] <= probe["budget"] < probe["none"]
