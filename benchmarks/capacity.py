"""Section 3: how much bigger a model can get in a given GPU memory.

For one model, one growing dimension (image side, volume side or batch
size) and one budget, find the largest size whose oracle GPU peak fits the
budget, four ways (`METHODS`, in this order): without LMS, with
TensorFlow's swapping (``SWAPPING_HEURISTICS``, the simulated GPU having
the budget as memory), with tflms auto-tuned to the budget and with IBM's
original TFLMSv2 auto-tuned to the budget (`benchmarks.tflmsv2`; only when
``--tflmsv2 PATH`` or ``$TFLMSV2_PATH`` names a checkout of it, else its
result and table cells say "not measured: TFLMSV2_PATH not set"). "Fits" is
always the oracle's verdict on the graph as it would run (for tflms and
TFLMSv2: after the rewrite; a size where auto-tuning finds no plan does not
fit): its runtime GPU peak (`benchmarks.measure.oracle_peaks`) is at most
the budget (`measure_probe` measures one size).

The search is a bisection on the oracle, bracketed by the tflms simulator so
it needs few probes (each probe builds the model at that size):

* memory grows about as ``R + A * size**k`` (k = 2 for an image side, 3 for
  a volume side, 1 for the batch), R being the resident variables. One
  probe at the start size gives A without LMS (oracle peak) and, for tflms,
  the peak of the most aggressive plan (every candidate tensor swapped,
  ``swapout_threshold=1, swapin_ahead=1, swapin_groupby=0``, best sync
  mode) from the simulator. Solving for the budget gives the first guess.
* From the guess the search gallops (steps growing geometrically) until it
  has a size that fits and one that does not, then bisects until they are
  within the tolerance (relative) or one grid step apart. TensorFlow's
  search starts from the size found without LMS, TFLMSv2's from the size
  tflms reached; ``case["guess"]`` (method -> size) overrides a start.

Bisection assumes that a larger size never fits when a smaller one does
not; every probe is kept in the JSON so that can be checked.

What a size costs per step: every fitting probe without LMS and every
tflms probe records the step `tflms.steptime` predicts for it
(``predicted_step``; on `Settings().gpu`, the GPU the pipeline plans for):
without LMS the graph's compute, with tflms the rewritten step over each of
`benchmarks.measure.STEP_LINKS` and its exposed transfer time.
`step_table` sets the step at the largest tflms size against the no-LMS
step at the largest no-LMS size scaled by pixels, voxels or samples.
"""

import math
import time

from benchmarks import common

__all__ = ["METHODS", "largest_fitting", "measure_probe", "run", "tables",
           "scaled_steps", "step_table", "budget_note"]

METHODS = (("none", "no LMS"), ("tf_swap", "TF swapping"),
           ("tflms", "tflms (auto-tuned)"),
           ("tflmsv2", "TFLMSv2 (the original, auto-tuned)"))

_EXPONENT = {"image": 2, "volume": 3, "batch": 1, "seq": 2}


def _snap(value, step, up=False):
    q = value / float(step)
    q = math.ceil(q) if up else math.floor(q)
    return max(step, int(q) * step)


def largest_fitting(fits, guess, step, tolerance, min_size, max_size):
    """Largest size in [min_size, max_size] (multiples of `step`) that fits.

    Args:
      fits: callable(size) -> bool (expensive).
      guess: first size to try.
      step: grid of sizes.
      tolerance: stop when the gap between the largest fitting and the
        smallest failing size is at most this share of the former (or one
        step).
      min_size, max_size: the range searched.

    Returns:
      ``(largest fitting or 0, smallest failing or None)``.
    """
    clamp = lambda s: min(max_size, max(min_size, s))  # noqa: E731
    good, bad = None, None
    s = clamp(_snap(guess, step))
    if fits(s):
        good = s
    else:
        bad = s
    jump = max(tolerance * 2, 0.05)
    while good is None:
        s = clamp(_snap(bad / (1 + jump), step))
        if s >= bad:
            return 0, bad
        if fits(s):
            good = s
        else:
            bad = s
            jump *= 2
    while bad is None:
        if good >= max_size:
            return good, None
        s = clamp(_snap(good * (1 + jump), step, up=True))
        if s <= good:
            s = clamp(good + step)
        if fits(s):
            good = s
            jump *= 2
        else:
            bad = s
    while bad - good > max(step, tolerance * good):
        mid = _snap((good + bad) / 2.0, step)
        if mid <= good:
            mid = good + step
        if mid >= bad:
            break
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good, bad


def _prediction(built):
    """First guesses for no LMS and tflms from one build at the start size:
    the peak without LMS and the smallest peak of the most aggressive fixed
    plans (every tensor swapped, each sync mode), planned by
    `pipeline.plan` as LMS.run plans."""
    from benchmarks import measure
    from tflms import pipeline
    from tflms.settings import Settings
    index = measure.step_index(built)
    target = measure.step_target(built, Settings())
    roles = pipeline.classify(index, Settings(), target)
    base = pipeline.simulate_without(index, roles,
                                     Settings(batch_size=built.batch_size))
    resident = base.resident_device_bytes
    smallest = base.peak_device_bytes
    for sync in range(4):
        planned = pipeline.plan(index, Settings(
            swapout_threshold=1, swapin_ahead=1, swapin_groupby=0,
            sync_mode=sync, batch_size=built.batch_size), roles=roles,
            simulate=True, target=target)
        smallest = min(smallest, planned.with_lms.peak_device_bytes)
    return resident, base.peak_device_bytes, smallest


def _scale(size, peak, resident, budget, k):
    if peak <= resident or budget <= resident:
        return size
    return size * ((budget - resident) / float(peak - resident)) ** (1.0 / k)


def measure_probe(method, built, budget_gib, tflmsv2_path=None,
                  lms_settings=None):
    """One probe's measurements of `built` (edited in place) by `method`.

    "none": the oracle on the graph as given. "tf_swap": TensorFlow's
    ``SWAPPING_HEURISTICS`` with the budget as the simulated GPU's memory,
    then the oracle. "tflms": `measure.apply_tflms` auto-tuned to the
    budget, then the oracle unless no plan fits ("no fit")
    (`measure.probe_peaks`). "tflmsv2": the original TFLMSv2 from
    `tflmsv2_path`, then the oracle unless it found no plan ("no plan")
    (`tflmsv2.measured`). `lms_settings`:
    LMS properties tflms is given besides the budget (a case's ``lms``).

    Returns:
      dict of the probe's numbers; the caller judges ``gpu_peak`` (absent
      without a plan) against the budget.
    """
    if method not in [m for m, _ in METHODS]:
        raise ValueError("method must be one of %s; got %r"
                         % ([m for m, _ in METHODS], method))
    if method == "tflmsv2":
        from benchmarks import tflmsv2
        return tflmsv2.measured(built, budget_gib, tflmsv2_path)
    from benchmarks import measure
    return measure.probe_peaks(method, built, budget_gib, lms_settings)


def run(case):
    """Worker: the searches for one model, dimension and budget (one per
    method of `METHODS`, or of ``case["methods"]``). TFLMSv2 is searched
    only when ``case["tflmsv2"]`` or ``$TFLMSV2_PATH`` names the original;
    otherwise its result says it was not measured and why."""
    common.setup_tensorflow(case.get("control_flow", "v2"))
    from benchmarks import measure, models
    from tflms import autotune
    budget = int(case["budget_gib"] * common.GIB)
    dim = case["dimension"]
    key = models.size_key(dim)
    k = _EXPONENT[dim]
    step = case["step"]
    # The share of the budget tflms plans for, as this worker's environment
    # gives it (`run.py --mem-ratio`): `budget_note` states it.
    out = {"case": case, "probes": [], "results": {}, "done": False,
           "mem_ratio": autotune.mem_ratio()}
    from benchmarks import tflmsv2
    tflmsv2_path = tflmsv2.path_from(case.get("tflmsv2"))

    def build(size):
        kwargs = dict(case["kwargs"])
        kwargs[key] = size
        return models.build(case["model"], **kwargs)

    cache = {}

    def probe(method):
        def fits(size):
            if (size, method) in cache:
                return cache[(size, method)]
            start = time.perf_counter()
            built = build(size)
            row = {"size": size, "method": method}
            try:
                row.update(measure_probe(method, built, case["budget_gib"],
                                         tflmsv2_path, case.get("lms")))
                ok = row.get("gpu_peak") is not None and \
                    row["gpu_peak"] <= budget
            except Exception as err:
                row["error"] = "%s: %s" % (type(err).__name__,
                                           str(err)[:200])
                ok = False
            row["fits"] = ok
            if ok and method == "none":
                # Only sizes that fit: the largest is the baseline
                # `step_table` scales. Outside the verdict above, so that a
                # failed prediction cannot change what fits.
                try:
                    row["predicted_step"] = \
                        measure.predicted_step_without_lms(built)
                except Exception as err:
                    row["step_error"] = "%s: %s" % (type(err).__name__,
                                                    str(err)[:200])
            row["probe_s"] = time.perf_counter() - start
            row.pop("top", None)
            out["probes"].append(row)
            common.emit(out)
            cache[(size, method)] = ok
            return ok
        return fits

    start_size = case["start"]
    first = build(start_size)
    resident, peak0, smallest0 = _prediction(first)
    none0 = measure.oracle_peaks(first.graph, first.train_op)["gpu_peak"]
    del first
    guesses = {
        "none": _scale(start_size, none0, resident, budget, k),
        "tflms": _scale(start_size, smallest0, resident, budget, k),
    }
    out["prediction"] = {"start": start_size, "simulated_peak": peak0,
                         "oracle_peak": none0, "resident": resident,
                         "smallest_plan_peak": smallest0,
                         "guess_none": guesses["none"],
                         "guess_tflms": guesses["tflms"]}
    tol = case.get("tolerance", 0.03)
    lo, hi = case.get("min", step), case.get("max", 1 << 20)
    guesses.update(case.get("guess", {}))
    for method in case.get("methods", [m for m, _ in METHODS]):
        if method == "tflmsv2" and tflmsv2_path is None:
            out["results"][method] = {"largest": None,
                                      "smallest_failing": None,
                                      "not_measured": tflmsv2.NOT_SET,
                                      "search_s": 0.0, "probes": 0}
            common.emit(out)
            continue
        guess = guesses.get(method)
        if guess is None and method == "tflmsv2":
            # From where tflms stopped, else where tflms was guessed to.
            guess = out["results"].get("tflms", {}).get("largest") or \
                guesses["tflms"]
        if guess is None:  # TensorFlow: from where no LMS stopped
            base = out["results"].get("none", {}).get("largest") or \
                guesses["none"]
            guess = base * (1 + max(2 * tol, 0.05))
        t0 = time.perf_counter()
        good, bad = largest_fitting(probe(method), guess, step, tol, lo, hi)
        out["results"][method] = {
            "largest": good, "smallest_failing": bad,
            "search_s": time.perf_counter() - t0,
            "probes": sum(1 for p in out["probes"] if p["method"] == method),
        }
        common.emit(out)
    out["done"] = True
    return out


def _factor(size, base, k):
    if not size or not base:
        return "-"
    return "%.2fx (%.1fx %s)" % (size / float(base),
                                 (size / float(base)) ** k,
                                 {1: "samples", 2: "pixels",
                                  3: "voxels"}.get(k, "units"))


def _stopper(result, method="tflms"):
    """Why the smallest failing size of `method` (tflms or tflmsv2)
    failed."""
    failing = result.get("results", {}).get(method, {}).get(
        "smallest_failing")
    for p in result.get("probes", []):
        if p["method"] != method or p["size"] != failing:
            continue
        if p.get("status") == "no fit":
            return "at %d: no plan fits (simulator)" % failing
        if p.get("status") == "no plan":
            return "at %d: no plan (its auto-tuning)" % failing
        if p.get("gpu_peak") is not None:
            text = "at %d: oracle %s" % (failing,
                                         common.fmt_bytes(p["gpu_peak"]))
            sim = common.sim_beside_oracle(p) if method == "tflms" else \
                p.get("v2_sim_peak")
            if sim:
                text += ", simulator %s" % common.fmt_bytes(sim)
            return text
        return "at %d: %s" % (failing, p.get("error", "?")[:60])
    return "-"


def _probe_at(result, method, size):
    """The fitting probe of `method` at `size`, or None."""
    for p in result.get("probes", []):
        if p["method"] == method and p["size"] == size and p.get("fits"):
            return p
    return None


def scaled_steps(result):
    """The step costs `step_table` shows for one capacity result.

    Returns:
      None when either search found no size, or the probes predate
      predicted steps; else a dict with none_size, none_step_s (no-LMS
      compute there), tflms_size, scale ((tflms_size / none_size) ** k),
      scaled_step_s (none_step_s * scale), compute_s (the compute of the
      tflms graph at its size, no copies), gpu, and links: per link name,
      with_lms_s, exposed_s and ratio (with_lms_s / scaled_step_s).
    """
    res = result.get("results", {})
    none_size = res.get("none", {}).get("largest")
    lms_size = res.get("tflms", {}).get("largest")
    if not none_size or not lms_size:
        return None
    none = (_probe_at(result, "none", none_size) or {}).get("predicted_step")
    lms = (_probe_at(result, "tflms", lms_size) or {}).get("predicted_step")
    if not none or not lms:
        return None
    k = _EXPONENT.get(result.get("case", {}).get("dimension"), 1)
    scale = (lms_size / float(none_size)) ** k
    scaled = none["without_lms_s"] * scale
    return {"none_size": none_size, "none_step_s": none["without_lms_s"],
            "tflms_size": lms_size, "scale": scale, "scaled_step_s": scaled,
            "compute_s": lms["without_lms_s"], "gpu": lms["gpu"],
            "links": {link: dict(v, ratio=v["with_lms_s"] / scaled)
                      for link, v in lms["links"].items()}}


def _ms(seconds):
    if seconds >= 1:
        return "%.2f s" % seconds
    return "%.1f ms" % (seconds * 1e3)


def step_table(results):
    """Markdown: the predicted step at the largest tflms size, against the
    no-LMS step scaled to that size, with the paragraph that explains it."""
    from benchmarks.measure import STEP_LINKS
    from tflms import hardware
    from tflms.settings import Settings
    labels = [hardware.interconnect_named(l).label.split(" (")[0]
              for l in STEP_LINKS]
    lines = ["| model | grows | budget | tflms size | "
             + " | ".join("step, %s (exposed)" % l for l in labels)
             + " | compute alone | no LMS: size, step | scaled to tflms "
             "size | " + " | ".join("%s / scaled" % l for l in labels)
             + " |",
             "|---|---|---:|---:|" + "---:|" * (2 * len(labels) + 3)]
    gpus = set()
    for r in results:
        case = r.get("case", {})
        steps = scaled_steps(r)
        cells = ["-"] * (2 * len(labels) + 4)
        if steps is not None:
            gpus.add(steps["gpu"])
            links = [steps["links"][l] for l in STEP_LINKS]
            cells = ([str(steps["tflms_size"])]
                     + ["%s (%s)" % (_ms(v["with_lms_s"]), _ms(v["exposed_s"]))
                        for v in links]
                     + [_ms(steps["compute_s"]),
                        "%d, %s" % (steps["none_size"],
                                    _ms(steps["none_step_s"])),
                        "%s (x%.2f)" % (_ms(steps["scaled_step_s"]),
                                        steps["scale"])]
                     + ["%.2f" % v["ratio"] for v in links])
        lines.append("| %s | %s | %g GiB | %s |" % (
            case.get("label", case.get("model")), case.get("dimension"),
            case.get("budget_gib", 0), " | ".join(cells)))
    k_text = ", ".join("%s %d" % (d, k) for d, k in _EXPONENT.items())
    tuned_for = hardware.interconnect_named(Settings().interconnect).label
    lines += ["", (
        "Predicted steps (`tflms.steptime` on %s; no GPU was used) at the "
        "largest size tflms fits: the auto-tuned plan over each link (tuned "
        "for %s), in brackets the time spent waiting for copies, and "
        "*compute alone*, the same graph without copies. *Scaled* is the "
        "no-LMS step at the largest size that fits without LMS times (tflms "
        "size / no-LMS size)^k (k: %s; the factor in brackets): that step "
        "grown with the data. The ratios are each tflms step over it: above "
        "1, a pixel, voxel or sample costs more with tflms than without LMS "
        "at its largest size." % (", ".join(sorted(gpus))
                                   or Settings().gpu, tuned_for, k_text))]
    return "\n".join(lines)


def budget_note(results, default_ratio=None):
    """A sentence stating the share of each budget tflms planned for
    (``mem_ratio`` of each result, else `default_ratio`), and that every
    method is judged against the whole budget."""
    ratios = sorted({r.get("mem_ratio", default_ratio) for r in results}
                    - {None})
    if not ratios:
        return ""
    text = "tflms auto-tuned to %s of each budget " \
        "(TF_LMS_SIMULATOR_MEM_RATIO, `benchmarks/run.py --mem-ratio`)" % (
            " and ".join("%g" % r for r in ratios))
    if ratios == [1.0]:
        return text + (": it planned for the whole budget, the criterion "
                       "every column is judged by (oracle peak at most the "
                       "budget).")
    return text + (", keeping the rest as headroom for what neither the "
                   "simulator nor the oracle counts (kernel scratch, "
                   "fragmentation); every column, tflms included, is judged "
                   "by the oracle peak against the whole budget, so tflms "
                   "sizes here are conservative (`--mem-ratio 1` plans for "
                   "the whole budget).")


def _v2_cell(res):
    """The TFLMSv2 cell: its largest size, why it was not measured, or
    n/a for results from before it was a method."""
    v = res.get("tflmsv2")
    if v is None:
        return None, "n/a"
    if v.get("not_measured"):
        return None, v["not_measured"]
    if v.get("smallest_failing") is None and v["largest"]:
        return v["largest"], ">= %s (search limit)" % v["largest"]
    return v["largest"], str(v["largest"])


def tables(results):
    """Markdown for section 3: the largest sizes, then what they cost
    per step (`step_table`)."""
    lines = ["| model | grows | budget | no LMS | TF swapping | tflms | "
             "TFLMSv2 (original) | TF vs no LMS | tflms vs no LMS | "
             "TFLMSv2 vs no LMS | tflms vs TFLMSv2 | what stopped tflms | "
             "what stopped TFLMSv2 | probes | time |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
             "---:|---:|"]
    v2_measured = False
    for r in results:
        case = r.get("case", {})
        res = r.get("results", {})
        k = _EXPONENT.get(case.get("dimension"), 1)

        def size(method, res=res):
            v = res.get(method)
            if v is None:
                return None, "n/a"
            text = str(v["largest"])
            if v.get("smallest_failing") is None and v["largest"]:
                text = ">= %s (search limit)" % v["largest"]
            return v["largest"], text

        base, base_t = size("none")
        tf_size, tf_t = size("tf_swap")
        lms_size, lms_t = size("tflms")
        v2_size, v2_t = _v2_cell(res)
        measured = "tflmsv2" in res and not res["tflmsv2"].get(
            "not_measured")
        v2_measured = v2_measured or measured
        label = case.get("label", case.get("model"))
        err = " (incomplete: %s)" % r["error"] if r.get("error") else ""
        lines.append("| %s%s | %s | %g GiB | %s | %s | %s | %s | %s | %s | "
                     "%s | %s | %s | %s | %d | %.0f s |" % (
                         label, err, case.get("dimension"),
                         case.get("budget_gib", 0), base_t, tf_t, lms_t,
                         v2_t, _factor(tf_size, base, k),
                         _factor(lms_size, base, k),
                         _factor(v2_size, base, k),
                         _factor(lms_size, v2_size, k), _stopper(r),
                         _stopper(r, "tflmsv2") if measured else "-",
                         len(r.get("probes", [])), r.get("wall_s", 0)))
    if v2_measured:
        lines += ["", (
            "TFLMSv2 is IBM's original (tensorflow-large-model-support, "
            "branch tflmsv2), loaded from TFLMSV2_PATH by "
            "`benchmarks/tflmsv2.py` and auto-tuned as its README says "
            "(autotune_gpu_mem the budget, batch_size the batch); it plans "
            "for the budget minus the trainable variables, times "
            "TF_LMS_SIMULATOR_MEM_RATIO, and is judged like every column "
            "by the oracle's runtime peak against the whole budget. "
            "\"No plan\": its auto-tuning found no parameters.")]
    return "\n".join(lines) + "\n\n" + step_table(results)


def plot(results, path):
    """Bars of the largest size per method, relative to no LMS."""
    axes = common.new_axes()
    if axes is None:
        return None
    fig, ax = axes
    width = 0.8 / len(METHODS)
    labels = []
    for i, r in enumerate(results):
        case = r.get("case", {})
        res = r.get("results", {})
        base = res.get("none", {}).get("largest")
        labels.append("%s %s\n%g GiB" % (case.get("model"),
                                         case.get("dimension"),
                                         case.get("budget_gib", 0)))
        for j, (method, name) in enumerate(METHODS):
            v = res.get(method, {}).get("largest")
            if v and base:
                ax.bar(i + j * width, v / float(base), width=width,
                       color="C%d" % j, label=name if i == 0 else None)
    ax.set_xticks([i + width * (len(METHODS) - 1) / 2.0
                   for i in range(len(results))])
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("largest size / largest without LMS")
    ax.legend(fontsize=8)
    return common.save_figure(fig, path)
