"""Memory plots and the distance histogram."""

import builtins
import dataclasses
import logging
import math
import os

import pytest
import tensorflow as tf

from tflms import LMS
from tflms import analysis
from tflms import autotune
from tflms import pipeline
from tflms.tf import reader
from tflms import plots
from tflms._logging import Logger
from tflms.settings import Settings

from tests.test_autotune import uneven_chain

MIB = 1 << 20
# The budget is autotune_gpu_mem exactly.
EXACT = {autotune.MEM_RATIO_ENV: "1"}


def _settings(folder, gpu_mib, **others):
    return Settings(autotune_gpu_mem=gpu_mib / 1024.0, autotune_plot=True,
                    plot_dir=folder, **others)


def planned_with_plots(tmp_path):
    """The uneven chain planned at 6 MiB, its plots written as `LMS.run`
    writes them."""
    index, roles = uneven_chain()
    folder = os.path.join(str(tmp_path), "lms_plots")
    planned = pipeline.plan(index, _settings(folder, 6), roles=roles,
                            env=EXACT)
    files = plots.write_planned(planned, Logger())
    return planned, folder, files


def _failed_search(folder):
    """The `AutotuneError` of planning the uneven chain at 2 MiB, and the
    settings it was planned with."""
    index, roles = uneven_chain()
    settings = _settings(folder, 2)
    with pytest.raises(autotune.AutotuneError) as err:
        pipeline.plan(index, settings, roles=roles, env=EXACT)
    return err.value, settings


def test_plot_files_are_written_and_readable(tmp_path):
    from matplotlib import image
    planned, folder, files = planned_with_plots(tmp_path)
    assert planned.autotuned and planned.needed
    expected = ["distance_histogram.tsv", "memory_without_lms.png",
                "memory_with_lms.png", "distance_histogram.png"]
    assert [os.path.basename(p) for p in files] == expected
    assert plots.pictures_in(folder) == [
        os.path.join(folder, name) for name in expected[1:]]
    for name in expected[1:]:
        pixels = image.imread(os.path.join(folder, name))
        assert pixels.shape[:2] == (450, 800)  # 8 x 4.5 inches at 100 dpi


def test_plots_are_written_only_when_asked_and_tuned(tmp_path):
    index, roles = uneven_chain()
    folder = os.path.join(str(tmp_path), "not_asked")
    quiet = pipeline.plan(index, Settings(autotune_gpu_mem=6 / 1024.0),
                          roles=roles, env=EXACT)
    fixed = pipeline.plan(index, _settings(folder, 6).replace(
        swapout_threshold=3, swapin_ahead=1, swapin_groupby=0), roles=roles)
    assert plots.write_planned(quiet) == ()
    assert plots.write_planned(fixed) == ()
    assert not os.path.exists(folder)


def _lms(folder, gpu_mib):
    lms = LMS()
    lms.autotune_gpu_mem = gpu_mib / 1024.0
    lms.autotune_plot = True
    lms.plot_dir = folder
    return lms


def test_lms_run_writes_the_plots_the_settings_ask_for(tmp_path,
                                                       monkeypatch):
    monkeypatch.setenv(autotune.MEM_RATIO_ENV, "1")
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [256, 512], name="x")
        h = x
        for k in range(6):
            h = tf.math.sin(h, name="f%d" % k)
        y = tf.math.reduce_sum(h)
    folder = os.path.join(str(tmp_path), "run")
    _lms(folder, 1024).run(g, fetches=[y])
    # The step fits: the plot of the step without LMS, no plan to draw.
    assert [os.path.basename(p) for p in plots.pictures_in(folder)] == [
        "memory_without_lms.png", "distance_histogram.png"]
    assert os.path.exists(os.path.join(folder, "distance_histogram.tsv"))
    # Nothing fits: the error names the plots of the smallest plan.
    failed = os.path.join(str(tmp_path), "failed")
    with pytest.raises(autotune.AutotuneError,
                       match="Memory plots of the step without LMS and "
                       "with the smallest plan: .*memory_smallest_plan"):
        _lms(failed, 0.5).run(g, fetches=[y])
    assert "memory_smallest_plan.png" in os.listdir(failed)


def test_a_plan_plot_of_an_earlier_run_is_removed(tmp_path):
    planned, folder, _ = planned_with_plots(tmp_path)
    assert os.path.exists(os.path.join(folder, "memory_with_lms.png"))
    # The next model fits without LMS: only its own plots stay.
    data = dataclasses.replace(planned.plot_data(), with_lms=None)
    written = plots.write_plots(folder, data)
    assert sorted(os.listdir(folder)) == sorted(
        os.path.basename(p) for p in written)
    assert not os.path.exists(os.path.join(folder, "memory_with_lms.png"))


def test_histogram_counts_candidate_edges_by_distance(tmp_path):
    planned, folder, _ = planned_with_plots(tmp_path)
    index, roles = planned.index, planned.context.roles
    histogram = plots.distance_histogram(index, roles)
    # f1->g1 12, f2->g2 9, f3->g3 7, f4->g4 5, f5->g5 3; the 13 others
    # (f1->f2 twice, the two chains, the slice) span one level.
    assert [(d, n) for d, n, _ in histogram] == [
        (1, 13), (3, 1), (5, 1), (7, 1), (9, 1), (12, 1)]
    assert dict((d, b) for d, _, b in histogram)[12] == MIB // 2
    with open(os.path.join(folder, "distance_histogram.tsv")) as f:
        lines = f.read().splitlines()
    assert lines[0] == "distance\tedges\tbytes"
    assert lines[-1] == "12\t1\t%d" % (MIB // 2)


def test_figures_are_labelled_and_leave_pyplot_alone():
    import matplotlib
    backend = matplotlib.get_backend()
    fig = plots.memory_figure([0, MIB << 10, 2 << 30], 1 << 30, "Memory")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "step (level of the topological sort)"
    assert ax.get_ylabel() == "device memory (GiB)"
    assert ax.get_title() == "Memory"
    budget_line = ax.lines[1]
    assert list(budget_line.get_ydata()) == [1.0, 1.0]
    assert list(ax.lines[0].get_ydata()) == [0.0, 1.0, 2.0]
    hist = plots.histogram_figure([(1, 4, 0), (3, 2, 0)])
    assert hist.axes[0].get_xlabel().startswith("distance")
    assert hist.axes[0].get_ylabel() == "edges"
    assert matplotlib.get_backend() == backend


def test_without_matplotlib_a_warning_says_how_to_install(tmp_path,
                                                         monkeypatch,
                                                         caplog):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    logging.getLogger("tensorflow").propagate = True
    caplog.set_level(logging.WARNING, logger="tensorflow")
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        tf.math.cos(tf.math.sin(x), name="y")
    index = reader.build_index(g)
    roles = analysis.classify_ops(index)
    from tflms import simulator
    result = simulator.SimulationModel(index, roles).replay(None)
    written = plots.write_plots(str(tmp_path), autotune.PlotData(
        index=index, roles=roles, batch_size=None, without_lms=result,
        with_lms=None, budget_bytes=MIB), log=Logger())
    assert [os.path.basename(p) for p in written] == ["distance_histogram.tsv"]
    warnings = [r.getMessage() for r in caplog.records]
    assert any("pip install matplotlib" in w and "tflms[plot]" in w
               for w in warnings)


def assert_labelled(fig):
    assert fig.axes
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()


def _visible_fraction(ax, height):
    """How far up its axes a bar of `height` reaches (0 to 1), on the axes'
    own scale."""
    low, high = ax.get_ylim()
    if ax.get_yscale() == "log":
        return (math.log(height) - math.log(low)) / (
            math.log(high) - math.log(low))
    return (height - low) / (high - low)


def test_histogram_shows_the_far_tail_beside_hundreds_of_short_edges():
    # As in a ResNet: 431 edges of distance 1, a handful of long ones.
    histogram = [(1, 431, 431 * MIB), (2, 60, 60 * MIB), (40, 1, MIB // 4),
                 (95, 2, 4 * MIB)]
    fig = plots.histogram_figure(histogram)
    edges, sizes = fig.axes
    assert edges.get_yscale() == "log" and sizes.get_yscale() == "log"
    assert edges.get_ylabel() == "edges"
    assert sizes.get_ylabel() == "bytes (MiB)"
    assert sizes.get_xlabel().startswith("distance")
    for ax, heights in ((edges, [431, 60, 1, 2]),
                        (sizes, [431, 60, 0.25, 4])):
        bars = [p.get_height() for p in ax.patches]
        assert bars == pytest.approx(heights)
        # A lone edge at distance 40 reaches at least a tenth of the way up
        # (on a linear scale: 1/431 of it).
        assert min(_visible_fraction(ax, h) for h in heights) >= 0.1
    assert edges.get_legend().get_texts()[0].get_text() == \
        "longest: 95 levels"


def test_histogram_without_sizes_has_one_panel():
    fig = plots.histogram_figure([(1, 4, 0), (3, 2, 0)])
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    assert ax.get_title() == ("Swap-candidate edges by level distance "
                              "(log scale)")


def test_every_written_figure_has_labelled_axes(tmp_path):
    planned, _, _ = planned_with_plots(tmp_path)
    histogram = [(1, 4, 0), (3, 2, 0)]
    for fits in (True, False):
        figures = plots.plot_figures(planned.without_lms, planned.with_lms,
                                     planned.budget_bytes, histogram, fits)
        names = [name for name, _ in figures]
        assert names == ["memory_without_lms.png",
                         "memory_with_lms.png" if fits
                         else "memory_smallest_plan.png",
                         "distance_histogram.png"]
        for _, fig in figures:
            assert_labelled(fig)
    title = figures[1][1].axes[0].get_title()
    assert title.startswith("Smallest LMS plan: peak") and "over the" in title


def test_plots_are_written_when_nothing_fits(tmp_path):
    from matplotlib import image
    folder = os.path.join(str(tmp_path), "failed")
    error, settings = _failed_search(folder)
    # Planning wrote nothing: the plots are the caller's.
    assert not os.path.exists(folder)
    drawn = plots.with_plots(error, settings)
    assert isinstance(drawn, autotune.AutotuneError)
    assert drawn.floor is error.floor
    message = str(drawn)
    pictures = ["memory_without_lms.png", "memory_smallest_plan.png",
                "distance_histogram.png"]
    assert sorted(os.listdir(folder)) == sorted(pictures
                                                + ["distance_histogram.tsv"])
    assert message.endswith(
        "Memory plots of the step without LMS and with the smallest plan: "
        + ", ".join(os.path.abspath(os.path.join(folder, p))
                    for p in pictures))
    assert "needs 0.003 GiB" in message  # the search's own message is kept
    for name in pictures:
        pixels = image.imread(os.path.join(folder, name))
        assert pixels.shape[:2] == (450, 800)
        assert pixels.std() > 0  # not a blank canvas


def test_no_plots_unless_asked_when_nothing_fits(tmp_path):
    folder = os.path.join(str(tmp_path), "failed")
    error, settings = _failed_search(folder)
    unasked = settings.replace(autotune_plot=False)
    assert plots.with_plots(error, unasked) is error
    assert "plots" not in str(error)
    assert not os.path.exists(folder)


def test_nothing_fits_without_matplotlib_points_to_the_histogram(
        tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    folder = str(tmp_path)
    error, settings = _failed_search(folder)
    assert str(plots.with_plots(error, settings)).endswith(
        "(No memory plots: matplotlib is missing; the distance histogram "
        "is in %s.)" % os.path.abspath(folder))
    assert os.listdir(folder) == ["distance_histogram.tsv"]
