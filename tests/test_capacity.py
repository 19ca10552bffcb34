"""`tflms capacity` and `tflms.capacity`: the largest batches found agree
with `tflms plan` at that batch (fits) and at the batch above it that the
search tried (does not fit, or no plan), on a Session graph whose batch
dimension is free; the JSON keys; bad arguments named; the search on a
literal graph, over the batch and over the sequence length. (The Python
calls on a live graph or Keras 3 model, and the search over the sequence
of Keras 3 transformers: tests/test_live_capacity.py.)"""

import dataclasses
import json

import pytest
import tensorflow as tf

from tflms import analysis
from tflms import capacity
from tflms import cli
from tflms import graph_index as gi
from tflms.settings import Settings

from _graphs import v1_cnn

_GIB = float(1 << 30)


@pytest.fixture(scope="module")
def meta(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("capacity") / "cnn.meta")
    with tf.Graph().as_default():
        v1_cnn()
        tf.compat.v1.train.export_meta_graph(filename=path)
    return path


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _plan(capsys, meta_path, batch, gpu_mem):
    code, out, _ = _run(capsys, "plan", meta_path, "--batch-size", batch,
                        "--autotune-gpu-mem", gpu_mem, "--no-plots",
                        "--json")
    return code, json.loads(out)


def _budget(capsys, meta_path):
    """--autotune-gpu-mem (GiB) at which batch 64 needs LMS: half the
    step's peak without LMS, over the default memory ratio."""
    _, report = _plan(capsys, meta_path, 64, 1000)
    return "%.6f" % (report["without_lms"]["peak_bytes"] * 0.5 / 0.9 / _GIB)


def test_capacity_agrees_with_plan_at_each_answer_and_the_batch_above(
        meta, capsys, tmp_path):
    gpu_mem = _budget(capsys, meta)
    out_file = tmp_path / "capacity.json"
    code, out, err = _run(capsys, "capacity", meta, "--autotune-gpu-mem",
                          gpu_mem, "--max-overhead", "25", "--json",
                          out_file, "--plot", tmp_path / "capacity.png")
    assert code == 0, err
    found = json.loads(out_file.read_text())
    for key in ("max_batch_without_lms", "max_batch_with_lms",
                "max_batch_within_overhead", "rows"):
        assert key in found, key
    best_without = found["max_batch_without_lms"]
    best_with = found["max_batch_with_lms"]
    within = found["max_batch_within_overhead"]
    assert 1 <= best_without < best_with
    assert best_without <= within <= best_with
    rows = {r["batch"]: r for r in found["rows"]}
    assert "Largest batch without LMS: %d (%d does not" % (
        best_without, found["next_without_lms"]) in out
    assert "Largest batch with LMS: %d," % best_with in out

    # Without LMS: fits at the answer, not at the batch above it.
    code, report = _plan(capsys, meta, best_without, gpu_mem)
    assert code == 0 and not report["lms_needed"], report
    assert report["without_lms"]["peak_bytes"] == rows[best_without][
        "peak_without_bytes"]
    code, report = _plan(capsys, meta, found["next_without_lms"], gpu_mem)
    assert report["without_lms"]["fits"] is False
    # With LMS: a plan at the answer, none at the batch above it.
    code, report = _plan(capsys, meta, best_with, gpu_mem)
    assert code == 0 and report["lms_needed"] and report["fits"], report
    assert report["with_lms"]["peak_bytes"] == rows[best_with][
        "peak_with_bytes"]
    assert report["floor"]["floor_bytes"] == rows[best_with]["floor_bytes"]
    code, report = _plan(capsys, meta, found["next_with_lms"], gpu_mem)
    assert code == 1 and report["error"], report
    # Within the overhead: the step time tflms plan predicts.
    code, report = _plan(capsys, meta, within, gpu_mem)
    step = report["step_time"]
    with_ms = step["with_lms_ms"] or step["without_lms_ms"]
    assert with_ms <= 1.25 * step["without_lms_ms"] + 1e-9
    above = rows[found["next_within_overhead"]]
    assert not above["fits_with"] or above["overhead_pct"] > 25
    # Every row's samples per second is its batch over its step, and no
    # plan is below its floor.
    for r in found["rows"]:
        if r["peak_with_bytes"] is not None:
            assert r["floor_bytes"] <= r["peak_with_bytes"]
        if r["samples_per_s_with"] is not None:
            assert r["samples_per_s_with"] == pytest.approx(
                r["batch"] / (r["step_with_ms"] / 1e3))
    with open(tmp_path / "capacity.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_oracle_measures_the_two_largest_batches(meta, capsys, tmp_path):
    gpu_mem = _budget(capsys, meta)
    out_file = tmp_path / "capacity.json"
    code, out, err = _run(capsys, "capacity", meta, "--autotune-gpu-mem",
                          gpu_mem, "--oracle", "--json", out_file)
    assert code == 0, err
    found = json.loads(out_file.read_text())
    measured = {r["batch"]: r["oracle"] for r in found["rows"]
                if r["oracle"]}
    assert sorted(measured) == [found["max_batch_without_lms"],
                                found["max_batch_with_lms"]]
    without = measured[found["max_batch_without_lms"]]
    assert without["without_lms"]["fits"]
    assert without["simulator_without_lms_peak_bytes"] <= found[
        "budget_bytes"]
    with_lms = measured[found["max_batch_with_lms"]]
    assert with_lms["with_lms"]["runtime_peak_bytes"] > 0
    assert with_lms["simulator_with_lms_peak_bytes"] <= found["budget_bytes"]
    assert "Oracle (Grappler's virtual GPU" in out
    assert "batch %d with LMS:" % found["max_batch_with_lms"] in out


def test_bad_arguments_name_the_flag(meta, capsys):
    for argv, flag in (
            (["--max-overhead", "-5"], "--max-overhead"),
            (["--start-batch", "0"], "--start-batch"),
            (["--max-batch", "x"], "--max-batch"),
            (["--batch-size", "8"], "--batch-size")):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["capacity", meta, "--autotune-gpu-mem", "1"] + argv)
        assert exit_info.value.code == 2
        assert flag in capsys.readouterr().err, argv
    code, _, err = _run(capsys, "capacity", meta, "--autotune-gpu-mem", "1",
                        "--start-batch", "10", "--max-batch", "5")
    assert code == 2 and "--start-batch 10 is above --max-batch 5" in err
    code, _, err = _run(capsys, "capacity", meta)
    assert code == 2 and "--autotune-gpu-mem" in err, err


def test_the_flags_of_the_other_dimension_are_refused(meta, capsys):
    """--dimension sequence needs --batch-size; each dimension's bounds
    are refused by the other, --oracle by the sequence; a Session graph
    cannot be searched by sequence. Each message names the flag, the
    value and the fix."""
    base = ["capacity", meta, "--autotune-gpu-mem", "1"]
    for argv, message in (
            (["--dimension", "sequence"],
             "argument --batch-size: --dimension sequence searches the "
             "sequence length at a fixed batch: pass --batch-size N"),
            (["--dimension", "sequence", "--batch-size", "2",
              "--start-batch", "4"],
             "argument --start-batch: --start-batch 4 is a flag of "
             "--dimension batch, and this search is over the sequence: "
             "remove --start-batch, or add --dimension batch"),
            (["--max-sequence", "64"],
             "argument --max-sequence: --max-sequence 64 is a flag of "
             "--dimension sequence, and this search is over the batch (the "
             "default): remove --max-sequence, or add --dimension sequence"),
            (["--batch-size", "8"],
             "argument --batch-size: --batch-size 8 is a flag of "
             "--dimension sequence"),
            (["--dimension", "sequence", "--batch-size", "2", "--oracle"],
             "argument --oracle: the oracle measures batches as tflms plan "
             "does, which traces a Keras 3 model at its saved shapes, not at "
             "a sequence length: remove --oracle with --dimension sequence")):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(base + argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, argv
    code, _, err = _run(capsys, *(base + ["--dimension", "sequence",
                                          "--batch-size", "2"]))
    assert code == 2
    assert ("--dimension sequence traces a Keras 3 model at each sequence "
            "length, and %s is not a model saved by Keras 3" % meta) in err
    assert "or search the batch with --dimension batch" in err
    code, _, err = _run(capsys, *(base + [
        "--dimension", "sequence", "--batch-size", "2", "--start-sequence",
        "9", "--max-sequence", "8"]))
    assert code == 2
    assert ("--start-sequence 9 is above --max-sequence 8: give a "
            "--max-sequence of at least 9") in err


def test_a_graph_of_static_shapes_is_refused(tmp_path, capsys):
    path = str(tmp_path / "static.meta")
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 32], name="x")
        w = tf.compat.v1.get_variable("w", [32, 4])
        loss = tf.reduce_sum(tf.matmul(x, w))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(
            0.1).minimize(loss)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP,
                                       train_op)
        tf.compat.v1.train.export_meta_graph(filename=path)
    code, _, err = _run(capsys, "capacity", path, "--autotune-gpu-mem", "1")
    assert code == 2
    assert "only static shapes, so its batch cannot change" in err


def _literal_chain():
    """x (batch x 1000 floats) -> f1..f4 -> g4..g1, each g reading its f:
    every activation scales with the batch; one 4000-byte variable."""
    shape = ((None, 1000), 4)
    ops = [("x", "Placeholder", {"outputs": [shape]}),
           ("w", "VarHandleOp", {"outputs": [((), 0)],
                                 "variable_bytes": 4000})]
    edges = []
    prev = "x"
    for k in range(1, 5):
        ops.append(("f%d" % k, "MatMul", {"outputs": [shape]}))
        edges.append((prev, "f%d" % k))
        prev = "f%d" % k
    ops.append(("g4", "MatMul", {"outputs": [shape]}))
    edges.append(("f4", "g4"))
    for k in range(3, 0, -1):
        ops.append(("g%d" % k, "MatMul", {"outputs": [shape]}))
        edges += [("g%d" % (k + 1), "g%d" % k), ("f%d" % k, "g%d" % k)]
    return gi.from_edges(ops, edges=edges)


def test_search_on_a_literal_graph_brackets_each_answer():
    index = _literal_chain()
    roles = analysis.classify_ops(index)
    budget = 40 * 4000 * 5 + 4000  # five activations at batch 40
    settings = Settings(autotune_gpu_mem=budget / _GIB,
                        interconnect="instant")
    env = {"TF_LMS_SIMULATOR_MEM_RATIO": "1"}

    def plan_at(batch):
        return capacity.plan_row(index, roles, settings, batch, env=env)

    found = capacity.search(plan_at, budget)
    best, above = found.max_batch_with_lms, found.next_with_lms
    assert found.row(best).fits_with and not found.row(above).fits_with
    assert above == best + 1
    best, above = found.max_batch_without_lms, found.next_without_lms
    assert found.row(best).fits_without
    assert not found.row(above).fits_without and above == best + 1
    assert found.max_batch_without_lms < found.max_batch_with_lms
    # The floor at the largest batch with LMS is within the budget, and
    # the batch above has no plan.
    assert found.row(found.max_batch_with_lms).floor_bytes <= budget
    assert found.max_batch_within_overhead is None


def test_search_checks_its_arguments():
    with pytest.raises(ValueError, match="start must be a positive batch"):
        capacity.search(lambda b: None, 1, start=0)
    with pytest.raises(ValueError, match="limit must be a batch size"):
        capacity.search(lambda b: None, 1, start=4, limit=2)
    with pytest.raises(ValueError, match="max_overhead_pct must be"):
        capacity.search(lambda b: None, 1, max_overhead_pct=-1)
    with pytest.raises(ValueError, match="dimension must be one of batch, "
                       "sequence; got 'length'"):
        capacity.search(lambda b: None, 1, dimension="length")
    with pytest.raises(ValueError, match="start must be a positive sequence "
                       "length; got 0"):
        capacity.search(lambda b: None, 1, start=0, dimension="sequence")


def _literal_attention(length):
    """x (length x 64 floats) -> scores s1..s3 (length x length each) ->
    g3..g1, each g reading its s: the step's bytes are quadratic in the
    sequence length, as attention's are; one 4000-byte variable."""
    ops = [("x", "Placeholder", {"outputs": [((length, 64), 4)]}),
           ("w", "VarHandleOp", {"outputs": [((), 0)],
                                 "variable_bytes": 4000})]
    square = ((length, length), 4)
    edges = []
    prev = "x"
    for k in range(1, 4):
        ops.append(("s%d" % k, "MatMul", {"outputs": [square]}))
        edges.append((prev, "s%d" % k))
        prev = "s%d" % k
    ops.append(("g3", "MatMul", {"outputs": [square]}))
    edges.append(("s3", "g3"))
    for k in (2, 1):
        ops.append(("g%d" % k, "MatMul", {"outputs": [square]}))
        edges += [("g%d" % (k + 1), "g%d" % k), ("s%d" % k, "g%d" % k)]
    return gi.from_edges(ops, edges=edges)


def test_search_over_the_sequence_on_a_literal_graph():
    """dimension="sequence": each length planned on its own index; the
    answers bracketed by a length that fits and the one above that does
    not, found from the quadratic prediction; JSON keys named for the
    sequence; the batch's names refused."""
    settings = Settings(autotune_gpu_mem=(4 * 100 * 100 * 4 + 4000) / _GIB,
                        interconnect="instant")
    env = {"TF_LMS_SIMULATOR_MEM_RATIO": "1"}
    budget = 4 * 100 * 100 * 4 + 4000  # four scores at length 100
    planned = []

    def plan_at(length):
        planned.append(length)
        index = _literal_attention(length)
        return capacity.plan_row(index, analysis.classify_ops(index),
                                 settings, 2, env=env, sequence=length)

    found = dataclasses.replace(
        capacity.search(plan_at, budget, dimension="sequence", limit=4096),
        batch_size=2)
    best, above = found.max_sequence_without_lms, found.next_without_lms
    assert above == best + 1
    assert found.row(best).fits_without and not found.row(above).fits_without
    best, above = found.max_sequence_with_lms, found.next_with_lms
    assert above == best + 1 and best > found.max_sequence_without_lms
    assert found.row(best).fits_with and not found.row(above).fits_with
    # Each answer checked against the simulator on the index at that
    # length, outside the search: peaks without LMS either side of the
    # budget.
    for length, fits in ((found.max_sequence_without_lms, True),
                         (found.next_without_lms, False)):
        index = _literal_attention(length)
        roles = analysis.classify_ops(index)
        peak = capacity.pipeline.simulate_without(
            index, roles, settings.replace(batch_size=2)).peak_device_bytes
        assert (peak <= budget) is fits, (length, peak, budget)
    # The three lengths fitted (1, 2, 4, 8) gave the longest without LMS
    # exactly: tried with the one above it right after them.
    assert planned[:6] == [1, 2, 4, 8, found.max_sequence_without_lms,
                           found.next_without_lms]
    out = found.as_dict()
    assert {"max_sequence_without_lms", "max_sequence_with_lms",
            "max_sequence_within_overhead", "dimension", "batch_size",
            "limit_reason"} <= set(out)
    assert not [k for k in out if k.startswith("max_batch")]
    assert out["dimension"] == "sequence" and out["batch_size"] == 2
    row = out["rows"][0]
    assert row["sequence"] == 1 and row["batch"] == 2
    assert row["tokens_per_s_with"] == pytest.approx(
        row["samples_per_s_with"] * 1)
    with pytest.raises(AttributeError, match="this search was over the "
                       "sequence, not the batch: read largest_with_lms "
                       "\\(or max_sequence_with_lms\\)"):
        _ = found.max_batch_with_lms


def test_a_batch_search_keeps_its_json_keys():
    index = _literal_chain()
    roles = analysis.classify_ops(index)
    settings = Settings(autotune_gpu_mem=(40 * 4000 * 5 + 4000) / _GIB,
                        interconnect="instant")
    env = {"TF_LMS_SIMULATOR_MEM_RATIO": "1"}
    found = capacity.search(
        lambda b: capacity.plan_row(index, roles, settings, b, env=env),
        40 * 4000 * 5 + 4000, limit=64)
    out = found.as_dict()
    assert set(out) == {
        "budget_bytes", "max_batch_without_lms", "max_batch_with_lms",
        "max_batch_within_overhead", "max_overhead_pct", "next_without_lms",
        "next_with_lms", "next_within_overhead", "limit", "rows", "seconds"}
    assert "sequence" not in out["rows"][0]
    assert "tokens_per_s_with" not in out["rows"][0]
    with pytest.raises(AttributeError, match="over the batch, not the "
                       "sequence"):
        _ = found.max_sequence_with_lms
    # A search with offload_optimizer carries the one without it, whose
    # JSON keys are the same.
    both = dataclasses.replace(found, without_offload=found).as_dict()
    assert set(both) == set(out) | {"without_offload"}
    assert both["without_offload"] == out
