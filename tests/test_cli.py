"""`tflms plan`: the planning command on saved Keras models, a MetaGraph and
a SavedModel.

Budgets are derived from the peak the command itself reports for the
untouched graph (never hard-coded), then set above it (LMS not needed),
below it (LMS needed and must fit), and far below it (nothing fits: exit
status 1). The with-LMS peak is checked against an independent replay of
the graph LMS really rewrote. Most runs call `cli.main` in-process (fast);
a few go through ``python -m tflms`` for the real exit status and --help.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tflms.tf import reader
from tflms import LMS
from tflms import analysis
from tflms import autotune
from tflms import cli
from tflms.cli import arguments, planning, rendering
from tflms.tf import oracle
from tflms import pipeline
from tflms import simulator

import _graphs
from zoo import models

BATCH = 16
_GIB = float(1 << 30)


def _keras_cnn():
    """A small ResNet-style CNN whose activations dominate its memory."""
    layers = tf.keras.layers
    init = iter(range(100))

    def conv(x, filters):
        return layers.Conv2D(
            filters, 3, padding="same", activation="relu",
            kernel_initializer=tf.keras.initializers.HeNormal(
                seed=next(init)))(x)

    inputs = tf.keras.Input((32, 32, 3))
    x = conv(inputs, 16)
    for _ in range(3):
        x = layers.Add()([x, conv(conv(x, 16), 16)])
    x = layers.MaxPooling2D()(x)
    x = conv(x, 32)
    x = layers.Add()([x, conv(conv(x, 32), 32)])
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(10, activation="softmax")(x)
    return tf.keras.Model(inputs, outputs)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Paths of the saved graphs: Keras .h5 (compiled), Keras SavedModel
    (not compiled), a MetaGraph of a tf.compat.v1 training graph, and an
    inference-only v1 SavedModel."""
    root = tmp_path_factory.mktemp("saved")
    paths = {}
    with tf.Graph().as_default():
        model = _keras_cnn()
        model.compile(optimizer="sgd",
                      loss="sparse_categorical_crossentropy")
        paths["h5"] = str(root / "cnn.h5")
        model.save(paths["h5"])
    with tf.Graph().as_default():
        model = _keras_cnn()
        paths["keras_savedmodel"] = str(root / "cnn_savedmodel")
        model.save(paths["keras_savedmodel"])
    graph = tf.Graph()
    with graph.as_default():
        built = models.cnn_bn(image=32, channels=8, depth=6, batch=BATCH,
                              seed=1)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP,
                                       built.train_op)
        paths["meta"] = str(root / "cnn_bn.meta")
        tf.compat.v1.train.export_meta_graph(filename=paths["meta"])
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3], name="x")
        h = x
        for i in range(3):
            h = tf.nn.relu(tf.compat.v1.layers.conv2d(
                h, 8, 3, padding="same", name="conv%d" % i))
        tf.reduce_mean(h, name="score")
        paths["inference"] = str(root / "inference_savedmodel")
        builder = tf.compat.v1.saved_model.Builder(paths["inference"])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder.add_meta_graph_and_variables(sess, ["serve"])
        builder.save()
    return paths


def run_cli(capsys, *argv):
    code = cli.main(["plan"] + [str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def plan_json(capsys, *argv):
    code, out, err = run_cli(capsys, *argv, "--json")
    assert out.strip(), "no JSON on stdout; stderr:\n%s" % err
    return code, json.loads(out)


def gpu_mem_for(nbytes):
    """--autotune-gpu-mem value whose budget is `nbytes`."""
    return "%.9f" % (nbytes / autotune.mem_ratio() / _GIB)


def peak_without(capsys, path, *extra):
    code, report = plan_json(capsys, path, "--autotune-gpu-mem", "1000",
                             "--no-plots", *extra)
    assert code == 0, report
    assert report["lms_needed"] is False, report
    assert report["fits"] is True
    assert report["with_lms"]["peak_bytes"] == (
        report["without_lms"]["peak_bytes"])
    assert report["swapout_bytes"] == 0
    return report["without_lms"]["peak_bytes"]


def rewritten_peak(graph, batch_size):
    """Simulator peak of the graph as LMS left it (swap ops included)."""
    index = reader.build_index(graph)
    roles = analysis.classify_ops(index)
    return simulator.SimulationModel(index, roles, batch_size).replay(
        None).peak_device_bytes


def check_transfer_times(report):
    moved = report["swapout_bytes"] + report["swapin_bytes"]
    assert moved > 0
    times = [report["transfer_ms"][name] for name, _ in cli.LINKS]
    for (name, gbps), ms in zip(cli.LINKS, times):
        assert ms == pytest.approx(moved / (gbps * 1e9) * 1e3), name
    assert times == sorted(times, reverse=True)


def test_keras_h5_fits_with_lms_and_matches_training_rewrite(
        saved, capsys, tmp_path):
    peak = peak_without(capsys, saved["h5"], "--batch-size", BATCH)
    gpu_mem = gpu_mem_for(0.6 * peak)
    plot_dir = tmp_path / "plots"
    code, report = plan_json(capsys, saved["h5"], "--batch-size", BATCH,
                             "--autotune-gpu-mem", gpu_mem,
                             "--plot-dir", plot_dir)
    assert code == 0, report
    assert report["kind"] == "Keras model (.h5)"
    assert report["training"] is True
    assert report["num_ops"] > 0 and report["num_levels"] > 0
    assert report["trainable_parameters"] > 0
    assert report["lms_needed"] and report["tuned"] and report["fits"]
    assert report["without_lms"]["peak_bytes"] == peak
    assert report["without_lms"]["fits"] is False
    budget = report["budget_bytes"]
    assert report["with_lms"]["peak_bytes"] <= budget < peak
    assert report["swapped_tensors"] > 0
    assert report["swapout_ops"] > 0 and report["swapin_ops"] > 0
    check_transfer_times(report)
    # The floor: below the plan, set by an op that computes.
    floor = report["floor"]
    assert 0 < floor["floor_bytes"] <= report["with_lms"]["peak_bytes"]
    assert floor["floor_bytes"] == (floor["resident_bytes"]
                                    + floor["input_bytes"]
                                    + floor["output_bytes"])
    assert floor["op_type"] not in ("Identity", "IdentityN", "Reshape")

    names = sorted(os.path.basename(p) for p in report["plots"])
    assert "memory_without_lms.png" in names
    assert "memory_with_lms.png" in names
    for path in report["plots"]:
        assert path.startswith(str(plot_dir))
        if path.endswith(".png"):
            with open(path, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    # Training does the same: LMS on the graph fit() runs, same settings.
    args = cli.build_parser().parse_args(["plan", saved["h5"]])
    loaded = cli.load_graph(saved["h5"], args)
    lms = LMS()
    lms.batch_size = BATCH
    lms.autotune_gpu_mem = float(gpu_mem)
    assert lms.run(loaded.graph).rewritten
    assert lms.last_run.plan.swapout_bytes() == report["swapout_bytes"]
    assert lms.last_run.plan.swapin_bytes() == report["swapin_bytes"]
    assert rewritten_peak(loaded.graph, BATCH) == (
        report["with_lms"]["peak_bytes"])


def test_keras_savedmodel_without_training_config(saved, capsys):
    peak = peak_without(capsys, saved["keras_savedmodel"], "--batch-size",
                        BATCH)
    code, out, _ = run_cli(capsys, saved["keras_savedmodel"], "--batch-size",
                           BATCH, "--autotune-gpu-mem",
                           gpu_mem_for(0.6 * peak), "--no-plots")
    assert code == 0, out
    assert "Keras SavedModel" in out
    assert "saved without a training configuration" in out
    assert "optimizer='adam'" in out
    assert "LMS parameters (auto-tuned): LMS(swapout_threshold=" in out
    assert "PCIe 3.0 x16" in out and "NVLink-C2C" in out
    assert "RESULT: fits" in out and "with LMS" in out


def test_cannot_fit_exits_1_with_the_reason(saved, capsys):
    peak = peak_without(capsys, saved["h5"], "--batch-size", BATCH)
    code, out, _ = run_cli(capsys, saved["h5"], "--batch-size", BATCH,
                           "--autotune-gpu-mem", gpu_mem_for(0.02 * peak),
                           "--no-plots")
    assert code == 1, out
    assert "no parameter set that fits" in out
    assert "RESULT: does NOT fit" in out
    assert "Try a smaller batch size" in out
    assert "No plan can go below" in out
    assert re.search(r"floor: +[0-9.]+ [MG]iB  no plan goes below it: "
                     r"\S+ \(\w+\) needs its inputs", out), out
    code, report = plan_json(capsys, saved["h5"], "--batch-size", BATCH,
                             "--autotune-gpu-mem", gpu_mem_for(0.02 * peak),
                             "--no-plots")
    assert code == 1
    assert report["fits"] is False and "no parameter set" in report["error"]
    assert report["without_lms"]["peak_bytes"] == peak
    assert report["floor"]["floor_bytes"] > report["budget_bytes"] or \
        "smallest plan it found" in report["error"]


def test_metagraph_auto_and_fixed_parameters(saved, capsys):
    peak = peak_without(capsys, saved["meta"])
    code, report = plan_json(capsys, saved["meta"], "--autotune-gpu-mem",
                             gpu_mem_for(0.75 * peak), "--no-plots")
    assert code == 0, report
    assert report["kind"] == "MetaGraph" and report["training"]
    assert report["lms_needed"] and report["fits"]
    assert report["with_lms"]["peak_bytes"] <= report["budget_bytes"] < peak
    check_transfer_times(report)

    fixed = ("--swapout-threshold", 2, "--swapin-ahead", 1,
             "--swapin-groupby", 0, "--sync-mode", 3)
    code, report = plan_json(capsys, saved["meta"], "--autotune-gpu-mem",
                             "1000", "--no-plots", *fixed)
    assert code == 0, report
    assert report["tuned"] is False and report["lms_needed"]
    assert report["params"] == {"swapout_threshold": 2, "swapin_ahead": 1,
                                "swapin_groupby": 0, "sync_mode": 3}
    fixed_peak = report["with_lms"]["peak_bytes"]
    assert fixed_peak < peak
    # Fixed parameters are not tuned: a budget below their plan fails.
    code, out, _ = run_cli(capsys, saved["meta"], "--autotune-gpu-mem",
                           gpu_mem_for(0.9 * fixed_peak), "--no-plots",
                           *fixed)
    assert code == 1, out
    assert "RESULT: does NOT fit" in out


def test_recompute_is_reported_beside_the_swaps(saved, capsys):
    fixed = ("--autotune-gpu-mem", "1000", "--no-plots",
             "--swapout-threshold", 2, "--swapin-ahead", 1,
             "--swapin-groupby", 0)
    code, swap_only = plan_json(capsys, saved["meta"], *fixed)
    assert code == 0 and swap_only["recomputed_tensors"] == 0
    code, hybrid = plan_json(capsys, saved["meta"], *fixed, "--recompute")
    assert code == 0, hybrid
    # cnn_bn's relu(batch_norm(conv)) outputs but the first, two clones
    # each. With in-place writes the swap-only plan peaks at 1,923,328
    # bytes (512 KiB less); recomputing the first (512 KiB) would hold its
    # clone beside conv1's input gradient and bn1's gradient, peaking at
    # 2,185,632 bytes: over that peak, so it stays swapped.
    assert hybrid["recomputed_tensors"] == 5
    assert hybrid["recompute_ops"] == 10
    assert hybrid["swapped_tensors"] == swap_only["swapped_tensors"] - 5
    assert hybrid["recompute_bytes"] > 0
    moved = hybrid["swapout_bytes"] + hybrid["swapin_bytes"]
    assert moved < swap_only["swapout_bytes"] + swap_only["swapin_bytes"]
    code, out, _ = run_cli(capsys, saved["meta"], *fixed, "--recompute")
    assert code == 0
    assert ("Recomputed per step instead of swapped: 5 tensors (%s), made "
            "again by 10 cloned operations" % rendering.gib(
                hybrid["recompute_bytes"])) in out


def _meta_graph(path):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(path)
    return graph


def test_oracle_measures_both_steps_beside_the_simulator(saved, capsys):
    """--oracle reports the oracle's runtime replay and Grappler's own count
    for the graph as saved and as LMS rewrote it: the numbers the oracle
    gives for those two graphs measured on their own."""
    peak = peak_without(capsys, saved["meta"])
    gpu_mem = gpu_mem_for(0.75 * peak)
    code, report = plan_json(capsys, saved["meta"], "--autotune-gpu-mem",
                             gpu_mem, "--no-plots", "--oracle")
    assert code == 0, report
    measured = report["oracle"]

    graph = _meta_graph(saved["meta"])
    train = [op.name for op in graph.get_collection(
        tf.compat.v1.GraphKeys.TRAIN_OP)]
    before = oracle.peak_memory(graph, train)
    lms = LMS()
    lms.autotune_gpu_mem = float(gpu_mem)
    result = lms.run(graph)
    assert result.rewritten
    after = oracle.peak_memory(graph, train)
    instant = pipeline.instant_replay(result.planned).peak_device_bytes
    assert measured["without_lms"] == {
        "runtime_peak_bytes": before.runtime_gpu_peak_bytes,
        "grappler_peak_bytes": before.raw_gpu_peak_bytes,
        "fits": before.runtime_gpu_peak_bytes <= report["budget_bytes"]}
    assert measured["with_lms"] == {
        "runtime_peak_bytes": after.runtime_gpu_peak_bytes,
        "grappler_peak_bytes": after.raw_gpu_peak_bytes,
        "fits": after.runtime_gpu_peak_bytes <= report["budget_bytes"],
        "simulator_instant_peak_bytes": instant}
    assert instant <= report["with_lms"]["peak_bytes"]
    assert after.runtime_gpu_peak_bytes < before.runtime_gpu_peak_bytes

    code, out, _ = run_cli(capsys, saved["meta"], "--autotune-gpu-mem",
                           gpu_mem, "--no-plots", "--oracle")
    assert code == 0
    assert "Oracle (Grappler's virtual GPU" in out
    assert "(Grappler's count %s; simulator with copies instant, as the " \
        "oracle replays them: %s)" % (
            rendering.gib(after.raw_gpu_peak_bytes),
            rendering.gib(instant)) in out


def test_oracle_measures_on_the_gpu_named(saved, capsys):
    """--oracle's virtual GPU is the --gpu one: its numbers are the
    oracle's for that GPU (its clock and cores set the schedule, so the
    order ops run in and the peak may differ from the V100's: on this
    graph Grappler's own count does, 4,143,864 against 3,832,584 bytes)."""
    code, report = plan_json(capsys, saved["meta"], "--autotune-gpu-mem",
                             "1", "--no-plots", "--oracle", "--gpu",
                             "H100-SXM5-80GB")
    assert code == 0, report
    graph = _meta_graph(saved["meta"])
    train = [op.name for op in graph.get_collection(
        tf.compat.v1.GraphKeys.TRAIN_OP)]
    h100 = oracle.peak_memory(graph, train, gpu="H100-SXM5-80GB")
    assert report["oracle"]["without_lms"]["grappler_peak_bytes"] == \
        h100.raw_gpu_peak_bytes
    assert report["oracle"]["without_lms"]["runtime_peak_bytes"] == \
        h100.runtime_gpu_peak_bytes


def test_old_memory_flag_still_works_and_warns(saved, capsys):
    code, new = plan_json(capsys, saved["meta"], "--autotune-gpu-mem", "1",
                          "--no-plots")
    old_code = cli.main(["plan", saved["meta"], "--gpu-mem", "1",
                         "--no-plots", "--json"])
    out, err = capsys.readouterr()
    assert (old_code, json.loads(out)) == (code, new)
    assert ("warning: --gpu-mem is deprecated; use --autotune-gpu-mem"
            in err)


def test_oracle_needs_a_train_op(saved, capsys):
    code, _, err = run_cli(capsys, saved["inference"], "--autotune-gpu-mem",
                           "1", "--no-plots", "--oracle")
    assert code == 2
    assert "--oracle needs the op that runs one training step" in err


def test_inference_savedmodel_is_planned_as_inference(saved, capsys):
    code, out, _ = run_cli(capsys, saved["inference"], "--batch-size", 4,
                           "--autotune-gpu-mem", "1", "--no-plots")
    assert code == 0, out
    assert "MetaGraph tagged serve" in out
    assert "nothing is trained" in out and "is_training=False" in out
    code, _, err = run_cli(capsys, saved["inference"], "--tag", "train",
                           "--autotune-gpu-mem", "1")
    assert code == 2
    assert "no MetaGraph tagged train" in err and "--tag" in err


def test_keras_inference_plans_the_forward_graph(saved, capsys):
    code, training = plan_json(capsys, saved["h5"], "--batch-size", BATCH,
                               "--autotune-gpu-mem", "1", "--no-plots")
    assert code == 0 and training["training"] is True
    code, report = plan_json(capsys, saved["h5"], "--batch-size", BATCH,
                             "--autotune-gpu-mem", "1", "--no-plots",
                             "--inference")
    assert code == 0, report
    assert report["training"] is False
    assert "forward graph only" in report["notes"][0]
    assert report["num_ops"] < training["num_ops"]
    assert (report["without_lms"]["peak_bytes"]
            < training["without_lms"]["peak_bytes"])


def test_missing_batch_size_names_the_flag(saved, capsys):
    code, _, err = run_cli(capsys, saved["h5"], "--autotune-gpu-mem", "1",
                           "--no-plots")
    assert code == 2
    assert "--batch-size" in err
    assert "Traceback" not in err


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")),
                    reason="with a GPU the budget defaults to its memory")
def test_no_gpu_and_no_budget_names_the_flag(saved, capsys):
    code, _, err = run_cli(capsys, saved["meta"], "--no-plots")
    assert code == 2
    assert "no GPU" in err and "--autotune-gpu-mem" in err


def test_bad_paths_are_clear_errors(tmp_path, capsys):
    code, _, err = run_cli(capsys, tmp_path / "missing.meta",
                           "--autotune-gpu-mem", 1)
    assert code == 2 and "does not exist" in err
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    code, _, err = run_cli(capsys, other, "--autotune-gpu-mem", 1)
    assert code == 2 and ".meta" in err and ".h5" in err
    code, _, err = run_cli(capsys, tmp_path, "--autotune-gpu-mem", 1)
    assert code == 2 and "saved_model.pb" in err


def test_bad_lms_value_is_rejected(saved, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["plan", saved["meta"], "--swapin-ahead", "0"])
    assert exc.value.code == 2
    assert "--swapin-ahead" in capsys.readouterr().err


def test_transfer_times_use_bytes_over_bandwidth():
    times = planning.transfer_ms(15.75e9)
    assert times["PCIe 3.0 x16"] == pytest.approx(1000.0)
    assert times["PCIe 4.0 x16"] == pytest.approx(500.0)
    assert np.all(np.diff([gbps for _, gbps in cli.LINKS]) > 0)


def _run_module(*argv, cwd=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "tflms"] + list(argv),
                          capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd, check=False)


def test_module_help_and_exit_status(saved, tmp_path):
    proc = _run_module("plan", "--help")
    assert proc.returncode == 0, proc.stderr
    for flag in ("--batch-size", "--autotune-gpu-mem", "--swapout-threshold",
                 "--swapin-ahead", "--swapin-groupby", "--sync-mode",
                 "--serialization", "--serialization-by-size",
                 "--plot-dir", "--loss", "--optimizer", "--json"):
        assert flag in proc.stdout, flag
    proc = _run_module()
    assert proc.returncode == 2 and "plan" in proc.stderr
    # A budget far too small: the process itself exits with status 1.
    proc = _run_module("plan", saved["meta"], "--autotune-gpu-mem", "0.00001",
                       "--no-plots", cwd=str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "RESULT: does NOT fit" in proc.stdout


def test_tf2_function_savedmodel_is_refused(tmp_path):
    path = tmp_path / "tf2_module"
    script = (
        "import tensorflow as tf\n"
        "class M(tf.Module):\n"
        "    def __init__(self):\n"
        "        self.w = tf.Variable(tf.ones([8, 8]))\n"
        "    @tf.function(input_signature=[tf.TensorSpec([None, 8])])\n"
        "    def __call__(self, x):\n"
        "        return tf.matmul(x, self.w)\n"
        "tf.saved_model.save(M(), %r)\n" % str(path))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300,
                   capture_output=True,
                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    proc = _run_module("plan", str(path), "--autotune-gpu-mem", "1",
                       "--no-plots")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "TensorFlow 2 functions" in proc.stderr
    assert "export_meta_graph" in proc.stderr


# ---- models compiled with TF2 optimizers in eager mode -------------------
# Keras 2.11+ optimizers (tf.keras.optimizers.SGD, Adam...) cannot build a
# graph-mode train function; `tflms plan` swaps in their
# tf.keras.optimizers.legacy namesakes with the same settings
# (_graphs.save_tf2_keras_model saves such a model).


def _apply_ops(graph):
    return {op.type: op for op in graph.get_operations()
            if op.type.startswith("ResourceApply")}


@pytest.mark.parametrize("fmt", ["h5", "keras", "savedmodel"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_model_saved_with_tf2_optimizer_is_planned(optimizer, fmt, tmp_path,
                                                   capsys):
    name = "model" if fmt == "savedmodel" else "model." + fmt
    path, _ = _graphs.save_tf2_keras_model(optimizer, tmp_path / name)
    args = cli.build_parser().parse_args(["plan", path])
    loaded = cli.load_graph(path, args)
    assert loaded.training
    legacy = {"sgd": "SGD", "adam": "Adam"}[optimizer]
    notes = " ".join(loaded.notes)
    assert ("The saved optimizer %s is a TF2 optimizer, which cannot build "
            "a graph-mode training step; planned with its graph-mode "
            "equivalent" % legacy) in notes
    assert "optimizers.legacy.%s and the same settings" % legacy in notes
    rate = {"sgd": "0.05", "adam": "0.002"}[optimizer]
    assert "(learning_rate=%s). Change it with --optimizer." % rate in notes, \
        notes
    applies = _apply_ops(loaded.graph)
    if optimizer == "sgd":
        # momentum and nesterov carried over: the momentum update, with
        # Nesterov's variant switched on.
        assert set(applies) == {"ResourceApplyKerasMomentum"}, applies
        assert applies["ResourceApplyKerasMomentum"].get_attr("use_nesterov")
    else:
        assert set(applies) == {"ResourceApplyAdam"}, applies
    # The whole command plans it too.
    code, report = plan_json(capsys, path, "--autotune-gpu-mem", "1000",
                             "--no-plots", "--batch-size", 4)
    assert code == 0 and report["fits"] is True, report


def test_tf2_optimizer_without_legacy_twin_names_the_flag(tmp_path, capsys):
    path, _ = _graphs.save_tf2_keras_model("adamw",
                                           tmp_path / "adamw.h5")
    code, _, err = run_cli(capsys, path, "--autotune-gpu-mem", "1",
                           "--no-plots",
                           "--batch-size", 4)
    assert code == 2
    assert ("the model was saved with the optimizer AdamW, which cannot "
            "build a graph-mode training step and has no graph-mode "
            "equivalent in ") in err, err
    assert "pass a graph-mode optimizer with --optimizer" in err
    # ... and the flag works.
    code, report = plan_json(capsys, path, "--autotune-gpu-mem", "1000",
                             "--no-plots", "--batch-size", 4, "--optimizer",
                             "adam")
    assert code == 0, report


def test_plan_prints_the_predicted_step_time(saved, capsys):
    """The step-time block is `steptime.StepTimeModel` on the plan LMS
    made, for the chosen GPU and link (defaults: V100, PCIe 4.0)."""
    from tflms import pipeline, steptime
    from tflms.settings import Settings
    fixed = ("--swapout-threshold", 2, "--swapin-ahead", 1,
             "--swapin-groupby", 0, "--sync-mode", 3)
    hardware = ("--gpu", "A100-SXM4-40GB", "--interconnect", "pcie3")
    code, report = plan_json(capsys, saved["meta"], "--autotune-gpu-mem",
                             "1000", "--no-plots", *fixed, *hardware)
    assert code == 0, report
    planned = pipeline.plan(
        reader.build_index(_meta_graph(saved["meta"])),
        Settings(swapout_threshold=2, swapin_ahead=1, swapin_groupby=0,
                 sync_mode=3, autotune_gpu_mem=1000), simulate=True)
    step = steptime.StepTimeModel(
        planned.index, planned.context.roles, None, gpu="A100-SXM4-40GB",
        interconnect="pcie3").predict(planned.plan, planned.with_lms.levels,
                                      planned.with_lms.num_levels)
    assert report["step_time"] == {
        "gpu": "A100-SXM4-40GB", "interconnect": "PCIe 3.0 x16",
        "without_lms_ms": step.without_lms_s * 1e3,
        "with_lms_ms": step.with_lms_s * 1e3,
        "exposed_transfer_ms": step.exposed_transfer_s * 1e3}
    # Synchronous copies: the device waits, but never longer than the
    # links are busy (while it waits, some copy is running).
    assert 0 < step.exposed_transfer_s <= (step.swapout_busy_s
                                           + step.swapin_busy_s)
    code, out, _ = run_cli(capsys, saved["meta"], "--autotune-gpu-mem",
                           "1000", "--no-plots", *fixed, *hardware)
    assert code == 0
    assert ("Predicted step time on A100-SXM4-40GB, copies over PCIe 3.0 "
            "x16 (step-time model: fitted rates, one op at a time):\n"
            "  without LMS: %10.2f ms\n"
            "  with LMS:    %10.2f ms  (exposed transfer time %.2f ms)\n"
            % (step.without_lms_s * 1e3, step.with_lms_s * 1e3,
               step.exposed_transfer_s * 1e3)) in out

    code, report = plan_json(capsys, saved["meta"], "--autotune-gpu-mem",
                             "1000", "--no-plots")
    assert code == 0 and not report["lms_needed"]
    t = report["step_time"]
    assert (t["gpu"], t["interconnect"]) == ("V100-SXM2-16GB",
                                             "PCIe 4.0 x16")
    assert t["with_lms_ms"] is None and t["exposed_transfer_ms"] is None
    # The same graph on the slower GPU takes longer.
    assert t["without_lms_ms"] > step.without_lms_s * 1e3
    # --gpu is the `gpu` setting's flag: the setting's check names it.
    assert cli.main(["plan", saved["meta"], "--gpu", "P100"]) == 2
    assert ("tflms plan: error: gpu must be one of V100-SXM2-16GB, "
            "V100-SXM2-32GB, A100-SXM4-40GB, A100-SXM4-80GB, H100-SXM5-80GB, "
            "H100-PCIe-80GB "
            "(the GPU whose op times pace the copies when counting their "
            "memory); got 'P100'") in capsys.readouterr().err


def test_plan_hardware_flags_set_the_settings_the_tuner_chooses_with():
    args = cli.build_parser().parse_args(
        ["plan", "model.h5", "--gpu", "A100-SXM4-40GB",
         "--interconnect", "nvlink2"])
    settings = arguments.lms_from_args(args).settings
    assert (settings.gpu, settings.interconnect) == ("A100-SXM4-40GB",
                                                     "nvlink2")
    defaults = arguments.lms_from_args(
        cli.build_parser().parse_args(["plan", "model.h5"])).settings
    assert (defaults.gpu, defaults.interconnect) == ("V100-SXM2-16GB",
                                                     "pcie4")


# ---- the command as a program: fast help, quiet TensorFlow, progress -------
def _tflms(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "tflms"] + list(argv),
                          capture_output=True, text=True, timeout=300,
                          env=env)


def test_help_and_argument_errors_do_not_import_tensorflow():
    script = ("import sys\n"
              "from tflms import __main__ as m\n"
              "for argv in (['--help'], ['plan'], ['plan', '--help'],\n"
              "             ['verify', 'x.meta', '--steps', '0']):\n"
              "    sys.argv = ['tflms'] + argv\n"
              "    try:\n"
              "        m.main()\n"
              "    except SystemExit as e:\n"
              "        print('exit', e.code)\n"
              "print('tensorflow imported:', 'tensorflow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.count("exit 0") == 2, out.stdout
    assert out.stdout.count("exit 2") == 2, out.stdout
    assert "tensorflow imported: False" in out.stdout, out.stdout


def test_the_program_hides_tensorflow_log_lines_unless_asked(tmp_path):
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    missing = str(tmp_path / "missing.meta")
    out = _tflms("plan", missing, "--autotune-gpu-mem", "1", env=env)
    assert out.returncode == 2
    # Only the error: no oneDNN, CPU-feature or CUDA lines from TensorFlow.
    # (TensorFlow 2.21's `tensorflow` wheel still logs its CUDA probe through
    # absl before it reads TF_CPP_MIN_LOG_LEVEL: known, not yet hidden.)
    # On 2.16+ everything absl logs before that (its "All log messages
    # before absl::InitializeLog()" notice, then lines in absl's own
    # format: the CUDA probe, oneDNN's notice when TF_ENABLE_ONEDNN_OPTS=1)
    # is tolerated; nothing else.
    lines = [line for line in out.stderr.strip().splitlines()
             if not (tf.__version__ >= "2.16" and (
                 "absl::InitializeLog" in line
                 or re.match(r"^[IWE]\d{4} [\d:.]+ +\d+ \w+\.cc:\d+\] ",
                             line)))]
    assert lines == [
        "tflms plan: error: %s does not exist" % missing], out.stderr
    # The user's own setting wins (0: every line), and the library
    # entry point never sets the variable.
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    code = ("import os, sys\nfrom tflms import cli\n"
            "cli.main(['plan', %r, '--autotune-gpu-mem', '1'])\n"
            "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))\n" % missing)
    env.pop("TF_CPP_MIN_LOG_LEVEL")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.stdout.strip() == "None", out.stdout


def test_plan_progress_lines_on_stderr(saved, capsys):
    code, out, err = run_cli(capsys, saved["meta"], "--autotune-gpu-mem",
                             "1000", "--no-plots", "--progress")
    assert code == 0
    phases = [line.split("] ", 1)[1] for line in err.splitlines()
              if line.startswith("tflms plan [")]
    assert phases[0] == "loading %s ..." % saved["meta"]
    assert phases[1].startswith("planning ") and phases[1].endswith(
        " ops: index, roles, auto-tuning, rewrite ...")
    assert phases[-2:] == ["predicting the step time ...", "done"]
    assert "RESULT: fits" in out and "tflms plan [" not in out
    # Not a terminal and no --progress: no lines.
    code, _, err = run_cli(capsys, saved["meta"], "--autotune-gpu-mem",
                           "1000", "--no-plots")
    assert code == 0 and "tflms plan [" not in err


def test_verify_refuses_the_options_of_plan(capsys):
    for flag in (["--oracle"], ["--plot-dir", "plots"], ["--no-plots"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["verify", "model.meta"] + flag)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert ("tflms verify: error: %s is an option of `tflms plan`, not "
                "of `tflms verify`" % flag[0]) in err
        assert "Remove %s, or run `tflms plan GRAPH %s`" % (
            flag[0], flag[0]) in err
    verify_help = cli.build_parser()._subparsers._group_actions[0].choices[
        "verify"].format_help()
    assert "--oracle" not in verify_help and "--plot-dir" not in verify_help


def test_without_matplotlib_plan_says_plots_were_not_written(
        saved, capsys, tmp_path, monkeypatch):
    from tflms import plots
    monkeypatch.setattr(plots, "_figure_class", lambda: None)
    code, out, _ = run_cli(capsys, saved["meta"], "--autotune-gpu-mem",
                           "1000", "--plot-dir", tmp_path)
    assert code == 0
    assert ("Memory plots NOT written: matplotlib is not installed; to get "
            "them: pip install matplotlib (or pip install tflms[plot]). "
            "Written instead:\n  %s" % (tmp_path / "distance_histogram.tsv")
            ) in out
    assert "Memory plots written:" not in out


def test_fixed_plan_that_does_not_fit_suggests_only_what_was_not_set(
        saved, capsys):
    peak = peak_without(capsys, saved["meta"])
    fixed = ["--swapout-threshold", 2, "--swapin-ahead", 1,
             "--swapin-groupby", 0]
    gpu_mem = gpu_mem_for(0.02 * peak)
    code, out, _ = run_cli(capsys, saved["meta"], "--autotune-gpu-mem",
                           gpu_mem, "--no-plots", *fixed, "--sync-mode", 3)
    assert code == 1, out
    result = out.split("RESULT: ")[1]
    assert "Try a smaller --batch-size, --serialization or " \
        "--serialization-by-size, or --swapout-threshold and " \
        "--swapin-ahead and --swapin-groupby at -1 (auto) instead of " \
        "fixed." in result
    code, out, _ = run_cli(capsys, saved["meta"], "--autotune-gpu-mem",
                           gpu_mem, "--no-plots", *fixed,
                           "--serialization-by-size", "0.0001")
    result = out.split("RESULT: ")[1]
    assert "--serialization" not in result and "--sync-mode 3" in result


# ---- Keras files that are not (Keras 2) models ----------------------------
def test_text_file_named_h5_is_not_a_model(tmp_path, capsys):
    for name in ("notes.h5", "notes.keras"):
        path = tmp_path / name
        path.write_text("not a model")
        code, _, err = run_cli(capsys, path, "--autotune-gpu-mem", 1)
        assert code == 2
        assert "custom layers" not in err
        assert ("tflms plan: error: %s is not %s" % (
            path, "an HDF5 file" if name.endswith(".h5")
            else "a zip archive")) in err
        assert "check the path, or save the model again" in err


def _fake_keras3_files(root):
    """A .keras archive and an .h5 file that say Keras 3.5.0 wrote them
    (what Keras 2 cannot read)."""
    import h5py
    import zipfile
    archive = root / "k3.keras"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("metadata.json", json.dumps(
            {"keras_version": "3.5.0", "date_saved": "2024-01-01"}))
        z.writestr("config.json", json.dumps(
            {"module": "keras", "class_name": "Sequential",
             "config": {"name": "s", "layers": [
                 {"module": "keras.layers", "class_name": "InputLayer",
                  "config": {"batch_shape": [None, 3], "name": "x"}}]}}))
        z.writestr("model.weights.h5", b"")
    h5 = root / "k3.h5"
    with h5py.File(h5, "w") as f:
        f.attrs["keras_version"] = "3.5.0"
        f.attrs["backend"] = "tensorflow"
        f.attrs["model_config"] = json.dumps(
            {"class_name": "Sequential", "config": {"name": "s", "layers": [
                {"class_name": "InputLayer",
                 "config": {"batch_shape": [None, 3], "name": "x"}}]}})
    return archive, h5


def test_keras3_file_error_leads_with_the_hint(tmp_path, capsys):
    for path in _fake_keras3_files(tmp_path):
        code, _, err = run_cli(capsys, path, "--autotune-gpu-mem", 1)
        assert code == 2
        assert err.startswith(
            "tflms plan: error: %s was saved by Keras 3.5.0, and Keras 2 "
            "(" % path), err
        assert ("Build the model with Keras 2 (`import tf_keras as keras`, "
                "or tf.keras with TF_USE_LEGACY_KERAS=1 set before Python "
                "starts) and save it from there") in err
        # Keras 2's own error comes last.
        assert err.index("Keras 2's own error") > err.index("Build the model")
        assert "custom layers" not in err


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["h5", "keras_savedmodel"])
def test_verify_trains_a_keras_model(saved, kind):
    """`verify` feeds only what the train function reads: the inputs and
    the targets (shaped from the outputs; a sparse loss's labels valid),
    not the placeholders Keras makes to load weights (issue 25)."""
    out = _tflms("verify", saved[kind], "--batch-size", "4", "--steps", "2",
                 "--swapout-threshold", "1", "--swapin-ahead", "1",
                 "--swapin-groupby", "0")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "VERDICT: PASS" in out.stdout
    ran = re.search(r"Swap ops that ran: (\d+) of the (\d+) LMS added",
                    out.stdout)
    assert ran and ran.group(1) == ran.group(2) and int(ran.group(2)) > 0
    assert ("other than LMS's own: none" in out.stdout), out.stdout
