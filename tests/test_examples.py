"""Smoke tests for the scripts in examples/.

Every example runs in a subprocess at a tiny size, once without LMS (on
the first stack only) and once with LMS (with oneDNN off and on). With LMS
the swap parameters are fixed (no auto-tuning), so these tests depend only
on the graph rewriter. A run passes when it exits with 0,
its last line is a ``RESULT ...`` line showing that it trained (the loss
fell from the first step's), and, with --lms, LMS reported adding a
non-zero number of operations (and without --lms, LMS said nothing).

The shared helpers (_lms_flags, _mnist_data) get quick in-process tests.
"""

import argparse
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from _stack import NEW_STACK
from tflms import setting_flags
from tflms import settings

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES_DIR)

import _lms_flags  # noqa: E402
import _mnist_data  # noqa: E402

TIMEOUT = 300  # seconds per subprocess; the slowest (ResNet50) takes ~45

FIXED_LMS = ["--lms", "--swapout-threshold", "1", "--swapin-ahead", "1",
             "--swapin-groupby", "0"]

# script -> tiny-size arguments. At these sizes every example's loss falls
# clearly (2026-11-25, TensorFlow 2.15, both oneDNN modes: ResNet50 3.6 ->
# 1.0-1.5, the MNIST ones 2.3-5.5 -> 0.3-0.4, the U-Net 0.69 -> 0.49);
# accuracy is not judged: the ResNet50 one stays at chance.
EXAMPLES = {
    "mnist_deep_lms.py": [
        "--steps", "40", "--batch_size", "32", "--learning_rate", "1e-3",
        "--eval_samples", "300", "--log_every", "20"],
    "cnn_mnist_lms.py": [
        "--steps", "40", "--batch_size", "32", "--eval_samples", "300",
        "--log_every", "20"],
    "mnist_cnn_keras.py": [
        "--steps", "20", "--epochs", "2", "--batch_size", "32",
        "--eval_samples", "300", "--verbose", "2"],
    # One fixed batch of 4 images, 8 steps: the loss on it must fall.
    "Keras_ResNet50.py": [
        "--image_size", "32", "--batch_size", "4", "--num_samples", "4",
        "--num_classes", "2", "--steps", "4", "--epochs", "2",
        "--learning_rate", "1e-4"],
    "unet3d_lms.py": [
        "--volume_size", "16", "--base_filters", "4", "--depth", "2",
        "--batch_size", "2", "--steps", "8", "--epochs", "2"],
}

# Examples that need tf.estimator (removed in TensorFlow 2.16).
NEEDS_ESTIMATOR = {"cnn_mnist_lms.py"}

RESULT_RE = re.compile(r"^RESULT((?: \w+=-?[0-9.]+(?:e-?\d+)?|"
                       r" \w+=(?:nan|inf))+)$")
ADDED_RE = re.compile(r"\[LMS\]\[0\] Added (\d+) operations")


def run_example(script, args, cwd):
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    env["PYTHONUNBUFFERED"] = "1"
    start = time.time()
    proc = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES_DIR, script)] + args,
        cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, timeout=TIMEOUT, check=False)
    return proc, time.time() - start


def parse_result(stdout):
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "no output"
    match = RESULT_RE.match(lines[-1])
    assert match, "last line is not a RESULT line: %r" % lines[-1]
    fields = dict(item.split("=") for item in match.group(1).split())
    return {k: float(v) for k, v in fields.items()}


def _tail(text, n=40):
    return "\n".join(text.splitlines()[-n:])


# Without --lms an example runs only its own model on the stack's Keras
# and TensorFlow, and compares nothing: the plain runs are checked on the
# first stack only (CI's time). The runs with --lms are `numerics`: they
# run with oneDNN off and on (tools/run_tests.sh).
@pytest.mark.parametrize("lms", [
    pytest.param(False, marks=pytest.mark.one_stack, id="plain"),
    pytest.param(True, marks=pytest.mark.numerics, id="lms")])
@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_trains(script, lms, tmp_path):
    args = EXAMPLES[script]
    proc, seconds = run_example(script, args + (FIXED_LMS if lms else []),
                                tmp_path)
    output = proc.stdout + proc.stderr
    print("%s %s: %.1f s" % (script, "--lms" if lms else "", seconds))
    if NEW_STACK and script in NEEDS_ESTIMATOR:
        # tf.estimator is gone: the example says so and exits with 2.
        assert proc.returncode == 2, output[-3000:]
        assert ("error: examples/%s needs tf.estimator, which was removed "
                "in TensorFlow 2.16; this is TensorFlow %s. Run it on "
                "TensorFlow 2.15 (`pip install 'tflms[tf215]'`)"
                % (script, tf.__version__)) in proc.stderr, proc.stderr
        assert "RESULT" not in proc.stdout
        return
    assert proc.returncode == 0, (
        "exit code %d\n--- stdout\n%s\n--- stderr\n%s"
        % (proc.returncode, _tail(proc.stdout), _tail(proc.stderr)))

    result = parse_result(proc.stdout)
    assert {"first_loss", "loss"} <= set(result), result
    assert np.isfinite(result["loss"]), result
    assert result["loss"] < result["first_loss"], "did not train: %r" % result

    added = [int(n) for n in ADDED_RE.findall(output)]
    if lms:
        assert added, "no '[LMS][0] Added' line:\n%s" % _tail(output)
        assert added[0] > 0, "LMS added no operations:\n%s" % _tail(output)
    else:
        assert "[LMS]" not in output


def _flags_with_settings():
    """``{flag: setting}`` for every setting with a command-line flag; the
    examples give batch_size through their own --batch_size."""
    flags = {setting_flags.flag_of(f.name): f.name for f in settings.fields()
             if f.metadata["flag"] is not None}
    flags["--batch_size"] = flags.pop("--batch-size")
    return flags


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_help_lists_lms_flags(script, tmp_path):
    proc, _ = run_example(script, ["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    flags = ["--lms", "--epochs", "--steps"] + sorted(_flags_with_settings())
    for flag in flags:
        assert flag in proc.stdout, "%s --help lacks %s" % (script, flag)
    # One spelling: the deprecated underscore aliases are hidden.
    for old in ("--swapout_threshold", "--autotune_gpu_mem", "--lms_plot_dir"):
        assert old not in proc.stdout, "%s --help shows %s" % (script, old)


def test_example_help_does_not_import_tensorflow(tmp_path):
    code = (
        "import runpy, sys\n"
        "sys.path.insert(0, %r)\n"
        "sys.argv = ['mnist_deep_lms.py', '--help']\n"
        "try:\n"
        "    runpy.run_path(%r, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "                ('tensorflow', 'keras', 'tf_keras'))\n"
        "assert not loaded, loaded[:5]\n"
        % (EXAMPLES_DIR, os.path.join(EXAMPLES_DIR, "mnist_deep_lms.py")))
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "--swapout-threshold" in proc.stdout


def test_example_flags_cover_every_setting_with_a_flag():
    flags = _flags_with_settings()
    # The settings that have flags, so an empty table cannot pass.
    assert {"--swapout-threshold", "--swapin-ahead", "--swapin-groupby",
            "--sync-mode", "--autotune-gpu-mem", "--batch_size",
            "--recompute", "--serialization"} <= set(flags)
    parser = argparse.ArgumentParser()
    _lms_flags.add_size_flags(parser, image_size=28, batch_size=4, epochs=1,
                              steps=2)
    _lms_flags.add_lms_flags(parser)
    option_dest = {option: action.dest for action in parser._actions
                   for option in action.option_strings}
    for flag, name in flags.items():
        assert option_dest.get(flag) == name, (flag, name)


def test_bad_lms_flag_is_a_clean_error(tmp_path):
    proc, _ = run_example("mnist_deep_lms.py",
                          ["--lms", "--swapin-ahead", "0"], tmp_path)
    assert proc.returncode != 0
    assert ("argument --swapin-ahead: must be -1 (auto) or an int >= 1; "
            "got '0'") in proc.stderr
    assert "Traceback" not in proc.stderr


def test_make_lms_maps_every_flag(tmp_path):
    parser = argparse.ArgumentParser()
    _lms_flags.add_lms_flags(parser)
    assert _lms_flags.make_lms(parser.parse_args([])) is None
    args = parser.parse_args([
        "--lms", "--swapout-threshold", "7", "--swapin-ahead", "3",
        "--swapin-groupby", "2", "--sync-mode", "1", "--recompute",
        "--serialization",
        "1,3:5", "--serialization-by-size", "0.5", "--debug",
        "--debug-level", "2", "--cpu-device", "/device:CPU:0",
        "--gpu-device", "/device:GPU:1", "--offload-optimizer",
        "--grappler-check", "--grappler-repair", "--autotune-gpu-mem", "1.5",
        "--autotune-host-mem", "48",
        "--autotune-plot", "--plot-dir", str(tmp_path),
        "--interconnect", "nvlink2", "--gpu", "A100-SXM4-40GB",
        "--excl-output-by-scopes", "a,b/", "--excl-output-by-types", "Conv2D",
        "--excl-input-by-scopes", "c", "--excl-input-by-types", "MatMul",
        "--incl-output-by-scopes", "d", "--incl-output-by-types", "Relu",
        "--incl-input-by-scopes", "e", "--incl-input-by-types", "AddV2"])
    lms = _lms_flags.make_lms(args, batch_size=16)
    expected = settings.Settings(
        swapout_threshold=7, swapin_ahead=3, swapin_groupby=2, sync_mode=1,
        recompute=True, serialization=[1, "3:5"], serialization_by_size=0.5,
        debug=True, debug_level=2, cpu_device="/device:CPU:0",
        gpu_device="/device:GPU:1", offload_optimizer=True,
        grappler_check=True, grappler_repair=True, batch_size=16,
        autotune_gpu_mem=1.5,
        autotune_host_mem=48,
        autotune_plot=True, plot_dir=str(tmp_path),
        interconnect="nvlink2", gpu="A100-SXM4-40GB",
        excl_output_by_scopes={"a", "b/"}, excl_output_by_types={"Conv2D"},
        excl_input_by_scopes={"c"}, excl_input_by_types={"MatMul"},
        incl_output_by_scopes={"d"}, incl_output_by_types={"Relu"},
        incl_input_by_scopes={"e"}, incl_input_by_types={"AddV2"})
    assert lms.settings == expected
    # Every setting with a flag was changed from its default above.
    for name in _flags_with_settings().values():
        assert getattr(expected, name) != getattr(settings.Settings(), name), (
            name)


def test_make_lms_names_the_setting_of_a_bad_value():
    parser = argparse.ArgumentParser()
    _lms_flags.add_lms_flags(parser)
    args = parser.parse_args(["--lms", "--cpu-device", "/gpu:0"])
    with pytest.raises(SystemExit, match=r"error: bad LMS flag: cpu_device "
                       r"must name a CPU device such as '/cpu:0'; "
                       r"got '/gpu:0'"):
        _lms_flags.make_lms(args)


def test_underscore_flags_are_deprecated_aliases(capsys):
    parser = argparse.ArgumentParser()
    _lms_flags.add_lms_flags(parser)
    old = parser.parse_args([
        "--lms", "--swapout_threshold", "7", "--autotune_plot",
        "--lms_plot_dir", "plots", "--excl_output_by_types", "Conv2D"])
    new = parser.parse_args([
        "--lms", "--swapout-threshold", "7", "--autotune-plot",
        "--plot-dir", "plots", "--excl-output-by-types", "Conv2D"])
    assert vars(old) == vars(new)
    err = capsys.readouterr().err
    assert "warning: --swapout_threshold is deprecated; use " \
           "--swapout-threshold" in err
    assert "warning: --lms_plot_dir is deprecated; use --plot-dir" in err
    assert "warning: --autotune_plot is deprecated; use --autotune-plot" in err
    # The aliases convert and check like the flags they stand for.
    with pytest.raises(SystemExit):
        parser.parse_args(["--swapin_ahead", "0"])
    assert ("argument --swapin_ahead: must be -1 (auto) or an int >= 1; "
            "got '0'") in capsys.readouterr().err


def test_mnist_fallback_is_sklearn_digits(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    data = _mnist_data.load()
    assert "scikit-learn digits" in capsys.readouterr().out
    assert data.x_train.shape[1:] == (28, 28, 1)
    assert data.x_train.dtype == np.float32
    assert 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0
    assert set(np.unique(data.y_train)) == set(range(10))
    assert len(data.x_train) + len(data.x_test) == 1797


def test_mnist_uses_npz_from_data_dir(tmp_path, capsys):
    rng = np.random.RandomState(0)
    np.savez(tmp_path / "mnist.npz",
             x_train=rng.randint(0, 256, (20, 28, 28)).astype(np.uint8),
             y_train=rng.randint(0, 10, 20).astype(np.uint8),
             x_test=rng.randint(0, 256, (5, 28, 28)).astype(np.uint8),
             y_test=rng.randint(0, 10, 5).astype(np.uint8))
    data = _mnist_data.load(str(tmp_path))
    assert "MNIST from" in capsys.readouterr().out
    assert data.x_train.shape == (20, 28, 28, 1)
    assert data.x_test.shape == (5, 28, 28, 1)
    assert data.x_train.max() <= 1.0
    with pytest.raises(FileNotFoundError):
        _mnist_data.load(str(tmp_path / "missing"))


def test_batches_are_full_size():
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    y = np.arange(10)
    gen = _mnist_data.batches(x, y, 4, seed=1)
    for _ in range(5):
        xb, yb = next(gen)
        assert xb.shape == (4, 1) and yb.shape == (4,)
        assert np.array_equal(xb[:, 0], yb)
    small = _mnist_data.batches(x[:2], y[:2], 4)
    assert next(small)[0].shape == (4, 1)


# ---- multiworker_lms.py: two workers of this machine, one command ----------
MULTIWORKER = "multiworker_lms.py"


@pytest.mark.numerics
def test_multiworker_example_passes(tmp_path):
    """The command examples/README.md shows: it starts its two workers,
    prints each one's losses without and with LMS and where its swap ops
    ran, and ends with a PASS verdict."""
    proc, seconds = run_example(MULTIWORKER, [], tmp_path)
    print("%s: %.1f s" % (MULTIWORKER, seconds))
    assert proc.returncode == 0, _tail(proc.stdout + proc.stderr)
    for worker in (0, 1):
        host = "/job:worker/replica:0/task:%d/device:CPU:0" % worker
        assert re.search(r"^worker %d \(%s\): [1-9]\d* swap operations, "
                         r"all ran: \['%s'\]$" % (worker, host, host),
                         proc.stdout, re.M), proc.stdout
        assert "[worker %d] [LMS][0] Large Model Support rewrote the " \
            "training step" % worker in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith(
        "VERDICT: PASS - on each of the 2 workers the losses with LMS equal "
        "those without"), proc.stdout


def _worker_result(worker, **changes):
    host = "/job:worker/replica:0/task:%d/device:CPU:0" % worker
    result = {"worker": worker, "replica_devices": [host],
              "losses_without_lms": [2.5, 2.25],
              "losses_with_lms": [2.5, 2.25], "weights_without_lms": 3.0,
              "weights_with_lms": 3.0, "swap_ops": ["lms/swapout_a",
                                                    "lms/swapin_a"],
              "ran": {"lms/swapout_a": host, "lms/swapin_a": host}}
    result.update(changes)
    return result


@pytest.mark.parametrize("second, expected", [
    ({}, "VERDICT: PASS - on each of the 2 workers"),
    ({"losses_with_lms": [2.5, 2.2500002]},
     "VERDICT: FAIL - worker 1's losses differ with LMS"),
    ({"swap_ops": [], "ran": {}}, "VERDICT: FAIL - LMS swapped nothing on "
     "worker 1"),
    ({"ran": {"lms/swapout_a": "/job:worker/replica:0/task:1/device:CPU:0"}},
     "VERDICT: FAIL - 1 swap operations of worker 1 did not run, e.g. "
     "lms/swapin_a"),
    ({"ran": {"lms/swapout_a": "/job:worker/replica:0/task:0/device:CPU:0",
              "lms/swapin_a": "/job:worker/replica:0/task:1/device:CPU:0"}},
     "VERDICT: FAIL - worker 1 ran lms/swapout_a on /job:worker/replica:0/"
     "task:0/device:CPU:0, not on its host /job:worker/replica:0/task:1/"
     "device:CPU:0"),
    ({"weights_with_lms": 3.5, "weights_without_lms": 3.5},
     "VERDICT: FAIL - the workers ended with different losses or weights"),
])
def test_multiworker_verdict(second, expected):
    import multiworker_lms
    line, ok = multiworker_lms.verdict([_worker_result(0),
                                        _worker_result(1, **second)])
    assert line.startswith(expected), line
    assert ok is expected.startswith("VERDICT: PASS")

