"""Memory plots and the distance histogram."""

import builtins
import logging
import os

import pytest
import tensorflow as tf

from tflms import analysis
from tflms import autotune
from tflms import graph_index as gi
from tflms import plots
from tflms import planner
from tflms._logging import Logger

from tests.test_autotune import uneven_chain

MIB = 1 << 20


def outcome_with_plots(tmp_path):
    index, roles = uneven_chain()
    folder = os.path.join(str(tmp_path), "lms_plots")
    outcome = autotune.tune(index, roles, planner.SwapParams(-1, -1, -1, 0),
                            gpu_mem_gib=6 / 1024.0, plot_dir=folder,
                            env={autotune.MEM_RATIO_ENV: "1"}, log=Logger())
    return index, roles, folder, outcome


def test_plot_files_are_written_and_readable(tmp_path):
    image = pytest.importorskip("matplotlib.image")
    _, _, folder, outcome = outcome_with_plots(tmp_path)
    expected = ["distance_histogram.tsv", "memory_without_lms.png",
                "memory_with_lms.png", "distance_histogram.png"]
    assert [os.path.basename(p) for p in outcome.plot_files] == expected
    for name in expected[1:]:
        pixels = image.imread(os.path.join(folder, name))
        assert pixels.shape[:2] == (450, 800)  # 8 x 4.5 inches at 100 dpi


def test_histogram_counts_candidate_edges_by_distance(tmp_path):
    index, roles, folder, _ = outcome_with_plots(tmp_path)
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
    pytest.importorskip("matplotlib")
    import matplotlib  # pylint: disable=import-outside-toplevel
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
    index = gi.build_index(g)
    roles = analysis.classify_ops(index)
    from tflms import simulator  # pylint: disable=import-outside-toplevel
    result = simulator.SimulationModel(index, roles).replay(None)
    written = plots.write_plots(str(tmp_path), index, roles, result, None,
                                MIB, log=Logger())
    assert [os.path.basename(p) for p in written] == ["distance_histogram.tsv"]
    warnings = [r.getMessage() for r in caplog.records]
    assert any("pip install matplotlib" in w and "tflms[plot]" in w
               for w in warnings)
