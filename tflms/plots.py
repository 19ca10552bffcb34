"""Pictures of what auto-tuning decided, written as PNG (and TSV) files.

The planning core writes no file: it returns what the plots show
(`Planned.plot_data`, `AutotuneError.plot_data`: an `autotune.PlotData`),
and its caller draws it here. `LMS.run` calls `write_planned` after
planning and `with_plots` on a failed plan, which write into
`Settings.plot_dir` when `Settings.autotune_plot` asks; ``tflms plan``
calls `write_plots` itself.

matplotlib is optional and imported only here, lazily. Figures are built
with `matplotlib.figure.Figure` and rendered by the Agg canvas directly, so
the user's pyplot state and backend are never touched.

Files written into the plot folder:

* ``memory_without_lms.png`` / ``memory_with_lms.png``: expected device
  memory (GiB) at each level of one training step, with the budget line.
  When auto-tuning finds nothing under the budget,
  ``memory_smallest_plan.png`` shows the plan that came closest instead.
* ``distance_histogram.png`` and ``distance_histogram.tsv``: how many
  swap-candidate edges (device tensor to a later device reader) span each
  level distance, and their bytes (log scales, so that the few long edges
  LMS swaps show beside hundreds of short ones). Thresholds act on this
  distance.

`write_capacity_plot` draws `tflms capacity`'s picture (samples or tokens
per second against the batch or sequence length it searched).
"""

import os

from tflms import graph_index as gi
from tflms import planner

__all__ = [
    "distance_histogram",
    "memory_figure",
    "histogram_figure",
    "plot_figures",
    "write_histogram_tsv",
    "write_plots",
    "write_planned",
    "with_plots",
    "pictures_in",
    "write_capacity_plot",
    "PICTURES",
]

_GIB = float(1 << 30)
_INSTALL_HINT = "pip install matplotlib (or pip install tflms[plot])"
# Why `write_plots` wrote only the TSV, for `tflms plan`'s report.
MISSING_MATPLOTLIB = ("matplotlib is not installed; to get them: "
                      + _INSTALL_HINT)
# The pictures `write_plots` may write, in the order it writes them.
PICTURES = ("memory_without_lms.png", "memory_with_lms.png",
            "memory_smallest_plan.png", "distance_histogram.png")


def distance_histogram(index, roles, batch_size=None, edges=None):
    """Candidate edges counted by level distance.

    Args:
      index: a `GraphIndex`.
      roles: its `OpRoles`.
      batch_size: for byte counts (unknown sizes count 0).
      edges: precomputed `planner.candidate_edges` (optional).

    Returns:
      A list of ``(distance, edges, bytes)``, ascending by distance.
    """
    if edges is None:
        edges = planner.candidate_edges(index, roles)
    counts = {}
    for p, out, _, _, distance in edges:
        n, b = counts.get(distance, (0, 0))
        size = gi.tensor_bytes(index, p, out, batch_size) or 0
        counts[distance] = (n + 1, b + size)
    return [(d, n, b) for d, (n, b) in sorted(counts.items())]


def _figure_class():
    """`(Figure, FigureCanvasAgg)` or None when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    return Figure, FigureCanvasAgg


def memory_figure(timeline_bytes, budget_bytes, title):
    """Device memory per level with a budget line.

    Args:
      timeline_bytes: bytes in use per level (e.g.
        `SimulationResult.device_timeline`).
      budget_bytes: the device budget.
      title: figure title.

    Returns:
      A `matplotlib.figure.Figure` (with an Agg canvas attached).

    Raises:
      ImportError: without matplotlib.
    """
    fig, ax = _new_figure()
    gib = [b / _GIB for b in timeline_bytes]
    ax.plot(range(len(gib)), gib, color="tab:blue", linewidth=1.2,
            label="expected device memory")
    ax.axhline(budget_bytes / _GIB, color="tab:red", linestyle="--",
               linewidth=1.0, label="budget %.2f GiB" % (budget_bytes / _GIB))
    ax.set_xlabel("step (level of the topological sort)")
    ax.set_ylabel("device memory (GiB)")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def _new_figure(columns=1):
    """An 8x4.5 inch figure with an Agg canvas and `columns` axes side by
    side; returns the first.

    Raises:
      ImportError: without matplotlib.
    """
    classes = _figure_class()
    if classes is None:
        raise ImportError("matplotlib is needed for LMS plots: "
                          + _INSTALL_HINT)
    figure_cls, canvas_cls = classes
    fig = figure_cls(figsize=(8, 4.5), dpi=100)
    canvas_cls(fig)
    axes = [fig.add_subplot(1, columns, k + 1) for k in range(columns)]
    return fig, axes[0]


def histogram_figure(histogram,
                     title="Swap-candidate edges by level distance"):
    """Bar chart of `distance_histogram` output: edges per distance and,
    when any size is known, their bytes, both on log scales.

    Short edges (distance 1, a tensor read by the next level) outnumber the
    long ones by hundreds, and on a linear scale the long ones, which are
    the tensors LMS can swap, would be invisible; on a log scale a single
    edge at the far tail still shows. The longest distance is marked.

    Raises:
      ImportError: without matplotlib.
    """
    distances = [d for d, _, _ in histogram]
    counts = [n for _, n, _ in histogram]
    sizes = [b / float(1 << 20) for _, _, b in histogram]
    panels = 2 if any(sizes) else 1
    fig, ax = _new_figure(columns=panels)
    _log_bars(ax, distances, counts, "tab:green", "edges")
    ax.set_title(title + " (log scale)", fontsize="medium")
    ax.set_xlabel("distance (levels from producer to consumer)")
    if distances:
        ax.axvline(max(distances), color="tab:red", linestyle=":",
                   linewidth=1.0,
                   label="longest: %d levels" % max(distances))
        ax.legend(loc="upper right")
    if panels == 2:
        ax = fig.axes[1]
        _log_bars(ax, distances, sizes, "tab:purple", "bytes (MiB)")
        ax.set_title("Their bytes (log scale)", fontsize="medium")
        ax.set_xlabel("distance (levels)")
    fig.tight_layout()
    return fig


def _log_bars(ax, distances, heights, color, label):
    """Bars on a log y axis whose bottom lies a factor of 3 below the
    smallest non-zero height, so that every non-zero bar is visible."""
    ax.bar(distances, heights, width=1.0, color=color)
    ax.set_ylabel(label)
    ax.set_yscale("log")
    shown = [h for h in heights if h > 0]
    if shown:
        ax.set_ylim(min(shown) / 3.0, max(shown) * 2.0)
    ax.grid(True, axis="y", alpha=0.3)


def write_histogram_tsv(path, histogram):
    """``distance<TAB>edges<TAB>bytes`` lines with a header."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("distance\tedges\tbytes\n")
        for d, n, b in histogram:
            f.write("%d\t%d\t%d\n" % (d, n, b))


def _save(fig, path):
    fig.savefig(path, format="png")


def plot_figures(without_lms, with_lms, budget_bytes, histogram,
                 with_lms_fits=True):
    """The figures `write_plots` saves, as ``(file name, Figure)`` pairs.

    Args:
      without_lms: `SimulationResult` of the graph as is.
      with_lms: `SimulationResult` of the chosen plan (or of the smallest
        plan when none fits), or None.
      budget_bytes: device budget.
      histogram: `distance_histogram` output.
      with_lms_fits: False when `with_lms` is the smallest plan of a search
        that found nothing under the budget; it is then saved as
        ``memory_smallest_plan.png`` and titled so.

    Raises:
      ImportError: without matplotlib.
    """
    figures = [("memory_without_lms.png", memory_figure(
        without_lms.device_timeline, budget_bytes,
        "Device memory without LMS (peak %.2f GiB)"
        % (without_lms.peak_device_bytes / _GIB)))]
    if with_lms is not None:
        if with_lms_fits:
            name, title = "memory_with_lms.png", (
                "Device memory with LMS (peak %.2f GiB, %.2f GiB swapped out"
                % (with_lms.peak_device_bytes / _GIB,
                   with_lms.swapout_bytes / _GIB))
            if with_lms.recompute_bytes:
                title += ", %.2f GiB recomputed" % (
                    with_lms.recompute_bytes / _GIB)
            title += ")"
        else:
            name, title = "memory_smallest_plan.png", (
                "Smallest LMS plan: peak %.2f GiB, over the %.2f GiB budget"
                % (with_lms.peak_device_bytes / _GIB, budget_bytes / _GIB))
        figures.append((name, memory_figure(with_lms.device_timeline,
                                            budget_bytes, title)))
    figures.append(("distance_histogram.png", histogram_figure(histogram)))
    return figures


def write_plots(plot_dir, data, log=None):
    """Write the memory plots and the distance histogram into `plot_dir`.

    Args:
      plot_dir: folder (created if needed).
      data: the `autotune.PlotData` to draw.
      log: a `Logger` (optional).

    Returns:
      The list of written paths. Without matplotlib only the TSV is written
      and a warning is logged.
    """
    os.makedirs(plot_dir, exist_ok=True)
    histogram = distance_histogram(data.index, data.roles, data.batch_size)
    tsv = os.path.join(plot_dir, "distance_histogram.tsv")
    write_histogram_tsv(tsv, histogram)
    written = [tsv]
    if _figure_class() is None:
        if log is not None:
            log.warning("matplotlib is not installed, so LMS wrote no memory "
                        "plots (only %s); to get them: %s"
                        % (tsv, _INSTALL_HINT))
        return written
    for name, fig in plot_figures(data.without_lms, data.with_lms,
                                  data.budget_bytes, histogram,
                                  data.with_lms_fits):
        path = os.path.join(plot_dir, name)
        _save(fig, path)
        written.append(path)
    # A plan plot left by an earlier run would sit next to these as if it
    # belonged to this model.
    for stale in ("memory_with_lms.png", "memory_smallest_plan.png"):
        path = os.path.join(plot_dir, stale)
        if path not in written and os.path.exists(path):
            os.remove(path)
    if log is not None:
        log.info("Wrote memory plots and the distance histogram to %s"
                 % os.path.abspath(plot_dir))
    return written


def write_planned(planned, log=None):
    """The plots of a tuned plan (`pipeline.Planned`), written into
    `Settings.plot_dir` when `Settings.autotune_plot` asks.

    Returns:
      The paths written (none when not asked, or the parameters were
      fixed: the plots show what auto-tuning decided).
    """
    settings = planned.context.settings
    if not (settings.autotune_plot and planned.autotuned):
        return ()
    return tuple(write_plots(settings.plot_dir, planned.plot_data(), log))


def with_plots(err, settings, log=None):
    """`err`, an `autotune.AutotuneError` of planning with `settings`,
    after writing its plots when `Settings.autotune_plot` asks; for a
    search that found nothing under the budget, a copy whose message
    names them (the step without LMS and the smallest plan show where
    memory peaks and what swapping could not move).
    """
    data = err.plot_data
    if not settings.autotune_plot or data is None:
        return err
    plot_dir = settings.plot_dir
    files = write_plots(plot_dir, data, log)
    if data.with_lms_fits:
        return err
    pictures = [f for f in files if f.endswith(".png")]
    if not pictures:
        note = ("%s (No memory plots: matplotlib is missing; the distance "
                "histogram is in %s.)" % (err, os.path.abspath(plot_dir)))
    else:
        note = ("%s Memory plots of the step without LMS and with the "
                "smallest plan: %s" % (err, ", ".join(
                    os.path.abspath(f) for f in pictures)))
    noted = type(err)(note, err.smallest_peak_bytes, err.floor, data)
    noted.stage_seconds = err.stage_seconds
    return noted


def pictures_in(plot_dir):
    """The paths of the `PICTURES` in `plot_dir`, in the order written:
    the last plots written there, as `write_plots` removes stale ones."""
    return [os.path.join(plot_dir, name) for name in PICTURES
            if os.path.exists(os.path.join(plot_dir, name))]


def write_capacity_plot(capacity, path, title=None):
    """Samples per second against the batch (tokens per second against
    the sequence length, for a search over the sequence), without and
    with LMS, with the largest sizes marked, as a PNG at `path`: the
    plot of `tflms capacity` (a `tflms.capacity.Capacity`).

    Raises:
      ImportError: without matplotlib (`plots.MISSING_MATPLOTLIB`).
    """
    sequence = capacity.dimension == "sequence"
    rate, longest = (("tokens", "longest") if sequence
                     else ("samples", "largest"))
    if title is None:
        title = ("Tokens per second by sequence length" if sequence
                 else "Samples per second by batch")
    fig, ax = _new_figure()
    rows = capacity.rows
    # With LMS first: where LMS is not needed the two agree, and the line
    # without LMS stays visible on top.
    for label, attr, color, marker in (
            ("with LMS", rate + "_per_s_with", "tab:orange", "o"),
            ("without LMS", rate + "_per_s_without", "tab:blue", "s")):
        points = [(capacity.size_of(r), getattr(r, attr)) for r in rows
                  if getattr(r, attr) is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker=marker, markersize=4, linestyle="-",
                    color=color, label=label)
    for value, text, style in (
            (capacity.largest_without_lms, longest + " without LMS", ":"),
            (capacity.largest_with_lms, longest + " with LMS", "--"),
            (capacity.largest_within_overhead,
             "%s within %s%%" % (longest, capacity.max_overhead_pct), "-.")):
        if value is not None:
            ax.axvline(value, color="gray", linestyle=style, linewidth=1.0,
                       label="%s: %d" % (text, value))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (batch %d)" % capacity.batch_size
                  if sequence else "batch size")
    ax.set_ylabel("%s per second (predicted)" % rate)
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    _save(fig, path)
    return path
