"""The benchmark suite runs end to end and its helpers compute what they say.

`test_smoke_suite` runs ``python benchmarks/run.py --suite smoke`` (the
smallest graphs, every section once) in a subprocess and checks the JSON and
the markdown it writes: every case finished, and the numbers relate the way
the measurements promise (LMS lowers the oracle's GPU peak, the capacity
search finds a size that fits and one that does not, the swap ops ran). The
other tests pin the pure helpers on inputs with known answers.
"""

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import capacity  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import cost  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import measure  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import memory as memory_section  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import report  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks import timing  # noqa: E402  pylint: disable=wrong-import-position


def _run_smoke(out):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"),
         "--suite", "smoke", "--jobs", "2", "--out", str(out)],
        cwd=str(out), capture_output=True, text=True, timeout=600,
        check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "results.json", encoding="utf-8") as f:
        data = json.load(f)
    with open(out / "report.md", encoding="utf-8") as f:
        text = f.read()
    return out, data, text, proc.stdout


def test_smoke_suite(tmp_path):
    """One run of the smoke suite (one test, so parallel test workers do not
    each run it), checked section by section."""
    smoke = _run_smoke(tmp_path)
    _check_every_case_finished(smoke)
    _check_timing_rows(smoke)
    _check_memory(smoke)
    _check_capacity(smoke)
    _check_cost_and_fidelity(smoke)
    _check_report(smoke)


def _check_every_case_finished(smoke):
    _, data, _, _ = smoke
    assert set(data["sections"]) == {"timing", "memory", "capacity", "cost",
                                     "fidelity"}
    for section, results in data["sections"].items():
        assert results, section
        for r in results:
            assert "error" not in r, (section, r.get("case"), r["error"])
            assert r["done"] is True, (section, r.get("case"))
    machine = data["machine"]
    assert machine["cores"] >= 1 and machine["tensorflow"] != "unknown"


def _check_timing_rows(smoke):
    _, data, _, _ = smoke
    for r in data["sections"]["timing"]:
        assert r["ops"] > 100 and r["levels"] > 10
        assert len(r["runs"]) == r["case"]["reps"]
        s = timing.summarize(r)
        for phase in timing.PHASES:
            assert s[phase + "_s"] is not None and s[phase + "_s"] > 0, phase
            assert 0 < s[phase + "_cpu_s"] < 2 * s[phase + "_s"] + 0.05, phase
        assert math.isclose(s["auto_total_s"], s["analysis_s"] + s["tune_s"]
                            + s["rewrite_s"])
        assert math.isclose(s["auto_total_cpu_s"], s["analysis_cpu_s"]
                            + s["tune_cpu_s"] + s["rewrite_cpu_s"])
        # The budget is below the step's need, so LMS swapped something.
        assert r["runs"][-1]["tuned_swaps"] > 0
        assert r["runs"][-1]["fixed_swaps"] > 0


def _check_memory(smoke):
    """tflms lowers the oracle's GPU peak under the budget."""
    _, data, _, _ = smoke
    (r,) = data["sections"]["memory"]
    configs = r["configs"]
    budget = r["case"]["budget_gib"] * measure.GIB
    none = configs["none"]["gpu_peak"]
    assert none > budget
    for key in ("tflms_auto", "tflms_fixed"):
        assert configs[key]["status"] == "swapped"
        assert configs[key]["gpu_peak"] < none
        assert configs[key]["swapout_bytes"] > 0
        assert configs[key]["host_peak"] > 0
    assert configs["tflms_auto"]["gpu_peak"] <= budget
    for key in ("tf_swap", "tf_recompute"):
        assert "error" not in configs[key]
        assert configs[key]["gpu_peak"] > 0


def _check_capacity(smoke):
    """Every search brackets its answer with oracle probes."""
    _, data, _, _ = smoke
    (r,) = data["sections"]["capacity"]
    budget = r["case"]["budget_gib"] * measure.GIB
    probes = r["probes"]
    for method in ("none", "tf_swap", "tflms"):
        res = r["results"][method]
        largest, failing = res["largest"], res["smallest_failing"]
        assert largest > 0 and failing is not None and failing > largest
        mine = {p["size"]: p for p in probes if p["method"] == method}
        # The reported sizes are backed by oracle probes.
        assert mine[largest]["fits"] and mine[largest]["gpu_peak"] <= budget
        assert not mine[failing]["fits"]
    assert r["results"]["tflms"]["largest"] >= r["results"]["none"]["largest"]


def _check_cost_and_fidelity(smoke):
    _, data, _, _ = smoke
    (step,) = data["sections"]["cost"]
    assert step["without"]["step_s"] > 0 and step["with"]["step_s"] > 0
    assert step["without"]["swap_ops_run"] == 0
    assert step["with"]["swap_ops_run"] > 0
    for fid in data["sections"]["fidelity"]:
        for key in ("sim_none", "runtime_none", "raw_none"):
            assert fid[key] > 0, key
        assert fid["real_off"]["all"] >= fid["real_off"]["outputs"] > 0
        (plan,) = fid["plans"]
        assert plan["swaps"] > 0
        for key in ("sim", "runtime", "raw"):
            assert plan[key] > 0, key
    # The ref-variable MLP: each variable (2 MiB in all) counted once on
    # both sides; they differ by a few shape constants (about 100 bytes).
    (mlp,) = [f for f in data["sections"]["fidelity"]
              if f["case"]["model"] == "mlp"]
    assert abs(mlp["sim_none"] - mlp["runtime_none"]) <= 1024


def _check_report(smoke):
    out, data, text, stdout = smoke
    assert text.strip() in stdout
    for heading in ("## 1. Time before training starts",
                    "## 2. Device memory saved", "## 3. How much bigger",
                    "## 4. Cost per step", "## 5. Simulator fidelity"):
        assert heading in text
    assert "| synthetic 2k ops | %d |" % data["sections"]["timing"][0]["ops"] \
        in text
    assert "Where tflms is behind TensorFlow's own swapping" in text
    for name in data["plots"]:
        assert (out / name).stat().st_size > 1000


def test_largest_fitting_finds_the_boundary_with_few_probes():
    calls = []

    def fits(size):
        calls.append(size)
        return size <= 1000

    good, bad = capacity.largest_fitting(fits, 300, step=8, tolerance=0.0,
                                         min_size=8, max_size=1 << 20)
    assert good == 1000 and bad == 1008
    assert len(calls) <= 16
    good, bad = capacity.largest_fitting(fits, 5000, step=8, tolerance=0.0,
                                         min_size=8, max_size=1 << 20)
    assert (good, bad) == (1000, 1008)
    # Within a relative tolerance.
    good, bad = capacity.largest_fitting(fits, 5000, step=8, tolerance=0.05,
                                         min_size=8, max_size=1 << 20)
    assert good <= 1000 < bad and bad - good <= 0.05 * good


def test_largest_fitting_at_the_ends_of_the_range():
    assert capacity.largest_fitting(lambda s: False, 64, 8, 0.1, 8, 512) \
        == (0, 8)
    assert capacity.largest_fitting(lambda s: True, 64, 8, 0.1, 8, 512) \
        == (512, None)


def test_growth_exponent_of_a_power_law():
    points = [(n, 3e-6 * n ** 1.5) for n in (1e4, 5e4, 2e5)]
    assert timing.growth_exponent(points) == pytest.approx(1.5)
    assert timing.growth_exponent(points[:1]) is None


def test_allocator_peak_separates_scratch_from_outputs():
    step_stats = measure.tf.compat.v1.RunMetadata().step_stats
    dev = step_stats.dev_stats.add()
    # Op a (runs 0-10 us): 100-byte output freed at 50 us, 1000 bytes of
    # scratch freed at 5 us. Op b (runs 20-30 us): 300-byte output.
    a = dev.node_stats.add(node_name="a", all_start_micros=0,
                           all_end_rel_micros=10)
    mem = a.memory.add(allocator_name="cpu")
    for micros, nbytes in ((1, 100), (2, 1000), (5, -1000), (50, -100)):
        mem.allocation_records.add(alloc_micros=micros, alloc_bytes=nbytes)
    b = dev.node_stats.add(node_name="b", all_start_micros=20,
                           all_end_rel_micros=10)
    mem = b.memory.add(allocator_name="cpu")
    for micros, nbytes in ((21, 300), (60, -300)):
        mem.allocation_records.add(alloc_micros=micros, alloc_bytes=nbytes)
    every, lasting = measure._allocator_curves(step_stats)  # pylint: disable=protected-access
    assert measure._peak(every) == 1100  # pylint: disable=protected-access
    assert measure._peak(lasting) == 400  # pylint: disable=protected-access


def _node(graph_def, name, op, inputs=(), device="/device:GPU:0"):
    node = graph_def.node.add(name=name, op=op, device=device)
    node.input.extend(inputs)
    return node


def test_forward_identities_reroutes_consumers_and_keeps_swaps():
    gd = measure.tf.compat.v1.GraphDef()
    _node(gd, "x", "Placeholder")
    _node(gd, "c", "NoOp")
    _node(gd, "a", "Identity", ["x", "^c"])
    _node(gd, "b", "StopGradient", ["a"])           # a chain: b -> a -> x
    _node(gd, "y", "Mul", ["b", "a:0", "^a"])
    _node(gd, "out", "Identity", ["y"])             # kept: fetched
    _node(gd, "swap", "Identity", ["x"], device="/cpu:0")  # crosses devices
    _node(gd, "z", "Neg", ["swap"])
    result, removed = measure.forward_identities(gd, keep={"out"})
    nodes = {n.name: list(n.input) for n in result.node}
    assert removed == 2 and "a" not in nodes and "b" not in nodes
    assert nodes["y"] == ["x", "x", "^c"]
    assert nodes["out"] == ["y"] and nodes["z"] == ["swap"]
    assert "swap" in nodes


def test_transfer_time_uses_the_larger_direction():
    data = [{"case": {"model": "m"}, "configs": {
        "none": {"step_s": 0.5},
        "tflms_auto": {"swapout_bytes": int(15.75e9), "swapin_bytes":
                       int(31.5e9)}}}]
    text = cost.transfer_table(data)
    row = [l for l in text.splitlines() if "tflms auto" in l][0]
    # 31.5 GB over PCIe 3.0 x16 (15.75 GB/s) is 2 s, four times the step.
    assert "| 2.00 s (4.00x) |" in row
    assert "| 1.00 s (2.00x) |" in row   # PCIe 4.0


def test_report_names_where_tensorflow_swapping_wins():
    gib = 1 << 30
    data = {"sections": {"memory": [{
        "description": "m", "case": {"budget_gib": 1.5}, "configs": {
            "tf_swap": {"gpu_peak": gib, "swapout_bytes": gib},
            "tflms_auto": {"gpu_peak": 2 * gib}}}]}}
    notes = report.behind_tensorflow(data)
    assert len(notes) == 1
    assert "TF swapping fits the 1.50 GiB budget (1.00 GiB)" in notes[0]
    # Both fit: behind only if TensorFlow moves fewer bytes.
    memory = data["sections"]["memory"][0]["configs"]
    memory["tflms_auto"] = {"gpu_peak": gib, "swapout_bytes": 2 * gib}
    assert "moves fewer bytes" in report.behind_tensorflow(data)[0]
    memory["tflms_auto"]["swapout_bytes"] = gib // 2
    assert report.behind_tensorflow(data) == []


def test_oracle_peaks_reports_the_runtime_peak():
    """x -> a1 = sin(x) -> flat = Reshape(a1) -> b = cos(flat); out = b *
    Reshape(v), v a resource variable; every large tensor is S bytes.

    At run time the Reshapes and the variable read hand on their input's
    buffer, v is resident, and sin, cos and the product write into their
    input's buffer (each is its last reader; v's buffer is never written
    over): a1, flat, b and out are all x's buffer. The peak is x and v,
    plus the two 8-byte shape constants, 2 S + 16; its largest buffers are
    v, x and flat's shape. ``InferFromTrace``'s rules (the corrected count)
    give the read and both Reshapes buffers of their own, count no
    variable, and keep x, a1 and the read 1 ns into the microsecond where
    flat, vflat and b start: 6 S + 16, three times the runtime peak. The
    benchmark's GPU peak must be the runtime one.
    """
    S = 4 << 20  # pylint: disable=invalid-name
    tf = measure.tf
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1024, 1024], name="x")
        v = tf.Variable(tf.zeros([1024, 1024]), name="v")
        a1 = tf.math.sin(x, name="a1")
        b = tf.math.cos(tf.reshape(a1, [512, 2048], name="flat"), name="b")
        out = tf.multiply(b, tf.reshape(v, [512, 2048], name="vflat"),
                          name="out")
    peaks = measure.oracle_peaks(graph, out.op)
    assert peaks["gpu_peak"] == 2 * S + 16
    assert sorted(peaks["top"]) == ["flat/shape:0", "v", "x:0"]
    assert peaks["corrected_peak"] == peaks["raw_gpu_peak"] == 6 * S + 16


_memory_note = memory_section._note  # pylint: disable=protected-access


def test_memory_note_judges_tensorflow_swapping_by_like_counts():
    """TensorFlow's swapping 'saved nothing' when its real peak did not go
    down; the blind spot is named only when Grappler's own count went down
    against Grappler's own count without swapping (not against the runtime
    peak, which counts differently)."""
    gib = 1 << 30
    none = {"gpu_peak": 4 * gib, "raw_gpu_peak": 5 * gib}
    blind = {"gpu_peak": 4 * gib, "raw_gpu_peak": int(4.5 * gib)}
    note = _memory_note("tf_swap", blind, none, 3 * gib)
    assert "only Grappler's own count goes down" in note
    assert note.endswith("over budget")
    # Grappler's count below the runtime peak without LMS, but not below its
    # own count without LMS: no blind spot to name.
    same = {"gpu_peak": 4 * gib, "raw_gpu_peak": 5 * gib}
    note = _memory_note("tf_swap", same, none, 3 * gib)
    assert "changed the graph but saved nothing" in note


def test_memory_note_compares_oracle_with_simulator():
    gib = 1 << 30
    values = {"status": "swapped", "params": [1, 2, 3, 0],
              "sim_peak": 2 * gib, "gpu_peak": int(2.2 * gib)}
    note = _memory_note("tflms_auto", values, {"gpu_peak": 8 * gib},
                        4 * gib)
    assert "params 1/2/3/0" in note
    assert "simulator: 2.00 GiB (oracle +10.0%)" in note
    assert note.endswith("fits")
    # With copies timed the simulator counts more than the oracle's
    # instant replay can see: the oracle is set beside the instant count.
    values = dict(values, sim_peak=int(2.5 * gib), sim_instant_peak=2 * gib)
    note = _memory_note("tflms_auto", values, {"gpu_peak": 8 * gib},
                        4 * gib)
    assert "simulator: 2.50 GiB (2.00 GiB with copies instant) " \
        "(oracle +10.0%)" in note


def test_gpu_measure_without_a_gpu_predicts_and_says_so(tmp_path):
    """Without a GPU (none visible to CUDA) the command says so, plans and
    predicts a tiny model all the same, prints and writes the table with
    the measured columns empty, puts it between a page's markers, and
    exits with status 2 (nothing measured); ``--dry-run`` exits with 0."""
    from benchmarks import gpu_measure  # pylint: disable=import-outside-toplevel
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    page = tmp_path / "page.md"
    page.write_text("before\n%s\nold table\n%s\nafter\n"
                    % (gpu_measure.BEGIN, gpu_measure.END))
    out = tmp_path / "table.md"
    script = os.path.join(ROOT, "benchmarks", "gpu_measure.py")
    proc = subprocess.run(
        [sys.executable, script, "--model", "tiny", "--out", str(out),
         "--doc", str(page)], cwd=str(tmp_path), env=env,
        capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == gpu_measure.EXIT_CANNOT_RUN == 2, proc.stderr
    assert gpu_measure.NO_GPU_MESSAGE in proc.stderr
    table = out.read_text()
    assert table.strip() in proc.stdout
    assert "`python benchmarks/gpu_measure.py --model tiny` (" in table
    assert "no GPU used" in table
    rows = [line for line in table.splitlines() if line.startswith("| MLP")]
    assert len(rows) == 2
    without, with_lms = ([c.strip() for c in row.split("|")[1:-1]]
                         for row in rows)
    assert without[1] == "without LMS"
    assert with_lms[1].startswith("LMS, tuned for ")
    assert "swaps)" in with_lms[1]
    for cells in (without, with_lms):
        assert cells[2] == cells[4] == gpu_measure.NOT_MEASURED
        assert cells[3].endswith("iB") and cells[5].endswith(" ms")
    # The plan was made for less than the peak without it, and fits.
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    sim = [float(c[3].split()[0]) * units[c[3].split()[1]]
           for c in (without, with_lms)]
    assert sim[1] < sim[0]
    text = page.read_text()
    assert text.startswith("before\n" + gpu_measure.BEGIN)
    assert text.endswith(gpu_measure.END + "\nafter\n")
    assert "old table" not in text and rows[0] in text
    dry = subprocess.run(
        [sys.executable, script, "--model", "tiny", "--dry-run"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True,
        timeout=600, check=False)
    assert dry.returncode == 0, dry.stderr
    assert gpu_measure.NO_GPU_MESSAGE not in dry.stderr
    assert rows[0] in dry.stdout


def test_gpu_measure_wants_markers_on_the_page():
    from benchmarks import gpu_measure  # pylint: disable=import-outside-toplevel
    with pytest.raises(ValueError, match=r"^the page has no <!-- "
                       r"gpu_measure table --> \.\.\. <!-- /gpu_measure "
                       r"table --> markers to put the table between$"):
        gpu_measure.with_table("no markers", "table")


def test_kernel_measure_without_a_gpu_predicts_and_says_so(tmp_path):
    """Without a GPU the kernel cases are predicted all the same: a table
    with the measured column empty, between a page's markers, exit status
    2; in NCHW a float16 convolution's prediction is its NHWC one plus the
    transposes the table shows and their launches, a float32 one on a
    V100 (CUDA cores) the same in both layouts."""
    from benchmarks import kernel_measure  # pylint: disable=import-outside-toplevel
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
    from tflms import steptime  # pylint: disable=import-outside-toplevel
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
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from benchmarks import kernel_measure  # pylint: disable=import-outside-toplevel
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
    from benchmarks import kernel_measure  # pylint: disable=import-outside-toplevel
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
    table = kernel_measure._table(rows, "V100")  # pylint: disable=protected-access
    assert ("| squad step, 1 layers, seq 384, batch 1 | - | float32 | "
            "50.000 ms | 30.000 ms | 1.67 | 0.000 ms | 0.200 |") in table
    assert table.endswith("; measured 20.0 ms and 30.0 ms.")
    assert kernel_measure.squad_split(rows[:1]) is None
    # The prediction is the fused step's, larger with the batch.
    first, second = (kernel_measure.predict(c, "V100-SXM2-16GB")[0]
                     for c in (small, large))
    assert 0 < first < second


def test_kernel_measure_refuses_bad_sizes():
    from benchmarks import kernel_measure  # pylint: disable=import-outside-toplevel
    for argv in (["--batch", "0"], ["--steps", "0"], ["--tokens", "-1"],
                 ["--squad-batch", "0"]):
        with pytest.raises(SystemExit):
            kernel_measure.main(["--dry-run"] + argv)
    with pytest.raises(ValueError, match="case must be one of conv, "
                       "batchnorm, matmul, squad; got 'relu'"):
        kernel_measure.cases(["relu"])


def test_step_time_tables_show_the_ratios():
    from benchmarks import step_time  # pylint: disable=import-outside-toplevel
    row = step_time.Published("bert-pretraining", 128, "A100-SXM4-40GB",
                              "TF32", 64, 238.1, "tf-bert", "held out")
    text = step_time.throughput_table([
        {"row": row, "predicted": 300.0, "ratio": 300.0 / 238.1,
         "products": "tf32"},
        {"row": dataclasses.replace(row, role="fit"), "predicted": 250.0,
         "ratio": 250.0 / 238.1, "products": "tf32"}])
    assert text.splitlines()[2:] == [
        "| BERT-large pretraining, seq 128 | A100-SXM4-40GB | TF32 (tf32) | "
        "64 | 238 seq/s | 300 seq/s | 1.26 (off by 26%) | held out | [3] |",
        "| BERT-large pretraining, seq 128 | A100-SXM4-40GB | TF32 (tf32) | "
        "64 | 238 seq/s | 250 seq/s | 1.05 | fitted | [3] |"]
    # ResNet50 rows say the layout of their convolutions.
    rn50 = step_time.Published("resnet50", None, "A100-SXM4-80GB", "AMP",
                               1280, 1582.0, "lambda", "held out", "NCHW")
    assert step_time.throughput_table([
        {"row": rn50, "predicted": 2000.0, "ratio": 2000.0 / 1582.0,
         "products": "fp16"}]).splitlines()[2] == (
        "| ResNet50 (PyTorch, Lambda) | A100-SXM4-80GB | AMP (fp16; NCHW) | "
        "1280 | 1582 img/s | 2000 img/s | 1.26 (off by 26%) | held out | "
        "[4] |")
    # A case no plan fits is a row that says why.
    assert step_time.lms_table([{
        "image": 6592, "batch": 1, "error": "AutotuneError: too big"}]
    ).splitlines()[2] == (
        "| 6592x6592, batch 1 | - | no plan: AutotuneError: too big "
        "| | | | | |")


def test_step_time_fit_finds_the_fractions_that_made_the_rows():
    """Rows whose 'published' throughput is the model's own prediction with
    known fractions: the fit finds those fractions again (to its grid's
    resolution), each from the rows that depend on it."""
    from benchmarks import step_time  # pylint: disable=import-outside-toplevel
    from tflms import analysis, steptime  # pylint: disable=import-outside-toplevel
    from tflms import graph_index as gi  # pylint: disable=import-outside-toplevel
    mb = 1 << 20

    def graph(product, relu_mb):
        # A product (compute-bound at these sizes) and a memory-bound op;
        # two sizes of the latter make memory's share differ between rows.
        return gi.from_edges(
            [("x", "Placeholder", {"outputs": [64 * mb]}),
             ("p", product, {"outputs": [64 * mb], "flops": 4 * 10 ** 10}),
             ("r", "Relu", {"outputs": [relu_mb * mb]}),
             ("n", "MatMul", {"outputs": [4]})],
            edges=[("x", "p"), ("p", "r"), ("r", "n")])

    truth = steptime.Efficiency(memory=0.8, fp32=0.7, tf32=0.6,
                                conv_fp32=0.5, conv_tf32=0.3)
    rows, costs = [], []
    for product, relu_mb in (("MatMul", 4096), ("MatMul", 256),
                             ("Conv2D", 4096), ("Conv2D", 256)):
        index = graph(product, relu_mb)
        roles = analysis.classify_ops(index)
        for gpu, precision in (("V100-SXM2-16GB", "FP32"),
                               ("A100-SXM4-40GB", "TF32")):
            step = steptime.StepTimeModel(
                index, roles, 1, gpu=gpu,
                kernels=steptime.KernelOptions(efficiency=truth)).predict()
            rows.append(step_time.Published(
                "bert-pretraining" if product == "MatMul" else "resnet50",
                None, gpu, precision, 1, 1 / step.without_lms_s, "tf-bert",
                "fit"))
            costs.append(step_time._Costs(  # pylint: disable=protected-access
                index, roles, 1))
    fitted = step_time.fit(rows, costs)
    for name in ("memory", "fp32", "tf32", "conv_fp32", "conv_tf32"):
        assert getattr(fitted, name) == pytest.approx(
            getattr(truth, name), rel=0.025), name
    # Nothing was fitted for float16: it stays at the peak, and bfloat16
    # takes float16's fractions.
    assert fitted.fp16 == fitted.bf16 == 1.0
    assert step_time.efficiency_text(fitted)[1] is (
        fitted == steptime.ACHIEVED)


def test_step_time_tried_explanations_change_what_they_name():
    """Each explanation `--tried` refits with changes the costs it names
    and nothing else: on a convolution, a batch norm and a product, the
    step moves by what the explanation adds or takes away, on the rows it
    applies to."""
    from benchmarks import step_time  # pylint: disable=import-outside-toplevel
    from tflms import analysis, hardware, steptime  # pylint: disable=import-outside-toplevel
    from tflms import graph_index as gi  # pylint: disable=import-outside-toplevel
    activation = ((8, 64, 64, 64), 4)  # 8 MiB of float32
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [activation]}),
         ("c", "Conv2D", {"outputs": [activation], "flops": 4 * 10 ** 10}),
         ("b", "FusedBatchNormV3", {"outputs": [activation]}),
         ("n", "MatMul", {"outputs": [4], "flops": 10 ** 9})],
        edges=[("x", "c"), ("c", "b"), ("b", "n")])
    roles = analysis.classify_ops(index)
    a100_gpu = "A100-SXM4-40GB"
    costs = step_time._Costs(  # pylint: disable=protected-access
        index, roles, 1, gpu=a100_gpu)
    eight_mib = float(8 << 20)
    assert costs.read_again.sum() == eight_mib  # the batch norm's input
    efficiency = steptime.ACHIEVED

    def row(gpu, precision, source="tf-rn50", layout="NHWC", fusion=True):
        return step_time.Published("resnet50", None, gpu, precision, 1, 1.0,
                                   source, "fit", layout, fusion=fusion)

    def same_fusion():
        raise AssertionError("only rows timed without fusion are refused")

    def step(name, published, of=costs, refused=same_fusion):
        gpu = hardware.GPUS[published.gpu]
        varied = step_time._tried(  # pylint: disable=protected-access
            name, published, of, refused)
        return varied.time(gpu, step_time._products(  # pylint: disable=protected-access
            published, gpu), efficiency)

    a100 = row(a100_gpu, "TF32")
    bandwidth = hardware.GPUS[a100_gpu].memory_bandwidth * efficiency.memory
    base = step("as published", a100)
    assert base == costs.time(hardware.GPUS[a100_gpu], "tf32", efficiency)
    # The batch norm is memory-bound: its input read again is all it adds.
    assert step("batch norm twice", a100) == pytest.approx(
        base + eight_mib / bandwidth)
    # In NCHW a TF32 convolution pays two transposes, each reading and
    # writing its tensor in a kernel of its own; the explanation takes
    # them away, and only from TF32 rows in NCHW.
    nchw = step_time._Costs(  # pylint: disable=protected-access
        index, roles, 1, layout="NCHW", gpu=a100_gpu)
    # The convolution's input and output, each 4-D, each read and written.
    assert (nchw.transposed, nchw.transpose_launches) == (
        2 * 2 * eight_mib, 2)
    a100_nchw = row(a100_gpu, "TF32", layout="NCHW")
    assert step("as published", a100_nchw, nchw) == pytest.approx(
        base + 2 * 2 * eight_mib / bandwidth + 2 * costs.launch_s)
    assert step("TF32 without transposes", a100_nchw, nchw) == \
        pytest.approx(base)
    assert step("TF32 without transposes", a100) == base
    # Transposes at half the bandwidth: each costs twice its time.
    assert step("transposes at half bandwidth", a100_nchw, nchw) == \
        pytest.approx(base + 2 * 2 * 2 * eight_mib / bandwidth
                      + 2 * costs.launch_s)
    assert step("transposes at half bandwidth", a100) == base
    # The batch norm read again on PyTorch's rows in NCHW only.
    pytorch_nchw = row(a100_gpu, "TF32", source="pt-rn50", layout="NCHW",
                       fusion=False)
    assert step("batch norm twice in PyTorch NCHW", pytorch_nchw, nchw) == \
        pytest.approx(step("as published", pytorch_nchw, nchw)
                      + eight_mib / bandwidth)
    assert step("batch norm twice in PyTorch NCHW", a100_nchw, nchw) == \
        step("as published", a100_nchw, nchw)
    assert step("batch norm twice in PyTorch NCHW",
                row(a100_gpu, "AMP", source="pt-rn50", fusion=False)) == base
    # A V100 runs float32 convolutions on its CUDA cores: nothing to
    # transpose, in either layout.
    v100 = step_time._Costs(  # pylint: disable=protected-access
        index, roles, 1, layout="NCHW", gpu="V100-SXM2-16GB")
    assert (v100.transposed, v100.transpose_launches) == (0, 0)
    # Added times exceed the larger; the 2-norm lies between.
    assert base < step("p-norm 2", a100) < step("added", a100)
    # Tensor cores at the A100's rate per SM and clock: slower on an
    # H100, the same on an A100.
    h100 = row("H100-PCIe-80GB", "TF32", source="lambda", fusion=False)
    assert step("H100 at A100 rate", h100) > step("as published", h100)
    assert step("H100 at A100 rate", a100) == base
    # The rows timed without fusion are the ones timed with it instead.
    calls = []

    def fused():
        calls.append(1)
        return nchw
    assert step("PyTorch fused", h100, refused=fused) == step(
        "as published", h100, nchw)
    assert calls == [1]
    assert step("PyTorch fused", a100) == base
    # Only Lambda's PyTorch BERT rows are the ones "PyTorch BERT unfused"
    # times with the other setting.
    bert = step_time.Published("bert-squad", 384, "A100-SXM4-80GB", "TF32",
                               1, 1.0, "lambda", "held out")
    assert step("PyTorch BERT unfused", bert, refused=fused) == step(
        "as published", bert, nchw)
    assert calls == [1, 1]
    assert step("PyTorch BERT unfused", h100) == step("as published", h100)
    assert step("PyTorch BERT unfused", a100) == base
    with pytest.raises(ValueError, match="no tried explanation 'XLA'"):
        step("XLA", a100)


def test_step_time_rows_state_their_runs_layout_and_fusion():
    """The published rows say how their runs laid out convolutions and
    fused ops: PyTorch's ResNet50 without fusion (no torch.jit), every
    other run fused; TensorFlow's XLA in NCHW for float32 convolutions
    and in NHWC for float16 ones."""
    from benchmarks import step_time  # pylint: disable=import-outside-toplevel
    rows = step_time.PUBLISHED
    pytorch_resnet = [r for r in rows if r.model == "resnet50"
                      and r.source in ("pt-rn50", "pt-rn50-2006",
                                       "lambda")]
    assert len(pytorch_resnet) == 12
    assert [r for r in rows if not r.fusion] == pytorch_resnet
    assert sorted((r.precision, r.layout) for r in rows
                  if r.source == "tf-rn50") == [
        ("AMP", "NHWC"), ("AMP", "NHWC"), ("FP32", "NCHW"), ("TF32", "NCHW")]


def test_step_time_section_is_replaced_or_appended():
    from benchmarks import step_time  # pylint: disable=import-outside-toplevel
    section = "%s\nnew\n%s" % (step_time.BEGIN, step_time.END)
    assert step_time.section_of("# Doc\n") is None
    appended = step_time.with_section("# Doc\n\n", section)
    assert appended == "# Doc\n\n" + section + "\n"
    assert step_time.section_of(appended) == section
    old = "# Doc\n\n%s\nold\n%s\n\nafter\n" % (step_time.BEGIN, step_time.END)
    assert step_time.with_section(old, section) == (
        "# Doc\n\n" + section + "\n\nafter\n")


def _tiny_capacity_case():
    """The smoke suite's 3D U-Net search (sizes 16 to 60 within 0.01 GiB),
    without TensorFlow's swapping, which the step table does not use."""
    from benchmarks import suites  # pylint: disable=import-outside-toplevel
    (case,) = suites.SMOKE["capacity"]
    return dict(case, methods=["none", "tflms"])


def test_capacity_predicts_the_step_of_each_size():
    """The capacity worker (its own process, as `run.py` runs it) with
    TF_LMS_SIMULATOR_MEM_RATIO=1, what ``run.py --mem-ratio 1`` passes:
    tflms then plans for the whole budget. Every fitting no-LMS probe and
    every planned tflms probe carries its predicted step, and the step table
    is the arithmetic of those numbers."""
    from benchmarks import common  # pylint: disable=import-outside-toplevel
    from tflms.settings import Settings  # pylint: disable=import-outside-toplevel
    case = _tiny_capacity_case()
    r = common.run_case("capacity", case, case["timeout_s"] * 4,
                        env={"TF_LMS_SIMULATOR_MEM_RATIO": "1"})
    assert "error" not in r and r["done"], r.get("error")
    assert r["mem_ratio"] == 1.0
    budget = case["budget_gib"] * measure.GIB
    gpu = Settings().gpu
    planned = 0
    for p in r["probes"]:
        step = p.get("predicted_step")
        if p["method"] == "none":
            # Predicted exactly where the size fits.
            assert (step is not None) == p["fits"], p
            if step is not None:
                assert step["gpu"] == gpu and step["without_lms_s"] > 0
            continue
        if p.get("status") == "no fit":
            assert step is None
            continue
        planned += 1
        assert step["gpu"] == gpu and step["without_lms_s"] > 0, p
        assert set(step["links"]) == set(measure.STEP_LINKS)
        for link, v in step["links"].items():
            # Copies and recomputes only add to the graph's own compute.
            assert v["with_lms_s"] >= step["without_lms_s"], (link, p)
            assert v["exposed_s"] >= 0 and v["recompute_s"] >= 0
            assert v["with_lms_s"] == pytest.approx(
                step["without_lms_s"] + v["exposed_s"] + v["recompute_s"])
        # The same plan over a faster link waits no longer.
        assert step["links"]["nvlink2"]["with_lms_s"] <= \
            step["links"]["pcie4"]["with_lms_s"]
        if p["fits"]:
            # Planned for the whole budget: the simulator's peak is within
            # it, not within 0.9 of it only.
            assert p["sim_peak"] <= budget
    assert planned > 0

    # The step table's numbers, by hand from the JSON.
    none_size = r["results"]["none"]["largest"]
    lms_size = r["results"]["tflms"]["largest"]
    assert 0 < none_size <= lms_size
    (none,) = [p for p in r["probes"]
               if p["method"] == "none" and p["size"] == none_size]
    (lms,) = [p for p in r["probes"]
              if p["method"] == "tflms" and p["size"] == lms_size]
    ratio = lms_size / none_size
    scaled = none["predicted_step"]["without_lms_s"] * ratio ** 3  # voxels
    steps = capacity.scaled_steps(r)
    assert steps["none_size"] == none_size
    assert steps["tflms_size"] == lms_size
    assert steps["scale"] == pytest.approx(ratio ** 3)
    assert steps["scaled_step_s"] == pytest.approx(scaled)
    assert steps["compute_s"] == lms["predicted_step"]["without_lms_s"]
    for link in measure.STEP_LINKS:
        v = lms["predicted_step"]["links"][link]
        assert steps["links"][link]["with_lms_s"] == v["with_lms_s"]
        assert steps["links"][link]["ratio"] == pytest.approx(
            v["with_lms_s"] / scaled)

    # Rendered: the first table, then the step table with this case's row.
    text = capacity.tables([r])
    assert "| tflms size | step, PCIe 4.0 x16 (exposed) | step, NVLink 2.0 " \
        "(exposed) |" in text
    (row,) = [l for l in text.splitlines()
              if l.startswith("| %s | volume | 0.01 GiB | %d | "
                              % (case["label"], lms_size))]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-2:] == ["%.2f" % (steps["links"][l]["ratio"])
                          for l in measure.STEP_LINKS]
    assert cells[-3] == "%.1f ms (x%.2f)" % (scaled * 1e3, ratio ** 3)
    report_text = report.render({"mem_ratio": 1.0,
                                 "sections": {"capacity": [r]}})
    assert "tflms auto-tuned to 1 of each budget" in report_text
    assert "planned for the whole budget" in report_text
    assert "10% headroom" not in report_text


def test_capacity_text_states_the_planning_ratio():
    """The findings and the section's note name the ratio the capacity
    searches planned with: 0.9 leaves 10% headroom, 1 leaves none."""
    gib = 1 << 30
    search = {"case": {"budget_gib": 1.0}, "results": {}, "probes": [
        {"method": "tflms", "size": 8, "sim_peak": gib,
         "gpu_peak": int(1.05 * gib), "fits": False}]}
    for ratio, said, unsaid in (
            (0.9, "within the 10% headroom of TF_LMS_SIMULATOR_MEM_RATIO=0.9",
             "no headroom"),
            (1.0, "with TF_LMS_SIMULATOR_MEM_RATIO=1, which leaves no "
             "headroom", "10% headroom")):
        data = {"sections": {"capacity": [dict(search, mem_ratio=ratio)]}}
        facts = " ".join(report.findings(data))
        assert said in facts and unsaid not in facts
        note = capacity.budget_note(data["sections"]["capacity"])
        assert ("conservative" in note) == (ratio < 1)
    # The gap is taken against the simulator's count with copies instant
    # (as the oracle replays them) where the probe has one.
    timed = {"method": "tflms", "size": 8, "sim_peak": int(1.5 * gib),
             "sim_instant_peak": gib, "gpu_peak": int(1.05 * gib),
             "fits": False}
    data = {"sections": {"capacity": [dict(search, probes=[timed],
                                           mem_ratio=0.9)]}}
    assert "peak +5.0% to +5.0% against what the simulator counts" in \
        " ".join(report.findings(data))
    # Where the oracle stopped the search, the same count is named.
    stopped = dict(search, probes=[timed],
                   results={"tflms": {"smallest_failing": 8}})
    assert capacity._stopper(stopped) == (  # pylint: disable=protected-access
        "at 8: oracle 1.05 GiB, simulator 1.00 GiB")
    # `run.py --mem-ratio 1` is accepted: the worker's environment says 1.
    from benchmarks import run  # pylint: disable=import-outside-toplevel
    assert run._parse(["--mem-ratio", "1"]).mem_ratio == 1.0  # pylint: disable=protected-access
    # Results from before the workers recorded their ratio: the run's.
    assert "to 0.8 of each budget" in capacity.budget_note([search], 0.8)
    assert capacity.budget_note([search]) == ""
    # A search without predicted steps (older results) renders dashes.
    assert capacity.scaled_steps(search) is None
    assert capacity.step_table([search]).splitlines()[2].endswith(
        " | - | - | - | - | - | - | - | - |")


def test_goal_plans_script_measures_a_plan_instant_and_timed():
    """benchmarks/goal_plans.py on a 24^3 U-Net tuned for 16 MiB: one
    JSON line and a table row; a slower link never lowers the oracle's
    timed peak, and a link never lowers it below the instant replay."""
    env = dict(os.environ, TF_LMS_SIMULATOR_MEM_RATIO="0.9",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "goal_plans.py"),
         "--case", "unet3d:24", "--gpu-mem", "0.016", "--links",
         "nvlink2,pcie4"],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    row = json.loads(lines[0])
    assert row["status"] == "swapped" and len(row["params"]) == 4
    assert row["oracle_instant_gib"] <= row["oracle_nvlink2_gib"] \
        <= row["oracle_pcie4_gib"]
    assert row["sim_instant_gib"] <= row["sim_peak_gib"] <= 0.016
    assert lines[-1].startswith("| 3D U-Net 24^3 | %s |" % ", ".join(
        str(p) for p in row["params"]))


def test_host_budget_script_shows_which_memory_bound_the_plan():
    """benchmarks/host_budget.py on a 24^3 U-Net tuned for 16 MiB: a roomy
    host leaves the plan device-bound, 4 MiB makes the host stage recompute
    swapped tensors (recompute is off, so every recompute is the host's),
    1 MiB is more than recomputing can save."""
    env = dict(os.environ, TF_LMS_SIMULATOR_MEM_RATIO="0.9",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "host_budget.py"),
         "unet3d", "--size", "24", "--gpu-mem", "0.016", "--host-gib", "1",
         "0.004", "0.001"],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    roomy, tight, none = (json.loads(line) for line in lines[:3])
    assert (roomy["bound"], tight["bound"], none["bound"]) == (
        "device", "host", "host: no plan")
    assert roomy["recomputes"] == 0 and tight["recomputes"] > 0
    assert tight["host_peak_bytes"] <= 0.004 * (1 << 30) \
        < roomy["host_peak_bytes"]
    assert tight["device_peak_bytes"] <= tight["budget_bytes"]
    assert "autotune_host_mem=0.001" in none["error"]
    assert lines[-1].startswith(
        "| 3D U-Net 24^3, 16 filters, depth 4, batch 1 | 0.001 GiB | host: "
        "no plan |")


def test_capacity_says_tflmsv2_was_not_measured_without_its_path(tmp_path):
    """Without ``--tflmsv2`` or ``$TFLMSV2_PATH`` the capacity worker does
    not probe the original TFLMSv2 and says so in its result and in the
    table; the other methods search as before. The harness itself refuses
    to run without a checkout, or with a folder that holds none."""
    from benchmarks import common, tflmsv2  # pylint: disable=import-outside-toplevel
    case = dict(_tiny_capacity_case(), methods=["none", "tflmsv2"])
    r = common.run_case("capacity", case, case["timeout_s"] * 4,
                        env={"TFLMSV2_PATH": ""})
    assert "error" not in r and r["done"], r.get("error")
    assert r["results"]["tflmsv2"]["not_measured"] == \
        "not measured: TFLMSV2_PATH not set"
    assert r["results"]["tflmsv2"]["largest"] is None
    assert {p["method"] for p in r["probes"]} == {"none"}
    assert r["results"]["none"]["largest"] > 0
    # The first table's row (the step table's comes later).
    row = [l for l in capacity.tables([r]).splitlines()
           if l.startswith("| %s |" % case["label"])][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[6] == "not measured: TFLMSV2_PATH not set"
    assert cells[12] == "-"  # what stopped TFLMSv2
    # Results from before TFLMSv2 was a method: n/a, as for any method
    # a search did not run.
    older = dict(r, results={"none": r["results"]["none"]})
    assert "| n/a |" in capacity.tables([older])

    assert tflmsv2.path_from(None) == os.environ.get("TFLMSV2_PATH") or None
    assert tflmsv2.path_from("/x") == "/x"
    with pytest.raises(ValueError, match="no tensorflow_large_model_support"
                       "/lms.py under"):
        tflmsv2.load(str(tmp_path))
    saved = os.environ.pop("TFLMSV2_PATH", None)
    try:
        with pytest.raises(ValueError, match="not measured: TFLMSV2_PATH "
                           "not set; give --tflmsv2 PATH"):
            tflmsv2.apply(None, 16)
    finally:
        if saved is not None:
            os.environ["TFLMSV2_PATH"] = saved
    with pytest.raises(ValueError, match="method must be one of"):
        capacity.measure_probe("tflmsv3", None, 16)
    from benchmarks import run  # pylint: disable=import-outside-toplevel
    assert run._parse(["--tflmsv2", "/x"]).tflmsv2 == "/x"  # pylint: disable=protected-access


@pytest.mark.parametrize("optimizer,precision", [
    ("adam-weight-decay", "mixed_float16"), ("adam-weight-decay", "float32"),
    ("accumulate", "float32"), ("adam", "float16")])
def test_bert_step_runs_the_update_it_names(optimizer, precision):
    """A tiny BERT's step with NVIDIA's fine-tuning update moves every
    trainable variable; with accumulation it moves none and fills the
    accumulators (step_time's pretraining and SQuAD graphs)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from benchmarks import models  # pylint: disable=import-outside-toplevel
    built = models.bert(layers=1, hidden=16, heads=2, seq=8, batch=2,
                        vocab=50, predictions=2, precision=precision,
                        head="squad" if optimizer != "accumulate"
                        else "pretraining", optimizer=optimizer)
    v1 = tf.compat.v1
    # The SQuAD head's bias is added to every position before a softmax
    # over positions, so its gradient is zero in exact arithmetic: float
    # rounding decides whether it moves (with oneDNN on it does not), and
    # its Adam slots stay zero with it.
    with built.graph.as_default():
        params = [v for v in v1.trainable_variables()
                  if v.op.name != "bert/squad/bias"]
        others = [v for v in v1.global_variables()
                  if v not in params and "squad_bias" not in v.op.name
                  and v.op.name != "bert/squad/bias"]
    with v1.Session(graph=built.graph) as sess:
        sess.run(built.init_op)
        before = sess.run(params)
        sess.run(built.train_op, built.make_feed())
        after, state = sess.run([params, others])
    moved = [not np.array_equal(b, a) for b, a in zip(before, after)]
    assert all(moved) if optimizer != "accumulate" else not any(moved)
    assert others and all(np.any(s != 0) for s in state)


def test_bert_softmax_runs_in_the_precision_of_the_published_run():
    """Automatic mixed precision keeps BERT's softmax in float32; apex's O2
    (Lambda's BERT runs) casts the model to float16, softmax included:
    step_time builds those rows' graphs so, and only those."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from benchmarks import models, step_time  # pylint: disable=import-outside-toplevel

    def softmax_dtypes(precision):
        built = models.bert(layers=2, hidden=16, heads=2, seq=8, batch=2,
                            vocab=50, predictions=2, precision=precision,
                            head="squad", optimizer="adam")
        return [op.outputs[0].dtype for op in built.graph.get_operations()
                if op.type == "Softmax"]

    assert softmax_dtypes("float16") == [tf.float16] * 2
    assert softmax_dtypes("mixed_float16") == [tf.float32] * 2
    assert softmax_dtypes("float32") == [tf.float32] * 2
    o2 = [(r.gpu, r.batch) for r in step_time.PUBLISHED
          if r.amp_graph == "float16"]
    assert o2 == [("A100-SXM4-80GB", 112), ("H100-PCIe-80GB", 112)]
    assert all(r.source == "lambda" and r.model == "bert-squad"
               and r.precision == "AMP" for r in step_time.PUBLISHED
               if r.amp_graph == "float16")
    with pytest.raises(ValueError, match="precision must be one of "
                       "float32, mixed_float16, float16; got 'half'"):
        models.bert(precision="half")


def test_plan_cost_script_sets_each_plan_against_the_step_without_lms():
    """benchmarks/plan_cost.py on a 24^3 U-Net tuned for 16 MiB over two
    links: a row per link and plan, each step at least the step without
    LMS (the same on both links: compute alone), the ratio their quotient,
    and the issue's goal for the link judged in the table."""
    env = dict(os.environ, TF_LMS_SIMULATOR_MEM_RATIO="0.9",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "plan_cost.py"),
         "--cases", "unet3d:24:1", "--links", "pcie4", "nvlink2",
         "--gpu-mem", "0.016"],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    plans = ("swap only, by time", "swap + recompute, by time",
             "default settings")
    assert [(r["interconnect"], r["plan"]) for r in rows] == [
        (link, plan) for link in ("pcie4", "nvlink2") for plan in plans]
    # The default settings recompute when auto-tuning: the plan of
    # recompute=True, on each link.
    for k in (0, 3):
        with_recompute, default = rows[k + 1], rows[k + 2]
        assert {key: default[key] for key in default if key != "plan_s"
                and key != "plan"} == {key: with_recompute[key]
                                       for key in with_recompute
                                       if key not in ("plan_s", "plan")}
    assert len({r["without_lms_ms"] for r in rows}) == 1
    for row in rows:
        assert row["swaps"] > 0
        assert row["step_ms"] >= row["without_lms_ms"]
        # The idle time is the step's excess over the graph's own compute
        # (copies waited for, clones), and the waits listed are the
        # longest parts of it.
        assert row["idle_ms"] == pytest.approx(
            row["step_ms"] - row["without_lms_ms"], abs=0.3)
        assert sum(w[0] for w in row["waits"]) <= row["idle_ms"] + 0.1
        assert all(w[2] in ("out", "in") for w in row["waits"])
        assert row["ratio"] == round(row["step_ms"] / row["without_lms_ms"],
                                     3)
    table = [line for line in lines if line.startswith("| 3D U-Net")]
    assert len(table) == 6
    assert table[0].endswith("| %.2fx | 1.4x: %s |" % (
        rows[0]["ratio"], "met" if rows[0]["ratio"] <= 1.4 else "missed"))
    assert table[3].endswith("| 1.1x: %s |" % (
        "met" if rows[3]["ratio"] <= 1.1 else "missed"))


def test_plan_cost_oracle_judges_each_applied_plan_against_its_budget(
        monkeypatch):
    """plan_cost's ``--oracle`` path on a 48^3 U-Net planned for 52 MiB
    over PCIe (its recompute plan recomputes a tensor): each plan is
    applied to a build of its own (swap ops, and recompute clones where it
    recomputes) before the oracle replays it; the row's oracle peak is the
    replay's, lower than the oracle's peak without LMS and near the
    simulator's instant count; the verdict is that peak against the
    planning budget, in the JSON and the table, and turns to "no" when
    the replay's peak is above the budget."""
    from benchmarks import models  # pylint: disable=import-outside-toplevel
    from benchmarks import plan_cost  # pylint: disable=import-outside-toplevel
    from tflms import budget  # pylint: disable=import-outside-toplevel
    gpu_mem = 0.052
    limit = budget.device_budget(gpu_mem)
    real = measure.oracle_peaks
    seen = []

    def spy(graph, fetch, **kwargs):
        peaks = real(graph, fetch, **kwargs)
        names = [op.name for op in graph.get_operations()]
        seen.append((peaks, sum("lms/swapout_" in n for n in names),
                     sum("lms/recompute_" in n for n in names)))
        return peaks

    monkeypatch.setattr(measure, "oracle_peaks", spy)
    case = [("unet3d", 48, 1)]
    rows = plan_cost.measure(case, ("pcie4",), gpu_mem, oracle=True)
    assert [r["plan"] for r in rows] == list(plan_cost.PLANS)
    assert rows[1]["recomputes"] > 0
    built = models.build_sized("unet3d", 48, 1)
    without = real(built.graph, built.train_op)["gpu_peak"]
    table = plan_cost.table(rows)[2:]
    for row, (peaks, swapouts, clones), line in zip(rows, seen, table):
        assert swapouts == row["swaps"]
        assert (clones > 0) == (row["recomputes"] > 0)
        assert row["oracle_gib"] == round(peaks["gpu_peak"] / measure.GIB, 3)
        assert row["grappler_gib"] == round(
            peaks["raw_gpu_peak"] / measure.GIB, 3)
        assert 0 < peaks["gpu_peak"] < without
        # Section 5 holds the simulator within 5% of the runtime replay.
        assert row["oracle_gib"] == pytest.approx(row["sim_instant_gib"],
                                                  rel=0.05)
        assert row["oracle_fits"] is (peaks["gpu_peak"] <= limit)
        assert line.endswith("| %.2f | %s |" % (
            row["grappler_gib"], "yes" if row["oracle_fits"] else "**no**"))

    def over(graph, fetch, **kwargs):
        return dict(real(graph, fetch, **kwargs), gpu_peak=limit + 1)

    monkeypatch.setattr(measure, "oracle_peaks", over)
    rows = plan_cost.measure(case, ("pcie4",), gpu_mem, oracle=True)
    assert [r["oracle_fits"] for r in rows] == [False] * len(plan_cost.PLANS)
    assert all(line.endswith("| **no** |")
               for line in plan_cost.table(rows)[2:])


# A tf.function whose AddN of three 64 MiB tensors is live at Grappler's
# estimated peak (four such tensors: 256 MiB, above 80% of the 256 MiB
# TensorFlow's CPU device declares), called eagerly, once as TensorFlow
# calls it and once after keras3_bitwise.no_memory_scheduling().
_ACCUMULATED = r"""
import json
import os
import sys

os.environ["TF_DUMP_GRAPH_NAME_FILTER"] = "sum_of_three"
import numpy as np
import tensorflow as tf

from benchmarks import keras3_bitwise

x = tf.constant(np.random.RandomState(0).rand(16 << 20).astype("float32"))


def accumulated(folder):
    os.makedirs(folder)
    os.environ["TF_DUMP_GRAPH_PREFIX"] = folder

    @tf.function
    def sum_of_three(x):
        return tf.reduce_sum(tf.math.add_n([tf.sin(x), tf.cos(x),
                                            tf.exp(x)]))
    sum_of_three(x)
    return keras3_bitwise.accumulated_addns(folder)


on = accumulated(os.path.join(sys.argv[1], "on"))
keras3_bitwise.no_memory_scheduling()
off = accumulated(os.path.join(sys.argv[1], "off"))
print("RESULT " + json.dumps(dict(on=on, off=off)))
"""


def test_keras3_bitwise_sees_the_memory_optimizers_accumulations(tmp_path):
    """What docs/tf2.md says of Grappler's memory optimizer, and the two
    helpers of benchmarks/keras3_bitwise.py that rely on it: above 80% of
    the device's memory by Grappler's estimate (205 MiB on a CPU), an AddN
    of more than two inputs live at the peak becomes an accumulation into
    a temporary variable (`accumulated_addns` finds it in the partition
    graphs), and none once `no_memory_scheduling` turned the optimizer
    off."""
    from _keras3 import result_of  # pylint: disable=import-outside-toplevel
    result, _ = result_of("-c", _ACCUMULATED, tmp_path, timeout=300)
    assert result == {"on": ["AddN"], "off": []}
