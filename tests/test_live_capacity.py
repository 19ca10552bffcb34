"""tflms.tf.live_capacity, `tflms capacity` from Python on a live graph or
model: on a Session graph, `of_graph` finds the batches the command finds
in its file, without rewriting anything, and `graph_plan_at` refuses what
it cannot search. On a Keras 3 model (traced once per batch): the batches
it finds agree with `tflms plan` at that batch and at the batch above it;
and the planner's answers hold as the budget grows on the step that showed
they did not (Keras 3 ResNet50 at 64x64, batch 2: ordering found a plan at
a small budget that larger ones lost). Searched by sequence length at a
fixed batch (a KerasHub GPT-2 from a tiny config, from Python; a plain
Keras 3 Embedding + MultiHeadAttention model, by the command): the longest
sequence without LMS fits and the next does not, the longest with LMS has
a plan and the next none, each planned directly at that length; GPT-2's
search stops at its max_sequence_length and says so; the JSON keys, the
report's words and the errors. Each Keras 3 case runs in a subprocess
with Keras 3 (`_keras3`)."""

import json

import pytest
import tensorflow as tf

from tflms import LMS
from tflms import cli
from tflms.settings import Settings
from tflms.tf import live_capacity

from _graphs import v1_cnn
from _keras3 import (needs_keras3, needs_keras_hub, python, result_of,
                     save_models)

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


# What the sequence tests share: the step of `model` traced at a length
# and planned directly (keras3_trace, tf_function.step_of, pipeline: not
# the search's code), its peaks without and with LMS (None: no plan) and
# the shapes of its integer inputs.
_DIRECT = r"""
import json
import tensorflow as tf
from tflms import autotune, pipeline
from tflms.settings import Settings
from tflms.tf import keras3_trace
from tflms.tf.adapters import graph_step, tf_function

def direct(model, batch, length, gpu_mem):
    loaded = keras3_trace.from_model(model, batch, sequence=length)
    traced = keras3_trace.trace(loaded, sequence=length)
    inputs = sorted(op.outputs[0].shape.as_list()
                    for op in traced.graph.get_operations()
                    if op.type == "Placeholder"
                    and op.outputs[0].dtype == tf.int32)
    _, index = tf_function.step_of(traced.graph)
    settings = Settings(autotune_gpu_mem=gpu_mem, batch_size=batch)
    target = graph_step.step_target(settings, here=False)
    roles = pipeline.classify(index, settings, target)
    without = pipeline.simulate_without(index, roles, settings)
    try:
        planned = pipeline.simulate_plan(pipeline.plan(
            index, settings, roles=roles, target=target))
        shown = (planned.with_lms if planned.plan is not None
                 else planned.without_lms)
        peak_with = int(shown.peak_device_bytes)
    except autotune.AutotuneError:
        peak_with = None
    return {"without": int(without.peak_device_bytes), "with": peak_with,
            "inputs": inputs}
"""

# A KerasHub GPT-2 from a tiny config (random weights), momentum-free SGD,
# batch 2: the budget is its step at length 40 without LMS; the longest
# sequence searched from Python, each answer planned directly at that
# length and the next, and the errors of the Python call.
_GPT2 = _DIRECT + r"""
import keras
import keras_hub
from tflms import LMS
from tflms.tf import live_capacity

def error_of(call):
    try:
        call()
    except Exception as e:
        return [type(e).__name__, str(e)]
    return None

keras.utils.set_random_seed(0)
backbone = keras_hub.models.GPT2Backbone(
    vocabulary_size=300, num_layers=2, num_heads=2, hidden_dim=64,
    intermediate_dim=128, max_sequence_length=64)
model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
model.compile(optimizer=keras.optimizers.SGD(0.01))
peak = direct(model, 2, 40, 1000)["without"]
lms = LMS()
lms.autotune_gpu_mem = peak / 0.9 / float(1 << 30)
found = live_capacity.of_keras3_model(model, lms, dimension="sequence",
                                      batch_size=2)
out = {"found": found.as_dict(), "attr": found.max_sequence_with_lms,
       "gpu_mem": lms.autotune_gpu_mem}
for r in out["found"]["rows"]:
    r.pop("timeline", None)
for key in ("max_sequence_without_lms", "next_without_lms",
            "max_sequence_with_lms"):
    out[key] = direct(model, 2, out["found"][key], lms.autotune_gpu_mem)
out["errors"] = [
    error_of(lambda: live_capacity.of_keras3_model(
        model, lms, dimension="sequence", batch_size=2, start=100)),
    error_of(lambda: live_capacity.of_keras3_model(
        model, lms, dimension="sequence")),
    error_of(lambda: live_capacity.of_keras3_model(model, lms,
                                                   batch_size=2)),
    error_of(lambda: live_capacity.of_keras3_model(
        model, lms, dimension="length", batch_size=2))]
out["bounds"] = [live_capacity.sequence_bounds(model, 1, limit)
                 for limit in (None, 1000, 32)]
print("RESULT " + json.dumps(out))
"""


@needs_keras_hub
def test_gpt2_longest_sequence_from_python():
    result, _ = result_of("-c", _GPT2)
    found = result["found"]
    assert found["dimension"] == "sequence" and found["batch_size"] == 2
    for key in ("max_sequence_without_lms", "max_sequence_with_lms",
                "max_sequence_within_overhead", "next_without_lms",
                "next_with_lms", "limit_reason", "rows"):
        assert key in found, key
    assert not [k for k in found if k.startswith("max_batch")]
    assert result["attr"] == found["max_sequence_with_lms"]
    budget = found["budget_bytes"]
    rows = {r["sequence"]: r for r in found["rows"]}
    assert all(r["batch"] == 2 for r in found["rows"])
    # Without LMS: the answer fits and the next length does not, planned
    # directly at each; the step was traced at that length (token_ids,
    # padding_mask and the targets are [2, length]).
    best = found["max_sequence_without_lms"]
    assert found["next_without_lms"] == best + 1
    at, above = result["max_sequence_without_lms"], result["next_without_lms"]
    assert at["without"] <= budget < above["without"]
    assert at["without"] == rows[best]["peak_without_bytes"]
    assert at["inputs"] == [[2, best]] * 3
    assert above["inputs"] == [[2, best + 1]] * 3
    # With LMS: a plan at the model's longest, 64 (its position embedding
    # has 64 rows), where the search stops and says why.
    assert found["max_sequence_with_lms"] == found["limit"] == 64
    assert found["next_with_lms"] is None
    assert found["limit_reason"] == ("GPT2Backbone 'gpt2_backbone' was "
                                     "built with max_sequence_length=64")
    longest = result["max_sequence_with_lms"]
    assert longest["with"] is not None and longest["with"] <= budget
    assert longest["without"] > budget
    assert longest["with"] == rows[64]["peak_with_bytes"]
    assert rows[64]["tokens_per_s_with"] == pytest.approx(
        64 * rows[64]["samples_per_s_with"])
    # A larger limit is lowered to the model's longest; a smaller one kept.
    reason = found["limit_reason"]
    assert result["bounds"] == [[64, reason], [64, reason], [32, None]]
    too_long, no_batch, batch_given, bad_dimension = result["errors"]
    assert too_long == ["ValueError", (
        "start 100 is longer than the model takes: GPT2Backbone "
        "'gpt2_backbone' was built with max_sequence_length=64; give a "
        "start of at most 64")]
    assert no_batch == ["ValueError", (
        "dimension='sequence' searches the sequence length at a fixed "
        "batch: pass batch_size=N (a positive int, the batch you train "
        "with); got None")]
    assert batch_given == ["ValueError", (
        "batch_size=2 is the fixed batch of a search over the sequence; "
        "dimension='batch' searches the batch: drop batch_size, or pass "
        "dimension='sequence'")]
    assert bad_dimension == ["ValueError", (
        "dimension must be one of batch, sequence; got 'length'")]


# A plain Keras 3 transformer block (Embedding, causal MultiHeadAttention,
# Dense logits) on token ids of shape (None,), saved; `tflms capacity
# --dimension sequence` at batch 2 with the budget of its step at length
# 48, then each answer and the length above it planned directly; and the
# command on a model without a sequence axis.
_MHA = _DIRECT + r"""
import contextlib, io, os, sys
import keras
from tflms import cli

def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()

folder = sys.argv[1]
keras.utils.set_random_seed(0)
tokens = keras.Input((None,), dtype="int32", name="tokens")
x = keras.layers.Embedding(200, 32)(tokens)
x = x + keras.layers.MultiHeadAttention(2, 16)(x, x, use_causal_mask=True)
model = keras.Model(tokens, keras.layers.Dense(200)(x))
model.compile(optimizer=keras.optimizers.SGD(0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(
                  from_logits=True))
path = os.path.join(folder, "mha.keras")
model.save(path)
gpu_mem = "%.9f" % (direct(model, 2, 48, 1000)["without"] / 0.9
                    / float(1 << 30))
json_path = os.path.join(folder, "capacity.json")
code, text, err = run("capacity", path, "--dimension", "sequence",
                      "--batch-size", 2, "--max-sequence", 128,
                      "--autotune-gpu-mem", gpu_mem, "--json", json_path,
                      "--plot", os.path.join(folder, "capacity.png"))
out = {"code": code, "text": text, "err": err[-2000:],
       "found": json.load(open(json_path))}
for r in out["found"]["rows"]:
    r.pop("timeline", None)
for key in ("max_sequence_without_lms", "next_without_lms",
            "max_sequence_with_lms", "next_with_lms"):
    out[key] = direct(model, 2, out["found"][key], float(gpu_mem))
fixed = keras.Sequential([keras.Input((16, 3)), keras.layers.Dense(4)])
fixed.compile(optimizer="sgd", loss="mse")
fixed_path = os.path.join(folder, "fixed.keras")
fixed.save(fixed_path)
out["fixed"] = run("capacity", fixed_path, "--dimension", "sequence",
                   "--batch-size", 2, "--autotune-gpu-mem", 1)
out["batch"] = run("capacity", path, "--autotune-gpu-mem", 1)
print("RESULT " + json.dumps(out))
"""


@needs_keras3
def test_keras_transformer_longest_sequence_by_the_command(tmp_path):
    result, _ = result_of("-c", _MHA, tmp_path)
    assert result["code"] == 0, result["err"]
    found, text = result["found"], result["text"]
    budget = found["budget_bytes"]
    rows = {r["sequence"]: r for r in found["rows"]}
    assert found["dimension"] == "sequence" and found["batch_size"] == 2
    assert found["limit"] == 128 and found["limit_reason"] is None
    best, above = found["max_sequence_without_lms"], found["next_without_lms"]
    assert above == best + 1
    at, up = result["max_sequence_without_lms"], result["next_without_lms"]
    assert at["without"] <= budget < up["without"]
    assert at["without"] == rows[best]["peak_without_bytes"]
    assert at["inputs"] == [[2, best], [2, best]]  # tokens, targets
    best_with = found["max_sequence_with_lms"]
    assert best < best_with < 128 and found["next_with_lms"] == best_with + 1
    at, up = result["max_sequence_with_lms"], result["next_with_lms"]
    assert at["with"] is not None and at["with"] <= budget
    assert at["with"] == rows[best_with]["peak_with_bytes"]
    assert up["with"] is None
    assert ("Largest" not in text and "Sequence lengths tried" in text
            and "tok/s w/o" in text)
    assert ("Longest sequence without LMS: %d (%d does not: needs"
            % (best, best + 1)) in text
    assert ("Longest sequence with LMS: %d, " % best_with) in text
    assert "tokens/s predicted" in text
    assert "Sequence length searched at batch 2" in text
    with open(tmp_path / "capacity.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    code, _, err = result["fixed"]
    assert code == 2
    assert ("--dimension sequence: no input of the Keras 3 model %s has an "
            "unknown axis 1 to trace at each length" % (
                tmp_path / "fixed.keras")) in err
    assert "or search the batch (--dimension batch)" in err
    code, _, err = result["batch"]
    assert code == 2 and (
        "or search its sequence length with tflms capacity --dimension "
        "sequence --batch-size N") in err
