"""`tflms.offload.find_updates` on real Keras 3 training steps: a small
Dense model's ``train_step`` traced (`keras3_trace`) with each common
optimizer, its element-wise updates found (`offload_elementwise`) and
checked against the optimizer's own variables; the simulator's replay
with them on the host (`offload.planning_index`).

Keras 3 trains in eager mode, which the test process has off: the step is
traced and read in a subprocess (`_keras3.result_of`), which reports
names; the checks are here.
"""

import json

import pytest

from _keras3 import needs_keras3, result_of

pytestmark = needs_keras3

_FIND = r"""
import json

import keras

from tflms import analysis, offload, simulator
from tflms.target import Target
from tflms.tf import function_api, keras3_trace
from tflms.tf.adapters import tf_function

HOST = "/cpu:0"
O = keras.optimizers
OPTIMIZERS = {
    "sgd": lambda: O.SGD(0.01),
    "momentum": lambda: O.SGD(0.01, momentum=0.9),
    "adam": lambda: O.Adam(),
    "adamw": lambda: O.AdamW(),
    "rmsprop": lambda: O.RMSprop(),
    "adagrad": lambda: O.Adagrad(),
}
keras.utils.set_random_seed(1)
model = keras.Sequential([
    keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
    keras.layers.Dense(256, activation="relu"), keras.layers.Dense(8)])
out = {}
for name, make in OPTIMIZERS.items():
    model.compile(optimizer=make(), loss="mse", jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    traced = keras3_trace.trace(keras3_trace.from_model(model, 8))
    # Indexed as the function step plans it without gpu_device: the
    # captured handles unplaced, so managed (on this machine the
    # variables are on the host's CPU).
    _, index = tf_function.step_of(traced.graph)
    # The TensorFlow variable of each captured handle, named by its Keras
    # variable's path.
    captured = {op: v.name.split(":")[0] for op, v in
                function_api.captured_variables(traced.graph).items()}
    found = offload.find_updates(index, HOST)
    n = index.names
    trainable = [v.path for v in model.trainable_variables]
    expected_slots = {
        v.path: sorted(s.path for s in model.optimizer.variables
                       if s.name.startswith(v.path.replace("/", "_") + "_"))
        for v in model.trainable_variables}
    updates = []
    for u in found.updates:
        g, k = u.gradient
        updates.append(dict(
            variable=captured[n[u.variable]],
            slots=sorted(captured[n[s]] for s in u.slots),
            gradient=[index.types[g], n[g], k],
            apply_type=index.types[u.apply],
            host_types=sorted({index.types[o] for o in u.host_ops}),
            backward=[n[o] for o in u.host_ops
                      if n[o].startswith("gradient_tape/")],
            reads_weights=u.reads_weights))
    # Indexed with each captured handle on its variable's device (a
    # replica's plan), the host another CPU: the same updates.
    _, placed = tf_function.step_of(traced.graph, variable_devices=True)
    same_placed = [(u.apply, u.slots, u.gradient, u.host_ops)
                   for u in offload.find_updates(placed, "/cpu:1").updates
                   ] == [(u.apply, u.slots, u.gradient, u.host_ops)
                         for u in found.updates]
    planned = offload.planning_index(index, found)
    target = Target(host=HOST)
    before = simulator.SimulationModel(
        index, analysis.classify_ops(index, target), None)
    after = simulator.SimulationModel(
        planned, analysis.classify_ops(planned, target), None,
        landings=offload.write_back_buffers(found, planned))
    out[name] = dict(
        trainable=trainable, expected_slots=expected_slots,
        updates=updates, left=list(found.left), same_placed=same_placed,
        slot_bytes=found.slot_bytes,
        host_gain=after.resident_host_bytes - before.resident_host_bytes,
        device_drop=before.resident_device_bytes
        - after.resident_device_bytes,
        peaks=[before.replay(None).peak_device_bytes,
               after.replay(None).peak_device_bytes])
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def found():
    result, _ = result_of("-c", _FIND)
    return result


@pytest.mark.parametrize("optimizer", ["momentum", "adam", "adamw",
                                       "rmsprop", "adagrad"])
def test_every_update_is_found_with_its_slots_and_gradient(found,
                                                           optimizer):
    step = found[optimizer]
    assert step["left"] == [] and step["same_placed"]
    assert [u["variable"] for u in step["updates"]] == step["trainable"]
    slots_each = {"momentum": 1, "adam": 2, "adamw": 2, "rmsprop": 1,
                  "adagrad": 1}[optimizer]
    for k, u in enumerate(step["updates"]):
        assert u["slots"] == step["expected_slots"][u["variable"]]
        assert len(u["slots"]) == slots_each
        # Keras hands every gradient on through one IdentityN, in the
        # order of the trainable variables.
        kind, producer, output = u["gradient"]
        assert kind == "IdentityN" and producer.endswith("/IdentityN")
        assert output == k
        assert u["backward"] == []
        assert not {"MatMul", "BiasAddGrad", "ReluGrad"} & set(
            u["host_types"])
        assert {"ReadVariableOp"} <= set(u["host_types"])
        assert u["apply_type"] in ("AssignSubVariableOp",
                                   "AssignAddVariableOp",
                                   "AssignVariableOp")
        # AdamW's decay reads the variable in a write of its own, which
        # stays on the device.
        assert not u["reads_weights"]


def test_plain_sgd_has_no_slot_to_move(found):
    assert found["sgd"]["updates"] == [] and found["sgd"]["left"] == []


@pytest.mark.parametrize("optimizer", ["momentum", "adam", "adamw",
                                       "rmsprop", "adagrad"])
def test_the_slots_are_in_host_memory_and_the_device_peak_lower(found,
                                                                optimizer):
    step = found[optimizer]
    assert step["slot_bytes"] > 0
    assert step["host_gain"] == step["device_drop"] == step["slot_bytes"]
    before, after = step["peaks"]
    assert after < before


# A model whose Adam slots outweigh its activations, an embedding (a
# sparse gradient) first, saved compiled to argv[1]; then, with the budget
# exact (TF_LMS_SIMULATOR_MEM_RATIO=1), `live_capacity.keras3_plan_at` at
# batch 8 with the slots on the device and on the host, for a budget far
# above the step (the floors) and halfway between the two floors.
_PLAN_AT = r"""
import json
import sys

import keras

from tflms import LMS
from tflms.tf import keras3_trace, live_capacity

keras.utils.set_random_seed(1)
model = keras.Sequential([
    keras.Input((16,), dtype="int32"), keras.layers.Embedding(1000, 64),
    keras.layers.Flatten(), keras.layers.Dense(512, activation="relu"),
    keras.layers.Dense(512, activation="relu"), keras.layers.Dense(4)])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
              jit_compile=False)
model.save(sys.argv[1])


def row(offload, gib):
    lms = LMS(offload_optimizer=offload)
    lms.autotune_gpu_mem = gib
    plan_at = live_capacity.keras3_plan_at(
        keras3_trace.from_model(model, 8), lms.settings)
    r = plan_at(8)
    return dict(floor=r.floor_bytes, fits=r.fits_with,
                peak=r.peak_with_bytes, step_ms=r.step_with_ms)


floors = [row(offload, 1000.0)["floor"] for offload in (False, True)]
gib = sum(floors) / 2 / float(1 << 30)
print("RESULT " + json.dumps(dict(
    floors=floors, gib=gib, without=row(False, gib), offload=row(True, gib),
    slot_bytes=sum(int(v.numpy().nbytes) for v in model.optimizer.variables
                   if len(v.shape)))))
"""


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    path = tmp_path_factory.mktemp("offload") / "model.keras"
    result, _ = result_of("-c", _PLAN_AT, path,
                          TF_LMS_SIMULATOR_MEM_RATIO="1")
    result["path"] = str(path)
    return result


def test_the_capacity_search_plans_a_keras3_step_with_offload(planned):
    """`live_capacity.keras3_plan_at` with ``offload_optimizer``: the
    floor drops by the slots (all of them: the embedding's too) at least
    (the update's arithmetic on the largest kernel, which sets the floor
    without offload, leaves the device too), and halfway between the
    floors only the plan with offload fits."""
    without, offloaded = planned["floors"]
    assert without - offloaded >= planned["slot_bytes"]
    assert not planned["without"]["fits"]
    assert planned["offload"]["fits"]
    assert planned["offload"]["peak"] <= planned["gib"] * (1 << 30)
    assert planned["offload"]["step_ms"] > 0


def _plan_json(path, gib, *flags):
    from _keras3 import python
    out = python("-m", "tflms", "plan", path, "--batch-size", 8,
                 "--autotune-gpu-mem", "%.12f" % gib, "--json",
                 "--no-plots", *flags, TF_LMS_SIMULATOR_MEM_RATIO="1")
    assert out.stdout.strip(), out.stderr[-3000:]
    return out.returncode, json.loads(out.stdout)


def test_tflms_plan_offloads_a_keras3_model(planned):
    """``tflms plan --offload-optimizer`` on the saved model at the same
    budget: the plan fits with every trainable variable's update on the
    host, where without the flag none does."""
    code, report = _plan_json(planned["path"], planned["gib"],
                              "--offload-optimizer")
    assert code == 0, report
    assert report["fits"] and report["error"] is None
    moved = report["offload"]
    assert len(moved["variables"]) == 7  # the embedding, 3 kernels, 3 biases
    assert moved["slot_bytes"] == planned["slot_bytes"]
    assert moved["left"] == []
    assert any("the step was planned, not rewritten" in note
               for note in report["notes"])
    assert report["floor"]["floor_bytes"] == planned["floors"][1]
    code, report = _plan_json(planned["path"], planned["gib"])
    assert not report["fits"]


def test_tflms_capacity_reports_the_batch_with_offload_beside_without(
        planned, tmp_path):
    """``tflms capacity --offload-optimizer`` searches twice, with the
    optimizer's state on the device and on the host, and reports both
    largest batches with their predicted steps (issue 49, item 4): at the
    budget halfway between the floors at batch 8, batch 8 has a plan with
    the state on the host only."""
    from _keras3 import python
    path = tmp_path / "capacity.json"
    out = python("-m", "tflms", "capacity", planned["path"],
                 "--offload-optimizer", "--autotune-gpu-mem",
                 "%.12f" % planned["gib"], "--start-batch", 8,
                 "--max-batch", 64, "--json", path,
                 TF_LMS_SIMULATOR_MEM_RATIO="1")
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(path.read_text())
    on_device = found["without_offload"]
    assert "without_offload" not in on_device
    assert on_device["max_batch_with_lms"] is None
    best = found["max_batch_with_lms"]
    assert best is not None and best >= 8
    row = {r["batch"]: r for r in found["rows"]}[best]
    assert row["step_with_ms"] > 0
    lines = out.stdout.splitlines()
    assert any(line.startswith(
        "The optimizer's state on the device and on the host "
        "(--offload-optimizer; with it on the device: %d batches searched "
        "in " % len(on_device["rows"])) for line in lines)
    assert "  Largest batch with LMS, state on the device:    none (not " \
        "even batch 8)" in lines
    assert any(line.startswith(
        "  Largest batch with LMS, state on the host:      %d, predicted "
        "step %.1f ms" % (best, row["step_with_ms"])) for line in lines)
