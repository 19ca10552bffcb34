"""tflms.tf.live_capacity, `tflms capacity` from Python on a live graph or
model: on a Session graph, `of_graph` finds the batches the command finds
in its file, without rewriting anything, and `graph_plan_at` refuses what
it cannot search. On a Keras 3 model (traced once per batch): the batches
it finds agree with `tflms plan` at that batch and at the batch above it;
and the planner's answers hold as the budget grows on the step that showed
they did not (Keras 3 ResNet50 at 64x64, batch 2: ordering found a plan at
a small budget that larger ones lost). Each Keras 3 case runs in a
subprocess with Keras 3 (`_keras3`)."""

import json

import pytest
import tensorflow as tf

from tflms import LMS
from tflms import cli
from tflms.settings import Settings
from tflms.tf import live_capacity

from _graphs import v1_cnn
from _keras3 import needs_keras3, python, save_models

_GIB = float(1 << 30)


def _cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_of_graph_finds_what_the_command_finds(capsys, tmp_path):
    meta = tmp_path / "cnn.meta"
    with tf.Graph().as_default():
        v1_cnn()
        tf.compat.v1.train.export_meta_graph(filename=str(meta))
    # A budget at which batch 64 needs LMS: half the step's peak without
    # LMS, over the default memory ratio.
    report = json.loads(_cli(capsys, "plan", meta, "--batch-size", 64,
                             "--autotune-gpu-mem", 1000, "--no-plots",
                             "--json"))
    gpu_mem = "%.6f" % (report["without_lms"]["peak_bytes"] * 0.5 / 0.9
                        / _GIB)
    out_file = tmp_path / "capacity.json"
    _cli(capsys, "capacity", meta, "--autotune-gpu-mem", gpu_mem, "--json",
         out_file)
    found = json.loads(out_file.read_text())
    graph = tf.Graph()
    with graph.as_default():
        train_op = v1_cnn()
    lms = LMS()
    lms.autotune_gpu_mem = float(gpu_mem)
    live = live_capacity.of_graph(graph, lms, fetches=train_op)
    assert (live.max_batch_without_lms, live.max_batch_with_lms,
            live.max_batch_within_overhead) == (
                found["max_batch_without_lms"], found["max_batch_with_lms"],
                None)
    assert live.max_batch_with_lms > live.max_batch_without_lms
    # Nothing was rewritten.
    assert not [op for op in graph.get_operations()
                if op.name.startswith("lms/")]


def test_graph_plan_at_needs_auto_tuning_and_a_free_batch():
    graph = tf.Graph()
    with graph.as_default():
        v1_cnn()
    with pytest.raises(ValueError, match="the capacity search needs "
                       "auto-tuning: leave swapout_threshold, swapin_ahead "
                       "or swapin_groupby at -1 \\(auto\\); got 2, 1, 0"):
        live_capacity.graph_plan_at(graph, Settings(
            swapout_threshold=2, swapin_ahead=1, swapin_groupby=0))
    static = tf.Graph()
    with static.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 32], name="x")
        w = tf.compat.v1.get_variable("w", [32, 4])
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.matmul(x, w)))
    with pytest.raises(ValueError, match="my graph has only static shapes, "
                       "so its batch cannot change"):
        live_capacity.graph_plan_at(static, Settings(), what="my graph")

_LAYERS = (
    "keras.Input((16, 16, 3))",
    "keras.layers.Conv2D(8, 3, padding='same', activation='relu')",
    "keras.layers.Conv2D(8, 3, padding='same', activation='relu')",
    "keras.layers.GlobalAveragePooling2D()",
    "keras.layers.Dense(4)",
)

# argv[1]: the model file. Runs `tflms plan` at batch 32 for the peak
# without LMS, `tflms capacity` at half of it, then `tflms plan` at each
# answer and at the batch above it, and `live_capacity.of_keras3_model` on
# the model loaded; prints one JSON object.
_AGREE = r"""
import contextlib, io, json, os, sys, tempfile
from tflms import cli

def run(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue()

def plan(batch, gpu_mem):
    code, out = run("plan", sys.argv[1], "--batch-size", batch,
                    "--autotune-gpu-mem", gpu_mem, "--no-plots", "--json")
    return code, json.loads(out)

_, report = plan(32, 1000)
gpu_mem = "%.6f" % (report["without_lms"]["peak_bytes"] * 0.5 / 0.9
                    / float(1 << 30))
path = os.path.join(tempfile.mkdtemp(), "capacity.json")
code, text = run("capacity", sys.argv[1], "--autotune-gpu-mem", gpu_mem,
                 "--json", path)
found = json.load(open(path))
answers = {}
for key, next_key in (("max_batch_without_lms", "next_without_lms"),
                      ("max_batch_with_lms", "next_with_lms")):
    answers[key] = [plan(found[key], gpu_mem), plan(found[next_key], gpu_mem)]
# The Python call on the live model finds the same.
import keras
from tflms import LMS
from tflms.tf import live_capacity
lms = LMS()
lms.autotune_gpu_mem = float(gpu_mem)
live = live_capacity.of_keras3_model(keras.saving.load_model(sys.argv[1]),
                                     lms)
print(json.dumps({"code": code, "text": text, "found": found,
                  "answers": answers,
                  "live": [live.max_batch_without_lms,
                           live.max_batch_with_lms]}))
"""


@needs_keras3
def test_keras3_capacity_agrees_with_plan(tmp_path):
    path = save_models(tmp_path, _LAYERS)["compiled"]
    out = python("-c", _AGREE, path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    found = result["found"]
    assert result["code"] == 0, result["text"]
    for key in ("max_batch_without_lms", "max_batch_with_lms",
                "max_batch_within_overhead", "rows"):
        assert key in found
    assert found["max_batch_within_overhead"] is None
    assert 1 <= found["max_batch_without_lms"] < found["max_batch_with_lms"]
    rows = {r["batch"]: r for r in found["rows"]}
    # Without LMS: fits at the answer; the batch above needs LMS.
    (code_at, report_at), (code_above, report_above) = (
        result["answers"]["max_batch_without_lms"])
    assert code_at == 0 and code_above == 0
    assert not report_at["lms_needed"] and report_at["without_lms"]["fits"]
    assert report_at["without_lms"]["peak_bytes"] == rows[
        found["max_batch_without_lms"]]["peak_without_bytes"]
    assert report_above["without_lms"]["fits"] is False
    assert report_above["lms_needed"]
    # With LMS: a plan at the answer, none at the batch above it.
    (code_at, report_at), (code_above, report_above) = (
        result["answers"]["max_batch_with_lms"])
    assert code_at == 0 and report_at["lms_needed"] and report_at["fits"]
    assert report_at["with_lms"]["peak_bytes"] == rows[
        found["max_batch_with_lms"]]["peak_with_bytes"]
    assert code_above == 1 and report_above["error"]
    assert "Largest batch with LMS: %d," % found["max_batch_with_lms"] in \
        result["text"]
    assert result["live"] == [found["max_batch_without_lms"],
                              found["max_batch_with_lms"]]


# Keras 3 ResNet50 (10 classes) at 64x64, batch 2, momentum SGD: its step
# planned at a budget half its peak without LMS names the smallest plan;
# that budget, and one halfway to the peak without LMS, both find a plan.
_HOLDS = r"""
import json
import tensorflow as tf
import keras
from tflms import autotune, floor, pipeline, simulator
from tflms import budget
from tflms.tf.adapters import tf_function
from tflms.settings import Settings

model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3),
                                    classes=10)
model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
              loss="sparse_categorical_crossentropy")
model.optimizer.build(model.trainable_variables)
step = tf.function(model.train_step, jit_compile=False)
concrete = step.get_concrete_function((
    tf.TensorSpec((2, 64, 64, 3), tf.float32), tf.TensorSpec((2,), tf.int32)))
_, index = tf_function.step_of(concrete.graph)
roles = pipeline.classify(index, Settings())
without = pipeline.simulate_without(index, roles, Settings())
lowest = floor.floor_of(index, roles)
env = {budget.MEM_RATIO_ENV: "1"}

def plan(nbytes):
    try:
        planned = pipeline.plan(index, Settings(
            autotune_gpu_mem=nbytes / float(1 << 30)), env=env)
    except autotune.AutotuneError as err:
        return {"found": False, "smallest": err.smallest_peak_bytes}
    return {"found": True, "peak": planned.with_lms.peak_device_bytes
            if planned.plan is not None else None}

peak = without.peak_device_bytes
low = plan(int(peak * 0.54))
out = {"peak": peak, "floor": lowest.floor_bytes, "low": low}
if not low["found"]:
    out["at_smallest"] = plan(low["smallest"])
    out["halfway"] = plan((low["smallest"] + peak) // 2)
print(json.dumps(out))
"""


@needs_keras3
def test_keras3_resnet50_answers_hold_as_the_budget_grows():
    out = python("-c", _HOLDS)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["low"]["found"], result
    assert result["floor"] <= result["low"]["smallest"] < result["peak"]
    # A budget at the smallest plan the failed search named finds it, and
    # so does every larger one tried.
    assert result["at_smallest"]["found"], result
    assert result["halfway"]["found"], result
    assert result["at_smallest"]["peak"] <= result["low"]["smallest"]
