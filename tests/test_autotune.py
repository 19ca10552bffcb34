"""Auto-tuning: budgets, the parameter search, tensor selection, LMS."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from tflms.tf import reader as tf_reader
from tflms import LMS
from tflms import analysis
from tflms import autotune
from tflms import budget
from tflms import graph_index as gi
from tflms import planner
from tflms import simulator
from tflms import steptime
from tflms._logging import Logger
from tflms.autotune import choice, search, selection

from tests import _graphs

MIB = 1 << 20
EXACT = {autotune.MEM_RATIO_ENV: "1"}  # budget == autotune_gpu_mem exactly
AUTO = planner.SwapParams(-1, -1, -1, 0)


def uneven_chain():
    """f1 (0.5 MiB) .. f6 (1 MiB each) forward, mirrored backward.

    Without LMS the peak is 6.5 MiB + 16 bytes of Consts at levels 7-8.
    Thresholds must swap the far, small f1 before the nearer, larger f2.

    The backward ops are Softsign and SoftplusGrad, which `tflms.inplace`
    does not write in place: each g is a buffer of its own, as the budgets
    and parameters below were derived. (With cos and multiplications, g6
    would write into f6 and each g into the one before: the peak would be
    5.5 MiB and these budgets would need no swapping.) Only f1 writes into
    x's buffer, which x, read by f1 alone, leaves at level 1 in any case.
    """
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [256, 512], name="x")
        f1 = tf.math.sin(x, name="f1")
        f = [x, f1, tf.concat([f1, f1], 0, name="f2")]
        for i in range(3, 7):
            f.append(tf.math.sin(f[-1], name="f%d" % i))
        grad = tf.nn.softsign(f[6], name="g6")
        for i in range(5, 1, -1):
            grad = tf.raw_ops.SoftplusGrad(gradients=grad, features=f[i],
                                           name="g%d" % i)
        tf.raw_ops.SoftplusGrad(gradients=grad[:256], features=f1, name="g1")
    index = tf_reader.build_index(g)
    return index, analysis.classify_ops(index)


def tune(index, roles, mib, requested=AUTO, **kwargs):
    """`autotune.tune` for `mib` MiB exactly; copies count as instant unless
    an `interconnect` is given, and the final choice is by bytes moved
    unless `by_step_time` is (these tests pin the search's own choices;
    the copy-time and step-time tests below pass them)."""
    kwargs.setdefault("interconnect", "instant")
    kwargs.setdefault("by_step_time", False)
    return _graphs.tune(index, roles, requested, gpu_mem_gib=mib / 1024.0,
                        env=EXACT, log=Logger(), **kwargs)


def names(index, tensors):
    return sorted(index.names[p] for p, _ in tensors)


class FakeDevice:
    def __init__(self, name, device_type, memory_limit):
        self.name, self.device_type = name, device_type
        self.memory_limit = memory_limit



def test_tune_without_gpu_or_budget_is_an_error(monkeypatch):
    # Through tune() itself, on a machine that shows no GPU (a GPU machine
    # is made to look like one, so the check runs everywhere).
    monkeypatch.setattr(budget, "_list_local_devices", lambda: [
        FakeDevice("/device:CPU:0", "CPU", 1 << 34)])
    index, roles = uneven_chain()
    with pytest.raises(autotune.NoGpuError):
        _graphs.tune(index, roles, AUTO, log=Logger())


# ---- the search ------------------------------------------------------------
def test_fits_without_lms_returns_none():
    index, roles = uneven_chain()
    outcome = tune(index, roles, 7)
    assert outcome.params is None and outcome.only_tensors is None
    assert outcome.budget_bytes == 7 * MIB
    assert outcome.without_lms.peak_device_bytes == 6 * MIB + MIB // 2 + 16


def test_search_finds_parameters_that_fit_and_logs_them(caplog):
    index, roles = uneven_chain()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    logging.getLogger("tensorflow").propagate = True
    caplog.set_level(logging.INFO, logger="tensorflow")
    outcome = tune(index, roles, 6, select=False)
    assert outcome.params == planner.SwapParams(8, 14, 14, 0)
    assert outcome.with_lms.peak_device_bytes == 5 * MIB + 16
    found = [r.getMessage() for r in caplog.records
             if "[Simulator] Found a parameter set" in r.getMessage()]
    assert found[0].endswith("[LMS][0] [Simulator] Found a parameter set: "
                             "swapout_threshold 1, swapin_ahead 1, "
                             "swapin_groupby 0, sync_mode 0")
    assert found[-1].endswith("swapout_threshold 8, swapin_ahead 14, "
                              "swapin_groupby 14, sync_mode 0")


def test_sync_mode_escalates_when_async_cannot_fit():
    index, roles = uneven_chain()
    outcome = tune(index, roles, 4, select=False)
    # Asynchronous swap-ins keep a device copy one level before its reader;
    # only synchronous swap-ins (sync_mode 2) fit 4 MiB.
    assert outcome.params == planner.SwapParams(4, 1, 0, 2)
    assert outcome.with_lms.peak_device_bytes <= 4 * MIB


def test_escalation_stops_at_the_first_sync_mode_that_fits():
    class Sims:
        budget = 10
        smallest = (11, planner.SwapParams(1, 1, 0, 3))

        def __init__(self):
            self.seen = []

        def play(self, params):
            self.seen.append(params)
            return params.sync_mode >= 1 and params.swapout_threshold <= 3

    sims = Sims()
    found = search.search(sims, AUTO, 8, Logger())
    assert found.sync_mode == 1 and found.swapout_threshold == 3
    assert {p.sync_mode for p in sims.seen} == {0, 1}


def test_nothing_fits_reports_the_miss():
    index, roles = uneven_chain()
    with pytest.raises(autotune.AutotuneError) as err:
        tune(index, roles, 2)
    model = simulator.SimulationModel(index, roles)
    plan = planner.make_plan(index, roles, planner.SwapParams(1, 1, 0, 2))
    smallest = model.replay(plan).peak_device_bytes
    assert smallest == 3 * MIB + 16
    message = str(err.value)
    assert "fits in 0.002 GiB (2.0 MiB)" in message
    assert "needs 0.003 GiB (3.0 MiB), 0.001 GiB (1.0 MiB, %d bytes) too " \
        "much" % (smallest - 2 * MIB) in message
    # The plan it names is the one whose replay gave that peak.
    assert "the smallest plan it found (swapout_threshold 1, swapin_ahead " \
        "1, swapin_groupby 0, sync_mode 2) needs 0.003 GiB" in message
    for hint in ("smaller batch size", "serialization", "autotune_gpu_mem"):
        assert hint in message
    # It searched every sync mode, so it does not suggest one.
    assert "(searched sync_modes 0 to 3)" in message
    assert "sync_mode=" not in message


def test_no_fit_from_sync_mode_3_says_so():
    index, roles = uneven_chain()
    with pytest.raises(autotune.AutotuneError) as err:
        tune(index, roles, 2, planner.SwapParams(-1, -1, -1, 3))
    message = str(err.value)
    assert "(searched sync_mode 3)" in message
    assert "sync_mode 3) needs" in message and "sync_mode=" not in message


def test_user_set_parameters_are_kept():
    index, roles = uneven_chain()
    outcome = tune(index, roles, 6, planner.SwapParams(6, -1, -1, 0))
    assert outcome.params.swapout_threshold == 6
    assert outcome.only_tensors is None  # no selection with a fixed threshold
    outcome = tune(index, roles, 6, planner.SwapParams(-1, 2, -1, 0),
                   select=False)
    assert outcome.params.swapin_ahead == 2
    assert outcome.params.swapout_threshold == 8
    outcome = tune(index, roles, 6, planner.SwapParams(-1, -1, 3, 0),
                   select=False)
    assert outcome.params.swapin_groupby == 3


def test_selection_moves_fewer_bytes_than_the_threshold_alone():
    index, roles = uneven_chain()
    outcome = tune(index, roles, 6)
    # The threshold must take f1 (0.5 MiB, farthest) and f2 (1 MiB);
    # f2 alone is enough.
    assert outcome.threshold_only.swapout_bytes == MIB + MIB // 2
    assert names(index, outcome.only_tensors) == ["f2"]
    assert outcome.with_lms.swapout_bytes == MIB
    assert outcome.with_lms.swapout_bytes <= \
        outcome.threshold_only.swapout_bytes
    assert outcome.with_lms.peak_device_bytes <= outcome.budget_bytes
    # LMS re-plans with only_tensors: the same swaps come out.
    plan = planner.make_plan(index, roles, outcome.params,
                             only_tensors=outcome.only_tensors)
    assert names(index, ((s.producer, s.output) for s in plan.swaps)) == ["f2"]


@pytest.mark.parametrize("mib", [6.5, 6, 5.5, 5, 4.5, 4, 3.5])
def test_selection_never_moves_more_and_always_fits(mib):
    index, roles = uneven_chain()
    chosen = tune(index, roles, mib)
    alone = tune(index, roles, mib, select=False)
    assert chosen.with_lms.swapout_bytes <= alone.with_lms.swapout_bytes
    assert chosen.with_lms.peak_device_bytes <= mib * MIB
    model = simulator.SimulationModel(index, roles)
    plan = planner.make_plan(index, roles, chosen.params,
                             only_tensors=chosen.only_tensors)
    assert model.replay(plan).peak_device_bytes <= mib * MIB


def test_missing_batch_size_through_tune():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 512], name="x")
        tf.math.sin(x, name="y")
    index = tf_reader.build_index(g)
    with pytest.raises(simulator.BatchSizeError, match="lms.batch_size"):
        tune(index, analysis.classify_ops(index), 1)


# ---- end to end ------------------------------------------------------------
def test_lms_autotunes_and_the_graph_still_trains(monkeypatch, lms_log):
    monkeypatch.setenv(autotune.MEM_RATIO_ENV, "1")
    batch = 64
    graph, handles = _graphs.dense_net(depth=6, width=512, batch=None)
    index = tf_reader.build_index(graph)
    roles = analysis.classify_ops(index)
    model = simulator.SimulationModel(index, roles, batch_size=batch)
    without = model.replay(None).peak_device_bytes
    most = model.replay(planner.make_plan(
        index, roles, planner.SwapParams(1, 1, 0, 0), batch_size=batch))
    assert most.peak_device_bytes < without
    budget = (without + most.peak_device_bytes) // 2

    lms = LMS()
    lms.batch_size = batch
    lms.autotune_gpu_mem = budget / float(1 << 30)
    result = lms.run(graph)
    assert result is not None and result.swapout_ops
    lines = lms_log()
    assert any("[Simulator] Found a parameter set: swapout_threshold" in line
               for line in lines)
    feed = {handles["x"]: np.random.RandomState(0).randn(batch, 32).astype(
        np.float32), handles["y"]: np.eye(10, dtype=np.float32)[
            np.arange(batch) % 10]}
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(handles["init"])
        losses = [sess.run([handles["loss"], handles["train"]], feed)[0]
                  for _ in range(2)]
    assert all(np.isfinite(losses))


# ---- never worse than no LMS ---------------------------------------------
def test_nothing_fits_states_both_peaks():
    index, roles = uneven_chain()
    with pytest.raises(autotune.AutotuneError) as err:
        tune(index, roles, 2)
    message = str(err.value)
    assert "Without LMS one step needs 0.006 GiB (6.5 MiB)" in message
    assert "smallest plan it found (swapout_threshold 1, swapin_ahead 1, " \
        "swapin_groupby 0, sync_mode 2) needs 0.003 GiB (3.0 MiB)" in message
    assert "No plan lowers" not in message
    assert "serialization (lms.serialization or serialization_by_size)" \
        in message


def test_nothing_fits_does_not_advise_the_serialization_already_on():
    index, roles = uneven_chain()
    with pytest.raises(autotune.AutotuneError) as err:
        tune(index, roles, 2, serialization=[3])
    message = str(err.value)
    assert "serializing more levels (this search ran with serialization " \
        "on)" in message
    assert "lms.serialization or serialization_by_size" not in message


def test_nothing_fits_says_when_swapping_cannot_lower_the_peak():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        # b reads x too, so a (x's last reader otherwise) cannot write into
        # x's buffer: x and a are both live at level 1.
        tf.math.multiply(tf.math.sin(x, name="a"), x, name="b")
    index = tf_reader.build_index(g)
    with pytest.raises(autotune.AutotuneError) as err:
        tune(index, analysis.classify_ops(index), 1)
    message = str(err.value)
    # No tensor is read far from where it is made: every plan is empty.
    assert "needs 0.002 GiB (2.0 MiB)" in message
    assert "Without LMS one step needs 0.002 GiB (2.0 MiB). No plan lowers " \
        "that peak: what is live at it (level 1, a) is needed right then." \
        in message


def far_reader_graph():
    """f (1 MiB) is read by g far away and by h, which LMS must not reroute
    (excluded sink), at the same far level: swapping f only adds a copy
    (g, a matrix product, never writes its output into it)."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        f = tf.math.sin(x, name="f")
        h = f
        for i in range(6):
            h = tf.math.sin(h, name="c%d" % i)
        tf.linalg.matmul(h, f, name="g")
        tf.math.add(h, f, name="h")
    index = tf_reader.build_index(g)
    roles = analysis.classify_ops(
        index, filters={"excl_sinks": frozenset({index.id_of["h"]})})
    return index, roles


def test_a_plan_worse_than_no_lms_is_never_chosen():
    index, roles = far_reader_graph()
    model = simulator.SimulationModel(index, roles)
    without = model.replay(None).peak_device_bytes
    requested = planner.SwapParams(1, -1, -1, 0)
    plan = planner.make_plan(index, roles, planner.SwapParams(1, 1, 0, 0))
    assert [index.names[s.producer] for s in plan.swaps] == ["f"]
    assert model.replay(plan).peak_device_bytes > without
    # The step fits, but the user fixed the threshold, so tuning runs; the
    # only plans add a copy of f on top of f itself, so LMS stays off.
    outcome = tune(index, roles, without / MIB + 1, requested)
    assert outcome.params is None and outcome.with_lms is None
    assert outcome.without_lms.peak_device_bytes == without


@pytest.mark.parametrize("seed", range(30))
def test_greedy_cover_covers_what_can_be_covered_without_waste(seed):
    """The tensor selection's cover step on random instances: the picks
    free at every level as much of the need as all candidates together
    could, and none of them can be dropped without losing that."""
    rng = np.random.RandomState(seed)
    levels = rng.randint(5, 60)
    rows = rng.randint(1, 25)
    need = rng.randint(-3, 40, size=levels).astype(np.float64)
    sizes = rng.randint(0, 15, size=rows).astype(np.float64)
    moved = sizes * rng.randint(2, 4, size=rows)
    cover = []
    for _ in range(rows):
        ranges, cursor = [], rng.randint(0, levels)
        while cursor < levels and rng.rand() < 0.7:
            end = min(levels, cursor + rng.randint(1, 10))
            ranges.append((cursor, end))
            cursor = end + rng.randint(1, 6)
        cover.append(ranges)

    def freed_by(picks):
        freed = np.zeros(levels)
        for i in picks:
            for lo, hi in cover[i]:
                freed[lo:hi] += sizes[i]
        return freed

    picked = selection._greedy_cover(cover, sizes, moved, need)
    assert len(set(picked)) == len(picked)
    target = np.minimum(np.maximum(need, 0), freed_by(range(rows)))
    assert np.all(freed_by(picked) >= target)
    for i in picked:
        rest = [j for j in picked if j != i]
        assert not np.all(freed_by(rest) >= target), (i, picked)


def _plain_greedy_cover(cover, sizes, moved, need):
    """The cover step written plainly, one numpy slice per range: what
    `selection._greedy_cover` must pick, however it gets there."""
    need = np.maximum(need, 0)
    gain = np.array([sum(float(np.minimum(need[lo:hi], sizes[i]).sum())
                         for lo, hi in cover[i])
                     for i in range(len(cover))], dtype=np.float64)
    score = gain / np.maximum(moved, 1)
    order = np.lexsort((np.arange(len(sizes)), sizes, -score))
    remaining = need.copy()
    picked = []
    for i in order:
        if gain[i] <= 0 or not np.any(remaining > 0):
            break
        if not any((remaining[lo:hi] > 0).any() for lo, hi in cover[i]):
            continue
        picked.append(int(i))
        for lo, hi in cover[i]:
            remaining[lo:hi] -= sizes[i]
    freed = np.zeros(len(need))
    for i in picked:
        for lo, hi in cover[i]:
            freed[lo:hi] += sizes[i]
    target = np.minimum(need, freed)
    for i in sorted(picked, key=lambda r: (-moved[r], r)):
        if all(np.all(freed[lo:hi] - sizes[i] >= target[lo:hi])
               for lo, hi in cover[i]):
            for lo, hi in cover[i]:
                freed[lo:hi] -= sizes[i]
            picked.remove(i)
    return picked


@pytest.mark.parametrize("seed", range(40))
def test_greedy_cover_picks_what_the_plain_version_picks(seed):
    """Long ranges over many levels (the block structure's partial and
    whole blocks) and few distinct sizes (shared prefix sums)."""
    rng = np.random.RandomState(seed)
    levels = rng.randint(1, 700)
    rows = rng.randint(1, 80)
    need = rng.randint(-50, 400, size=levels).astype(np.float64)
    sizes = rng.choice([0, 7, 30, 64, 100], size=rows).astype(np.float64)
    moved = sizes * rng.randint(2, 4, size=rows)
    cover = []
    for _ in range(rows):
        ranges, cursor = [], rng.randint(0, levels)
        while cursor < levels and rng.rand() < 0.8:
            end = min(levels, cursor + rng.randint(1, 300))
            ranges.append((cursor, end))
            cursor = end + rng.randint(1, 40)
        cover.append(ranges)
    assert (selection._greedy_cover(cover, sizes, moved, need)
            == _plain_greedy_cover(cover, sizes, moved, need))


def test_block_max_matches_an_array():
    rng = np.random.RandomState(0)
    for n in (1, 15, 16, 17, 300, 1000):
        values = rng.randint(-100, 100, size=n).astype(np.int64)
        blocks = selection._BlockMax(values)
        for _ in range(300):
            lo = rng.randint(0, n + 1)
            hi = rng.randint(lo, n + 1)
            if rng.rand() < 0.5:
                amount = int(rng.randint(-50, 50))
                blocks.add(lo, hi, amount)
                values[lo:hi] += amount
            elif lo < hi:
                assert blocks.max(lo, hi) == values[lo:hi].max()
            assert blocks.top() == values.max()


# ---- search cost bounds ----------------------------------------------------
@pytest.mark.parametrize("largest", [1, 2, 37, 500, 999, 1000])
def test_largest_passing_is_exact_at_resolution_one(largest):
    assert search._largest_passing(lambda v: v <= largest, 1, 1000) \
        == largest


@pytest.mark.parametrize("resolution", [2, 7, 75])
@pytest.mark.parametrize("largest", [1, 5, 400, 77000])
def test_largest_passing_stops_within_its_resolution(resolution, largest):
    probes = []

    def passes(v):
        probes.append(v)
        return v <= largest

    found = search._largest_passing(passes, 1, 77000, resolution)
    assert largest - resolution < found <= largest
    # Only a value seen to pass is returned: the known good start (1) or a
    # probe that passed.
    assert found in {1} | {v for v in probes if v <= largest}
    # Binary search down to `resolution` values: log2(77000 / resolution)
    # probes, plus one.
    assert len(probes) <= int(np.log2(77000 / resolution)) + 2


def test_search_resolution_is_exact_for_graphs_up_to_1024_levels():
    assert search._search_resolution(1) == 1
    assert search._search_resolution(1024) == 1
    assert search._search_resolution(2047) == 1
    assert search._search_resolution(2048) == 2
    assert search._search_resolution(76925) == 75


def test_selection_pools_halve_then_are_bounded():
    assert selection._selection_thresholds(333) == [
        333, 166, 83, 41, 20, 10, 5, 2, 1]
    assert selection._selection_thresholds(512) == [
        512, 256, 128, 64, 32, 16, 8, 4, 2, 1]
    big = selection._selection_thresholds(38440)
    assert len(big) == selection._SELECTION_POOLS
    assert big[0] == 38440 and big[-1] == 1
    assert big == sorted(set(big), reverse=True)
    # Evenly spaced on a log scale: neighbours differ by about 38440^(1/9).
    ratios = [a / b for a, b in zip(big, big[1:])]
    assert all(2.5 < r < 4.5 for r in ratios), ratios


def test_prune_replays_only_removals_the_estimates_allow():
    index, roles = uneven_chain()
    model = simulator.SimulationModel(index, roles)
    plan = planner.make_plan(index, roles, planner.SwapParams(1, 1, 0, 0))
    budget = 6 * MIB
    result = model.replay(plan, detail=False)
    assert result.fits(budget) and len(plan.swaps) > 1
    replayed = []

    def replay(p):
        replayed.append(len(p.swaps))
        return model.replay(p, detail=False)

    gated, gated_result = selection.prune_swaps(plan, budget, replay, result,
                                               model=model)
    gated_replays = len(replayed)
    del replayed[:]
    full, _ = selection.prune_swaps(plan, budget, replay, result)
    assert gated_result.fits(budget)
    # The same swaps survive, with fewer replays: removing the one that is
    # needed would put the peak over the budget by the estimates, so it is
    # never tried.
    assert full.swaps and len(full.swaps) < len(plan.swaps)
    assert names(index, ((s.producer, s.output) for s in gated.swaps)) \
        == names(index, ((s.producer, s.output) for s in full.swaps))
    assert gated_replays < len(replayed) == len(plan.swaps)


# ---- copies that take time -------------------------------------------------
def test_the_tuned_plan_fits_with_its_copies_timed():
    """At 6 MiB the search swaps f2 (1 MiB, made at level 2) with
    asynchronous copies, peaking at 5.5 MiB + 16 bytes at level 7 with
    instant copies. On a V100 over PCIe 4.0 its copy to the host takes
    1 MiB / 31.5 GB/s = 33.3 us, while levels 3-7 start within 29.3 us of
    its start: f2 stays on the device through level 7, one MiB more at the
    peak, over the budget. The tuner then asks for synchronous swap-outs
    (f2's remaining reader waits for the copy), which fit. NVLink-C2C
    copies it in 2.3 us, within level 3: the asynchronous plan is kept."""
    index, roles = uneven_chain()
    budget = 6 * MIB
    instant = tune(index, roles, 6)
    assert instant.params == planner.SwapParams(8, 14, 14, 0)
    assert [index.names[s.producer] for s in instant.plan.swaps] == ["f2"]
    assert instant.with_lms.peak_device_bytes == 5 * MIB + MIB // 2 + 16
    memory = simulator.SimulationModel(index, roles)
    pcie4 = steptime.StepTimeModel(index, roles, interconnect="pcie4")
    late, step = steptime.replay_in_time(memory, pcie4, instant.plan)
    assert steptime.copy_levels(step).held_through == (7,)
    assert late.peak_device_bytes == 6 * MIB + MIB // 2 + 16 > budget
    assert late.peak_level == 7 and ("f2:0", MIB) in late.live_at_peak

    timed = tune(index, roles, 6, interconnect="pcie4")
    assert timed.params == planner.SwapParams(8, 14, 14, 1)
    assert timed.with_lms.peak_device_bytes == 5 * MIB + MIB // 2 + 16
    again, _ = steptime.replay_in_time(memory, pcie4, timed.plan)
    assert again.peak_device_bytes == timed.with_lms.peak_device_bytes

    fast = tune(index, roles, 6, interconnect="nvlink-c2c")
    assert fast.params == instant.params and fast.plan == instant.plan
    assert fast.with_lms.peak_device_bytes == \
        instant.with_lms.peak_device_bytes


def test_the_search_again_is_logged(caplog):
    index, roles = uneven_chain()
    logging.getLogger("tensorflow").propagate = True
    with caplog.at_level(logging.INFO, logger="tensorflow"):
        tune(index, roles, 6, interconnect="pcie4")
    assert ("[Simulator] With copies timed at PCIe 4.0 x16 the plan peaks "
            "at 0.006 GiB, over the 0.006 GiB budget; searching again for "
            "0.005 GiB with instant copies") in caplog.text
    assert ("over the 0.006 GiB budget; searching again with sync_mode 1"
            in caplog.text)


def test_no_plan_fitting_in_time_names_the_link_and_the_fixes(monkeypatch):
    # Without a second search, the asynchronous plan above is the last.
    monkeypatch.setattr(choice, "_TIME_ROUNDS", 0)
    index, roles = uneven_chain()
    with pytest.raises(autotune.AutotuneError, match=(
            r"^LMS auto-tuning found no plan that fits in 0\.006 GiB "
            r"\(6\.0 MiB\) once its copies take the time they take at "
            r"interconnect='pcie4' \(PCIe 4\.0 x16\): the last plan found "
            r"peaks at 0\.006 GiB \(6\.5 MiB\) with them, because swapped "
            r"tensors stay on the device until their copy to the host has "
            r"finished\. Use the interconnect this machine has \(a faster "
            r"one finishes copies sooner\), sync_mode=1 or 3 \(operations "
            r"wait for the swap-outs\), a smaller batch size, a larger "
            r"lms\.autotune_gpu_mem, or interconnect='instant' to plan as if "
            r"copies took no time\. No plan can go below 3\.0 MiB: g5 "
            r"\(SoftplusGrad\) needs its inputs \(2\.0 MiB\) and outputs "
            r"\(1\.0 MiB\) on the device at once, plus 16 bytes of "
            r"variables, optimizer slots and constants that stay there; "
            r"kernel workspace not counted\.$")):
        tune(index, roles, 6, interconnect="pcie4")


# ---- the final choice by predicted step time -------------------------------
# Round hardware (as in test_steptime): memory and FLOP/s at 1000 per second,
# a link of 1000 bytes/s, no launch overhead; every time below is exact.
ROUND_GPU = steptime.Gpu("round-gpu", fp32_flops=1000.0, tensor_flops=1000.0,
                         half_flops=1000.0, memory_bandwidth=1000.0,
                         memory_bytes=1 << 20, source="a round test device")
ROUND_LINK = steptime.Interconnect("round-link", "round link", 1000.0,
                                   "a round test link")


def hidden_or_exposed_graph():
    """x -> a -> b (500 B) -> c (2000 B) -> m1 -> m2 -> d(a, m2) -> e(b, d).

    Tensors 1000 bytes unless noted. m1 and m2 are 10 s matrix products;
    a, b, c, d, e take 2, 1.5, 2.5, 3, 2.5 s: the step without LMS takes
    31.5 s and peaks at m1 (a, b, c, m1: 4500 bytes).
    Swapping a until d (swap-in started by m1) frees 1000 bytes at m1 and
    hides its copy behind m2: 2000 bytes moved, no time lost.
    Swapping b until e (started by d) frees 500 bytes there, but e waits
    0.5 s for its copy: 1000 bytes moved, 32 s.
    """
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [1000]}),
         ("a", "Relu", {"outputs": [1000]}),
         ("b", "Relu", {"outputs": [500]}),
         ("c", "Relu", {"outputs": [2000]}),
         ("m1", "MatMul", {"outputs": [1000], "flops": 10000}),
         ("m2", "MatMul", {"outputs": [1000], "flops": 10000}),
         ("d", "AddV2", {"outputs": [1000]}),
         ("e", "AddV2", {"outputs": [1000]})],
        edges=[("x", "a"), ("a", "b"), ("b", "c"), ("c", "m1"),
               ("m1", "m2"), ("a", "d"), ("m2", "d"), ("b", "e"),
               ("d", "e")])
    return index, analysis.classify_ops(index)


def _one_swap(index, tensor, reader, trigger, nbytes):
    i = index.id_of
    return planner.SwapPlan(
        producer=i[tensor], output=0, nbytes=nbytes,
        swap_ins=(planner.SwapInPlan(consumers=((i[reader], 0),),
                                     triggers=(i[trigger],),
                                     synchronous=False),),
        waiters=())


def _candidates(index):
    def plan(*swaps):
        return planner.Plan(params=planner.SwapParams(1, 1, 0, 0),
                            swaps=swaps, serialization_edges=(),
                            num_levels=index.num_levels)
    return {"none": plan(),
            "a": plan(_one_swap(index, "a", "d", "m1", 1000)),
            "b": plan(_one_swap(index, "b", "e", "d", 500))}


def _choose(index, roles, budget, order):
    plans = _candidates(index)
    timer = steptime.StepTimeModel(index, roles, gpu=ROUND_GPU,
                                   interconnect=ROUND_LINK,
                                   kernels=steptime.KernelOptions(
                                       launch_overhead_s=0.0))
    model = simulator.SimulationModel(index, roles)
    offered = [(plans[name].params, plans[name], None, None)
               for name in order]
    (_, chosen, _), step = choice._fastest(
        offered, timer, lambda p: model.replay(p, detail=False), budget,
        Logger())
    return next(k for k, p in plans.items() if p is chosen), step


def test_final_choice_takes_the_faster_plan_not_the_one_moving_less():
    index, roles = hidden_or_exposed_graph()
    model = simulator.SimulationModel(index, roles)
    plans = _candidates(index)
    assert [model.replay(plans[k]).peak_device_bytes
            for k in ("none", "a", "b")] == [4500, 3500, 4000]
    # At 4000 bytes both swaps fit; b moves half the bytes, a is faster.
    for order in (("b", "a"), ("a", "b"), ("none", "b", "a")):
        name, step = _choose(index, roles, 4000, order)
        assert name == "a"
        assert step.with_lms_s == 31.5 and step.without_lms_s == 31.5
        assert step.exposed_transfer_s == 0
    timer = steptime.StepTimeModel(index, roles, gpu=ROUND_GPU,
                                   interconnect=ROUND_LINK,
                                   kernels=steptime.KernelOptions(
                                       launch_overhead_s=0.0))
    result_b = model.replay(plans["b"])
    assert timer.predict(plans["b"], result_b.levels,
                         result_b.num_levels).with_lms_s == 32.0


def test_final_choice_breaks_equal_times_by_bytes_moved():
    index, roles = hidden_or_exposed_graph()
    # At 4500 bytes the step fits without swaps: as fast as swapping a,
    # and nothing moved.
    name, step = _choose(index, roles, 4500, ("a", "b", "none"))
    assert name == "none" and step.with_lms_s == 31.5


def test_final_choice_never_returns_a_plan_over_the_budget():
    index, roles = hidden_or_exposed_graph()
    # At 3999 bytes only a fits, however the others are timed.
    assert _choose(index, roles, 3999, ("none", "b", "a"))[0] == "a"
    with pytest.raises(autotune.AutotuneError,
                       match=r"none of the 2 plans offered for the final "
                             r"choice fits the budget of 0\.000 GiB \(0\.0 "
                             r"MiB\)"):
        _choose(index, roles, 3499, ("none", "b"))


def test_tune_by_step_time_returns_the_fastest_fitting_plan():
    index, roles = hidden_or_exposed_graph()
    budget_mib = 4000 / MIB
    # By bytes: the selection swaps b alone (1000 bytes moved); e waits
    # 0.5 s for it. By time: the threshold plan at the search's first
    # swapin_ahead (1) also swaps a, and brings b back one level earlier
    # (started by m2): nothing waits. Seven ops launch a kernel.
    by_bytes = tune(index, roles, budget_mib)
    by_time = tune(index, roles, budget_mib, gpu=ROUND_GPU,
                   interconnect=ROUND_LINK, by_step_time=True)
    assert by_bytes.step_time is None and by_bytes.timed_plans == 0
    assert names(index, by_bytes.only_tensors) == ["b"]
    assert by_time.only_tensors is None
    assert by_time.params == planner.SwapParams(4, 1, 0, 0)
    assert names(index, [(s.producer, 0) for s in by_time.plan.swaps]) == [
        "a", "b"]
    # a writes into x's buffer and d into a's swap-in copy, e into d: the
    # peak is c and m1 at m1 (as m1, m2 and a's copy at m2), 3000 bytes.
    assert by_time.with_lms.peak_device_bytes == 3000
    assert by_time.with_lms.fits(4000)
    overhead = 7 * steptime.LAUNCH_OVERHEAD_S
    step = by_time.step_time
    assert step.with_lms_s == pytest.approx(31.5 + overhead, abs=1e-12)
    assert step.exposed_transfer_s == pytest.approx(0.0, abs=1e-12)
    # The four fitting plans the search ended with: the threshold plan at
    # its largest swapin_ahead and groupby (8, 8), before groupby (8, 0),
    # at the first ahead (1, 0), and the selection.
    assert by_time.timed_plans == 4
    timer = steptime.StepTimeModel(index, roles, gpu=ROUND_GPU,
                                   interconnect=ROUND_LINK)
    old = timer.predict(by_bytes.plan, by_bytes.with_lms.levels,
                        by_bytes.with_lms.num_levels)
    assert old.with_lms_s == pytest.approx(32.0 + overhead, abs=1e-12)


def test_a_plan_chosen_by_step_time_is_checked_with_its_copies_timed(caplog):
    """At 6 MiB over PCIe 4.0 the fastest fitting plan with instant copies
    holds its swapped tensors on the device while they are copied and
    peaks over the budget: the tuner searches again (as for any plan) and
    returns one that fits with its copies timed, still chosen by time."""
    index, roles = uneven_chain()
    budget = 6 * MIB
    logging.getLogger("tensorflow").propagate = True
    with caplog.at_level(logging.INFO, logger="tensorflow"):
        timed = tune(index, roles, 6, interconnect="pcie4", by_step_time=True)
    assert "Chose the fastest of" in caplog.text
    assert ("over the 0.006 GiB budget; searching again" in caplog.text)
    assert timed.step_time is not None and timed.timed_plans > 0
    memory = simulator.SimulationModel(index, roles)
    pcie4 = steptime.StepTimeModel(index, roles, interconnect="pcie4")
    again, step = steptime.replay_in_time(memory, pcie4, timed.plan)
    assert again.peak_device_bytes == timed.with_lms.peak_device_bytes
    assert again.fits(budget)
    assert step.with_lms_s == timed.step_time.with_lms_s
    # With instant copies the choice is by bytes moved and nothing is timed.
    instant = tune(index, roles, 6, by_step_time=True)
    assert instant.step_time is None and instant.timed_plans == 0
