"""benchmarks/kernel_measure.py: its kernel cases predicted without a
GPU, run on the CPU, and its arguments checked."""

import os
import subprocess
import sys

import pytest

from _benchmarks import ROOT
from benchmarks import kernel_measure

# A benchmark script's table: the same on both stacks (conftest.py).
pytestmark = pytest.mark.one_stack


def test_kernel_measure_without_a_gpu_predicts_and_says_so(tmp_path):
    """Without a GPU the kernel cases are predicted all the same: a table
    with the measured column empty, between a page's markers, exit status
    2; in NCHW a float16 convolution's prediction is its NHWC one plus the
    transposes the table shows and their launches, a float32 one on a
    V100 (CUDA cores) the same in both layouts."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    page = tmp_path / "page.md"
    page.write_text("before\n%s\nold table\n%s\nafter\n"
                    % (kernel_measure.BEGIN, kernel_measure.END))
    script = os.path.join(ROOT, "benchmarks", "kernel_measure.py")
    proc = subprocess.run(
        [sys.executable, script, "--case", "conv", "--case", "batchnorm",
         "--case", "matmul", "--batch", "2", "--tokens", "64",
         "--gpu", "A100-SXM4-80GB", "--doc", str(page)], cwd=str(tmp_path),
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == kernel_measure.EXIT_CANNOT_RUN == 2, \
        proc.stderr
    assert kernel_measure.NO_GPU_MESSAGE in proc.stderr
    rows = [[c.strip() for c in line.split("|")[1:-1]]
            for line in proc.stdout.splitlines()
            if line.startswith(("| conv", "| batchnorm", "| matmul"))]
    # conv and batch norm in both layouts (float16; conv float32 too),
    # the product at the one size asked for in both precisions.
    assert [r[:3] for r in rows] == [
        ["conv batch 2, 56x56, 64 channels", layout, dtype]
        for dtype in ("float16", "float32") for layout in ("NHWC", "NCHW")
    ] + [["batchnorm batch 2, 56x56, 256 channels", layout, "float16"]
         for layout in ("NHWC", "NCHW")] + [
        ["matmul 64 x 1024 x 4096", "-", dtype]
        for dtype in ("float16", "float32")]
    for r in rows:
        assert r[3] == kernel_measure.gpu_measure.NOT_MEASURED
        assert r[5] == r[7] == "-"
    ms = [[float(c.split()[0]) for c in r[4:7:2]] for r in rows]
    # NHWC float16 and float32 on the A100 (TF32): no transposes; NCHW:
    # some, and the prediction is larger.
    for nhwc, nchw in ((0, 1), (2, 3)):
        assert ms[nhwc][1] == 0 < ms[nchw][1]
        assert ms[nchw][0] > ms[nhwc][0]
    text = page.read_text()
    assert text.startswith("before\n" + kernel_measure.BEGIN)
    assert text.endswith(kernel_measure.END + "\nafter\n")
    assert "old table" not in text
    # The prediction of one case, exactly: the NCHW float16 convolution's
    # forward, input-gradient and filter-gradient kernels each transpose
    # three 4-D tensors (no shape vectors), each read and written once.
    from tflms import steptime
    cases = kernel_measure.cases(["conv"], batch=2)
    by = {(c.layout, c.dtype): c for c in cases}
    for gpu in ("A100-SXM4-80GB", "V100-SXM2-16GB"):
        nhwc = kernel_measure.predict(by["NHWC", "float16"], gpu)
        nchw = kernel_measure.predict(by["NCHW", "float16"], gpu)
        bandwidth = (steptime.GPUS[gpu].memory_bandwidth
                     * steptime.ACHIEVED.memory)
        image, filt = 2 * 56 * 56 * 64 * 2, 3 * 3 * 64 * 64 * 2
        tensors = 3 * (2 * image + filt)
        assert nchw[1] == pytest.approx(2 * tensors / bandwidth)
        assert nchw[0] == pytest.approx(
            nhwc[0] + nchw[1] + 9 * steptime.LAUNCH_OVERHEAD_S)
        assert nchw[2] == nhwc[2] > 0
    v100 = [kernel_measure.predict(by[layout, "float32"], "V100-SXM2-16GB")
            for layout in ("NHWC", "NCHW")]
    assert v100[0] == v100[1] and v100[1][1] == 0


def test_kernel_measure_runs_every_kernel_of_a_case():
    """`measure` runs a case's kernels (Grappler, on, would prune the
    stateless ops only the fetched NoOp's control edges read: the case's
    kernels themselves): on the CPU, the forward and both gradient
    kernels of an NHWC float32 convolution run, and their time is
    measured."""
    import tensorflow as tf
    case = kernel_measure.cases(["conv"], batch=1)[2]
    assert (case.layout, case.dtype) == ("NHWC", "float32")
    ran = set()
    config = kernel_measure.session_config(device="/cpu:0")
    with tf.compat.v1.Session(graph=case.graph, config=config) as sess:
        with case.graph.as_default():
            sess.run(tf.compat.v1.global_variables_initializer())
        metadata = tf.compat.v1.RunMetadata()
        sess.run(case.step, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                 run_metadata=metadata)
        for device in metadata.step_stats.dev_stats:
            ran.update(n.node_name for n in device.node_stats)
    assert {"conv", "gradients/conv_grad/Conv2DBackpropInput",
            "gradients/conv_grad/Conv2DBackpropFilter"} <= ran
    assert kernel_measure.measure(case, 2, 1, device="/cpu:0") > 0


def test_kernel_measure_splits_the_squad_step():
    """The squad case is a whole fine-tuning step (fed, initialized, with
    XLA as NVIDIA ran it, predicted with fusion): `measure` runs it (on
    the CPU, without XLA's GPU clustering) and `squad_split` splits two
    batches' steps into a part per step and a part per sequence, from the
    predictions and, where both batches were measured, the times."""
    small, large = kernel_measure.cases(["squad"], squad_batches=(1, 3),
                                        squad_layers=1)
    assert (small.batch, large.batch, small.xla) == (1, 3, True)
    assert small.label == "squad step, 1 layers, seq 384, batch 1"
    assert kernel_measure.measure(small, 1, 1, device="/cpu:0") > 0
    rows = [{"case": small, "predicted_s": 0.030},
            {"case": large, "predicted_s": 0.070}]
    assert kernel_measure.squad_split(rows) == (
        "SQuAD step, from batch 1 and 3: predicted 10.0 ms a step and "
        "20.0 ms a sequence.")
    rows[0]["measured_s"], rows[1]["measured_s"] = 0.050, 0.110
    assert kernel_measure.squad_split(rows).endswith(
        "; measured 20.0 ms and 30.0 ms.")
    # The table: measured, predicted, their ratio, transposes, and the
    # products' FLOPs at the peak over the measured time.
    for r in rows:
        r.update(transposes_s=0.0, at_peak_s=0.010)
    table = kernel_measure._table(rows, "V100")
    assert ("| squad step, 1 layers, seq 384, batch 1 | - | float32 | "
            "50.000 ms | 30.000 ms | 1.67 | 0.000 ms | 0.200 |") in table
    assert table.endswith("; measured 20.0 ms and 30.0 ms.")
    assert kernel_measure.squad_split(rows[:1]) is None
    # The prediction is the fused step's, larger with the batch.
    first, second = (kernel_measure.predict(c, "V100-SXM2-16GB")[0]
                     for c in (small, large))
    assert 0 < first < second


def test_kernel_measure_refuses_bad_sizes():
    for argv in (["--batch", "0"], ["--steps", "0"], ["--tokens", "-1"],
                 ["--squad-batch", "0"]):
        with pytest.raises(SystemExit):
            kernel_measure.main(["--dry-run"] + argv)
    with pytest.raises(ValueError, match="case must be one of conv, "
                       "batchnorm, matmul, squad; got 'relu'"):
        kernel_measure.cases(["relu"])
