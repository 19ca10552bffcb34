"""Markdown report and plots from the collected results."""

import os

from benchmarks import capacity
from benchmarks import common
from benchmarks import cost
from benchmarks import fidelity
from benchmarks import memory
from benchmarks import timing

__all__ = ["render", "write_plots", "targets", "behind_tensorflow"]

_GIB = float(1 << 30)


# What IBM published for the original TFLMSv2, to set the capacity numbers
# against (users know IBM's documents, not this project's history).
_ORIGINAL_CLAIM = (
    "IBM's announcement of the original TFLMSv2 (the PowerAI 1.6 article "
    "on IBM Developer that introduced it, section \"More swapping allows "
    "higher resolution\") claims resolution increases of about 10x for 2D "
    "models (GoogleNet, ResNet50) and 5x for 3D models (3D U-Net), against "
    "5x and 2.5x for TFLMSv1; the factor in pixels or voxels is the "
    "comparable one if \"resolution\" meant data size.")


def write_plots(data, out):
    """PNG plots into `out`; returns their file names."""
    sections = data.get("sections", {})
    made = []
    for name, module, file_name in (
            ("timing", timing, "timing.png"),
            ("memory", memory, "memory.png"),
            ("capacity", capacity, "capacity.png")):
        results = sections.get(name)
        if results:
            path = module.plot(results, os.path.join(out, file_name))
            if path:
                made.append(file_name)
    return made


def _both(summary, phase):
    wall = summary.get(phase + "_s")
    cpu = summary.get(phase + "_cpu_s")
    if wall is None:
        return "n/a", None
    if cpu is None:
        return "%.2f s wall" % wall, None
    return "%.2f s wall, %.2f s CPU" % (wall, cpu), cpu


def targets(data):
    """The issue's time targets: list of (text, met or None). A target
    counts as met on CPU time, the time on an idle machine."""
    rows = []
    for r in data.get("sections", {}).get("timing", []):
        case = r.get("case", {})
        s = timing.summarize(r)
        label = case.get("label", case.get("model"))
        if case.get("model") == "resnet50":
            if case.get("budget_gib") == 1.0:
                if r.get("tune_error"):
                    text, _ = _both(s, "tune")
                    rows.append(("%s (%s ops): auto-tune + rewrite < 1.5 s: "
                                 "%s, after %s of tuning" % (
                                     label, r.get("ops", "?"),
                                     r["tune_error"], text), None))
                else:
                    text, cpu = _both(s, "auto_total")
                    rows.append(("%s (%s ops): auto-tune + rewrite < 1.5 s: "
                                 "%s" % (label, r.get("ops", "?"), text),
                                 None if cpu is None else cpu < 1.5))
            text, cpu = _both(s, "fixed")
            rows.append(("%s: fixed-parameter edit (%s) well under 1 s: %s"
                         % (label, "/".join(str(p) for p in r.get(
                             "fixed_params") or []), text),
                         None if cpu is None else cpu < 1.0))
        if (case.get("model") in timing.SYNTHETIC_FAMILIES
                and r.get("ops", 0) >= 150000):
            total, cpu = _both(s, "auto_total")
            fixed, fixed_cpu = _both(s, "fixed")
            if cpu is None and r.get("error"):
                total = "not finished (%s)" % r["error"]
            rows.append(("%s (%s ops): auto-tune + rewrite under 30 s: %s"
                         % (label, r.get("ops"), total),
                         None if cpu is None else cpu < 30))
            rows.append(("%s (%s ops): fixed edit under 10 s: %s"
                         % (label, r.get("ops"), fixed),
                         None if fixed_cpu is None else fixed_cpu < 10))
    return rows


def behind_tensorflow(data):
    """Sentences naming every place TensorFlow's swapping did better."""
    notes = []
    for r in data.get("sections", {}).get("memory", []):
        c = r.get("configs", {})
        budget = r.get("case", {}).get("budget_gib", 0) * _GIB
        auto = c.get("tflms_auto", {})
        lms_peak = auto.get("gpu_peak")
        lms_fits = lms_peak is not None and lms_peak <= budget
        for tf_key, tf_name in (("tf_swap", "TF swapping"),
                                ("tf_recompute", "TF recomputation")):
            tf = c.get(tf_key, {})
            tf_peak = tf.get("gpu_peak")
            if tf_peak is None or tf.get("did_nothing"):
                continue
            what = r.get("description")
            if tf_peak <= budget and not lms_fits:
                notes.append("memory, %s: %s fits the %.2f GiB budget "
                             "(%.2f GiB) and tflms auto-tuned does not (%s)"
                             % (what, tf_name, budget / _GIB, tf_peak / _GIB,
                                "no plan" if lms_peak is None else
                                "%.2f GiB" % (lms_peak / _GIB)))
            elif tf_peak > budget and not lms_fits and (
                    lms_peak is None or tf_peak < lms_peak):
                notes.append("memory, %s: neither fits; %s gets lower "
                             "(%.2f GiB) than tflms (%s)"
                             % (what, tf_name, tf_peak / _GIB,
                                "no plan" if lms_peak is None else
                                "%.2f GiB" % (lms_peak / _GIB)))
            elif tf_peak <= budget and lms_fits and \
                    tf.get("swapout_bytes", 0) < auto.get("swapout_bytes", 0):
                notes.append("memory, %s: both fit; %s moves fewer bytes "
                             "(%.2f GiB against %.2f GiB)"
                             % (what, tf_name, tf["swapout_bytes"] / _GIB,
                                auto["swapout_bytes"] / _GIB))
    for r in data.get("sections", {}).get("capacity", []):
        res = r.get("results", {})
        tf_size = res.get("tf_swap", {}).get("largest")
        lms_size = res.get("tflms", {}).get("largest")
        if tf_size and lms_size is not None and tf_size > lms_size:
            case = r.get("case", {})
            notes.append("capacity, %s at %g GiB: TF swapping reaches %d, "
                         "tflms %d" % (case.get("label"),
                                       case.get("budget_gib"), tf_size,
                                       lms_size))
    return notes


def findings(data):
    """Bullet points summarizing the measured numbers."""
    sections = data.get("sections", {})
    out = []
    caps = []
    for r in sections.get("capacity", []):
        case = r.get("case", {})
        res = r.get("results", {})
        base = res.get("none", {}).get("largest")
        k = capacity._EXPONENT.get(case.get("dimension"), 1)
        if not base:
            continue
        parts = []
        for method, name in (("tf_swap", "TF swapping"), ("tflms", "tflms")):
            size = res.get(method, {}).get("largest")
            if size:
                parts.append("%s %d (%.2fx, %.1fx %s)" % (
                    name, size, size / float(base), (size / float(base)) ** k,
                    {1: "samples", 2: "pixels", 3: "voxels"}[k]))
        caps.append("%s, %g GiB: no LMS %d; %s" % (
            case.get("label"), case.get("budget_gib"), base,
            "; ".join(parts)))
    if caps:
        out.append("How much bigger (largest size whose oracle peak fits): "
                   + " | ".join(caps) + ". " + _ORIGINAL_CLAIM)
    swap_nothing, swap_blind, swap_saved = [], [], []
    for r in sections.get("memory", []):
        c = r.get("configs", {})
        none = c.get("none", {}).get("gpu_peak")
        tf = c.get("tf_swap", {})
        name = r.get("case", {}).get("model")
        if tf.get("did_nothing"):
            swap_nothing.append(name)
        elif none and tf.get("gpu_peak") is not None:
            none_raw = c.get("none", {}).get("raw_gpu_peak", none)
            if tf["gpu_peak"] >= none and \
                    tf.get("raw_gpu_peak", none_raw) < none_raw:
                swap_blind.append(name)
            elif tf["gpu_peak"] < none:
                swap_saved.append("%s %.0f%%" % (
                    name, 100.0 * (none - tf["gpu_peak"]) / none))
    text = []
    if swap_nothing:
        text.append("did nothing on %s" % ", ".join(swap_nothing))
    if swap_blind:
        text.append("lowered only Grappler's own, uncorrected count on %s "
                    "(the real peak went up: its swapped-in copies come back "
                    "early and stay until their reader, which its accounting "
                    "ignores)" % ", ".join(swap_blind))
    if swap_saved:
        text.append("saved %s" % ", ".join(swap_saved))
    if text:
        out.append("TensorFlow's SWAPPING_HEURISTICS " + "; ".join(text)
                   + ".")
    lms = []
    for r in sections.get("memory", []):
        c = r.get("configs", {})
        none = c.get("none", {}).get("gpu_peak")
        auto = c.get("tflms_auto", {})
        budget = r.get("case", {}).get("budget_gib", 0) * _GIB
        if none and auto.get("gpu_peak") is not None:
            lms.append("%s %.0f%% (%s)" % (
                r.get("case", {}).get("model"),
                100.0 * (none - auto["gpu_peak"]) / none,
                "fits" if auto["gpu_peak"] <= budget else "over budget"))
        elif auto.get("status") == "no fit":
            lms.append("%s: no plan fits" % r.get("case", {}).get("model"))
    if lms:
        out.append("tflms auto-tuned to the budget lowers the oracle's GPU "
                   "peak by " + ", ".join(lms) + ".")
    over = []
    for r in sections.get("cost", []):
        w, l = r.get("without", {}), r.get("with", {})
        if w.get("step_s") and l.get("step_s"):
            over.append("%+.1f%% (%s)" % (
                100.0 * (l["step_s"] - w["step_s"]) / w["step_s"],
                r.get("case", {}).get("model")))
    if over:
        values = [float(o.split("%")[0]) for o in over]
        out.append("On the CPU, where a swap moves nothing, the swap ops "
                   "change the step time by " + ", ".join(over)
                   + (": within the noise of a shared machine."
                      if max(abs(v) for v in values) < 5 else "."))
    gaps = []
    for r in sections.get("capacity", []):
        for p in r.get("probes", []):
            sim = common.sim_beside_oracle(p)
            if p.get("method") == "tflms" and sim and p.get("gpu_peak"):
                gaps.append(p["gpu_peak"] / float(sim) - 1)
    if gaps:
        stopped = sum(1 for r in sections.get("capacity", [])
                      if capacity._stopper(r).split(": ", 1)[-1]
                      .startswith("oracle"))
        ratio = _capacity_mem_ratio(data)
        if ratio < 1:
            # Plans target ratio x budget in the simulator; the oracle may
            # exceed the simulator by up to 1 / ratio - 1 before the budget
            # (11% for the 10% of the budget that 0.9 keeps).
            headroom = "the %.0f%% headroom of TF_LMS_SIMULATOR_MEM_RATIO=%g" \
                % (100 * (1 - ratio), ratio)
            against = "more than" if max(gaps) > 1 / ratio - 1 else "within"
        else:
            headroom = "TF_LMS_SIMULATOR_MEM_RATIO=1, which leaves no " \
                "headroom"
            against = "with"
        out.append("Measured by the oracle, the auto-tuned plans of the "
                   "capacity searches peak %+.1f%% to %+.1f%% against what "
                   "the simulator counts for them with copies instant, as "
                   "the oracle replays them (median %+.1f%%), %s "
                   "%s; in %d of %d searches the oracle, not the lack of a "
                   "plan, stopped tflms (section 3, last columns of the "
                   "first table)."
                   % (100 * min(gaps), 100 * max(gaps),
                      100 * sorted(gaps)[len(gaps) // 2], against, headroom,
                      stopped, len(sections.get("capacity", []))))
    errs = fidelity.errors(sections.get("fidelity", []))
    if errs:
        worst = max(errs, key=lambda e: abs(e[1]))
        off = [label for label, e in errs if abs(e) > fidelity.TOLERANCE]
        out.append("The simulator is within %.1f%% of the oracle's runtime "
                   "replay on %d of %d peaks of section 5 (without LMS and "
                   "with every plan; worst %+.1f%%, %s; mean absolute error "
                   "%.1f%%)%s." % (
                       100 * fidelity.TOLERANCE, len(errs) - len(off),
                       len(errs), 100 * worst[1], worst[0],
                       100 * sum(abs(e) for _, e in errs) / len(errs),
                       "" if not off else "; off by more: " + "; ".join(off)))
    families = timing.exponents_by_family(sections.get("timing", []))
    for family, exps in families.items():
        parts = ["%s %.2f" % (label, exps[key][0]) for key, label in (
            ("analysis", "analysis"), ("fixed", "fixed edit"),
            ("tune", "tune")) if exps.get(key, (None,))[0] is not None]
        if parts:
            out.append("Growth with graph size (exponent k in time ~ ops^k "
                       "over the %s graphs): %s; target: tune at most 1.1."
                       % (family, ", ".join(parts)))
    return out


def _capacity_mem_ratio(data):
    """The TF_LMS_SIMULATOR_MEM_RATIO the capacity searches planned with:
    the one their workers recorded (the largest, if they differ), else the
    run's (results from before workers recorded it), else the default."""
    recorded = [r["mem_ratio"] for r in data.get("sections", {}).get(
        "capacity", []) if r.get("mem_ratio") is not None]
    if recorded:
        return max(recorded)
    return data.get("mem_ratio", 0.9)


def _machine(data):
    m = data.get("machine", {})
    ram = m.get("ram_gib")
    return ("%s, %s cores, %s RAM; Python %s, TensorFlow %s (CPU build), "
            "NumPy %s; %s" % (
                m.get("cpu", "?"), m.get("cores", "?"),
                "%.0f GiB" % ram if ram else "?", m.get("python", "?"),
                m.get("tensorflow", "?"), m.get("numpy", "?"),
                m.get("platform", "?")))


_INTRO = """\
These numbers answer three questions a user asks before picking a memory
tool: how much bigger can I go, what does it cost per step, and how long do
I wait before training starts. Everything is reproducible with the command
below; every probe and repetition is in `results.json` in the output
folder.

There is no GPU on the benchmark machine. GPU memory is measured by the
*oracle* (`tflms/tf/oracle/`, also behind `tflms plan --oracle`): Grappler's
virtual cluster with one simulated V100 and one CPU, compute ops on
`/device:GPU:0`, which shares no code with LMS's simulator or rewriter.
TensorFlow's own memory optimizer is run offline on that same virtual
cluster. Real runs (step time, allocator peaks) use the CPU.

One adjustment applies to every oracle number (all methods alike): the
virtual cluster gives each `Identity`, `StopGradient` and `PreventGradient`
op a buffer of its own, while TensorFlow's kernels hand the input buffer
on (and Grappler removes most of them before a real run). `tf.gradients`
adds an `Identity` per gradient of every `Add` (`tuple/control_dependency`),
so the as-given count can be 10-20% too high at a backward-pass peak. Those
ops are bypassed before measuring (`benchmarks/measure.py`,
`forward_identities`); section 5 measures the graphs as given, since
the runtime replay forwards those buffers itself. Swap ops, which move
data between devices, are kept.

Times are given as wall time and, in brackets, CPU time of the benchmark
process. The machine is shared, so wall time includes waiting for a core;
CPU time is what the same work takes on an idle machine, and the targets
are judged on it.
"""

_SECTION_TEXT = {
    "timing": """\
## 1. Time before training starts

Each graph is built afresh for every repetition; times are medians.
The phases are the three steps of `LMS.run`, called as it calls them:
*analysis* is `build_index`; *tune* is `pipeline.plan` with all three
parameters on auto and the budget (roles, deferral edges, auto-tuning, the
plan); *rewrite* is `apply_plan` of that plan; *auto total* is their sum
(what `LMS.run` spends when auto-tuning). *fixed edit* is
`LMS(swapout_threshold=..., swapin_ahead=..., swapin_groupby=...,
sync_mode=...).run(graph)` end to end on another fresh build, with the
parameters auto-tuning found (models) or a fixed share of the levels
(synthetic graphs). Building the model is not LMS time. Synthetic graphs are
MLP training steps (13 ops per layer, one large activation per layer read
again by the backward pass, see `benchmarks/models.py`).
""",
    "memory": """\
## 2. Device memory saved (oracle)

*GPU peak* is the oracle's runtime peak: the simulated V100's schedule
replayed with TensorFlow's buffer rules (Identity, IdentityN, Reshape,
Squeeze, ExpandDims and variable reads share their input's buffer;
variables and optimizer slots stay resident; a buffer is freed when its
last reader ends) and every swapped-in GPU copy kept until its last reader.
*Grappler's count* is what Grappler's own `GraphMemory` accounting (which
TensorFlow's swapping heuristic plans with) reports for the same run: it
frees the GPU copy of a swapped-in tensor right after the copy, so it
under-counts swapping, gives forwarded outputs buffers of their own and
counts no variable (see `tflms/tf/oracle/` and `benchmarks/measure.py`). *Host
peak* is the oracle's CPU peak (an upper bound of the host memory swapping
needs). *swapped out / in* are the bytes copied per step. TensorFlow's swap ops
(`_CopyFromGpuToHost` / `_CopyFromHostToGpu`) have no kernels in the CPU build;
they are measured as the equivalent CPU `Identity` pair, the same form as an
LMS swap (see `benchmarks/measure.py`). The simulated GPU given to TensorFlow's
optimizer has exactly the budget as its memory; tflms auto-tunes to the same
budget.
""",
    "capacity": """\
## 3. How much bigger

Largest size whose oracle GPU peak fits the budget (bisection to the stated
tolerance, bracketed by the tflms simulator; every probe is in the JSON).
Factors are relative to the largest size without LMS, as a side ratio and
as the ratio of pixels, voxels or samples. A tflms probe fits only if
auto-tuning finds a plan *and* the oracle confirms the rewritten graph fits.
""",
    "cost": """\
## 4. Cost per step
""",
    "fidelity": """\
## 5. Simulator fidelity

Peaks of one training step, without LMS and with each auto-tuned plan, as
the simulator predicts them and as the oracle's runtime replay measures them
on the simulated GPU (Grappler's schedule replayed with TensorFlow's buffer
rules: forwarding ops allocate nothing, every variable is resident and
counted once, swapped-in copies live until their last GPU reader).
Grappler's own count is shown beside it: every Identity, Reshape and
variable read a buffer of its own, no variable counted. Without LMS, this
machine's CPU allocator is shown too (FULL_TRACE allocation records, Grappler
off so the graph is the same; "outputs" excludes kernel scratch, "all"
includes it; variables and constants added). The CPU runs ops in parallel on
its own schedule and may forward buffers in place, so it is a check of
scale, not an exact reference; with LMS it is not compared (on a CPU a swap
moves nothing).
""",
}


_CAVEATS = """\
## Limits of these measurements

- The oracle is a model of a GPU run, not one. Its scheduler orders ops by
  its own cost model, which differs from the simulator's level by level
  replay: swap-ins triggered a few levels ahead can arrive together in its
  schedule. On the models here its runtime peak stayed at or below the
  simulator's for every tuned plan (sections 2, 3 and 5).
- The oracle's runtime rules forward only the ops whose kernels always
  share their input's buffer (`tflms.graph_index.BUFFER_FORWARDING_TYPES`);
  kernels that reuse an input only when nobody else holds it (element-wise ops,
  `Snapshot`) are counted as allocating. Kernel scratch (cuDNN workspaces)
  and allocator fragmentation are not counted, by the oracle or by the
  simulator: the library's default TF_LMS_SIMULATOR_MEM_RATIO=0.9 keeps 10%
  headroom for them (the ratio these runs used is stated above).
- Transfers take no time in the virtual cluster: the memory numbers assume
  every copy finishes in time, and section 4 gives the time the copies need.
- TensorFlow's memory optimizer ran offline, on the virtual cluster, with
  every other Grappler pass off, and its swap ops are measured as CPU
  `Identity` pairs. In a real GPU session it would run inside the meta
  optimizer after the other passes, on the real device's memory size.
- Real runs are on a CPU, where a swap moves no data: they check the cost of
  the extra ops, not of the transfers.
"""


def render(data, for_doc=False):
    """The markdown report."""
    out = []
    title = "# Benchmarks" if for_doc else "# tflms benchmarks"
    out.append(title)
    out.append("")
    if for_doc:
        out.append(_INTRO)
    out.append("- Command: `%s` (suite `%s`, tflms plans for %g of each "
               "budget)" % (data.get("command", "?"), data.get("suite", "?"),
                            data.get("mem_ratio", 1.0)))
    for update in data.get("updates", []):
        out.append("- Sections %s measured again on %s with `%s`" % (
            ", ".join(update.get("sections", [])), update.get("started"),
            update.get("command")))
    out.append("- Machine: %s" % _machine(data))
    load = data.get("machine", {}).get("loadavg_at_start")
    out.append("- Started %s, took %.0f min%s" % (
        data.get("started", "?"), data.get("total_s", 0) / 60.0,
        "; load average at start %s" % "/".join(load) if load else ""))
    out.append("- The machine is shared with other jobs running tests at the "
               "same time, so every time here is pessimistic (slower than "
               "on an idle machine).")
    rows = targets(data)
    if rows:
        out.append("")
        out.append("**Targets** (judged on CPU time, which is what a phase "
                   "costs on an idle machine; wall time is what it took "
                   "here)")
        out.append("")
        for text, met in rows:
            mark = {True: "met", False: "**missed**", None: "unknown"}[met]
            out.append("- %s (%s)" % (text, mark))
    facts = findings(data)
    if facts:
        out.append("")
        out.append("**Findings**")
        out.append("")
        out.extend("- " + f for f in facts)
    notes = behind_tensorflow(data)
    out.append("")
    out.append("**Where tflms is behind TensorFlow's own swapping:** %s"
               % ("; ".join(notes) if notes else "nowhere in these runs."))
    sections = data.get("sections", {})
    for name in ("timing", "memory", "capacity", "cost", "fidelity"):
        if name not in sections and not (name == "cost"
                                         and "memory" in sections):
            continue
        out.append("")
        out.append(_SECTION_TEXT[name])
        if name == "timing":
            out.append(timing.tables(sections["timing"]))
        elif name == "memory":
            out.append(memory.tables(sections["memory"]))
        elif name == "capacity":
            note = capacity.budget_note(sections["capacity"],
                                        data.get("mem_ratio"))
            if note:
                out.append(note)
                out.append("")
            out.append(capacity.tables(sections["capacity"]))
        elif name == "cost":
            out.append(cost.tables(sections.get("memory", []),
                                   sections.get("cost", [])))
        elif name == "fidelity":
            out.append(fidelity.tables(sections["fidelity"]))
    if for_doc:
        out.append("")
        out.append(_CAVEATS)
    plots = data.get("plots")
    if plots:
        out.append("")
        out.append("Plots (%s) are written to the output folder with "
                   "`results.json`." % ", ".join(plots))
    out.append("")
    return "\n".join(out)
