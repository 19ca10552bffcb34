"""benchmarks/offload_llama.py: a Keras 3 Llama planned with its AdamW
slots on the device and on the host (issue 49, item 4)."""

import json

from _keras3 import needs_keras_hub, python

from benchmarks import offload_llama as bench


def test_the_table_shows_both_columns():
    column = dict(floor=3 << 30, resident=2 << 30, budget=1 << 30,
                  fits=False, smallest=4 << 30, peak=None, host=None,
                  step_ms=None)
    offloaded = dict(column, fits=True, smallest=1 << 29, peak=1 << 29,
                     host=5 << 30, updates=147, slots=2 << 30,
                     moved=3 << 29, step_ms=2612.7, host_update_ms=2426.3,
                     gpu="V100-SXM2-16GB", link="pcie4")
    lines = bench.table(dict(config="0.25b", params=245.9e6, batch=1,
                             seq=1024, without=column,
                             **{"with": offloaded})).splitlines()
    assert lines[0].startswith("| Llama 0.25b (245.9M parameters, AdamW), "
                               "batch 1, sequence 1024, budget 1.00 GiB |")
    assert "| fits the budget | no plan fits | yes |" in lines
    assert "| slots on the host / updates moved | 0 / 0 | 2.00 GiB / 147 |" \
        in lines
    assert "| predicted step (ms, V100-SXM2-16GB, pcie4) | - | 2613 |" \
        in lines


def _check_only_the_plan_with_offload_fits(out):
    """The tiny config, planned halfway between its two floors: every
    trainable variable's update moves (the embedding's sparse one too),
    and only the plan with offload fits."""
    row = json.loads(out.stdout.splitlines()[0])
    without, offloaded = row["without"], row["with"]
    assert offloaded["left"] == []
    assert offloaded["updates"] == 21  # 2 layers of 9, embeddings, norm
    assert offloaded["floor"] < without["floor"]
    assert without["resident"] - offloaded["resident"] == \
        offloaded["slots"]
    assert not without["fits"] and offloaded["fits"]
    assert offloaded["peak"] <= offloaded["budget"]
    assert offloaded["host"] >= offloaded["slots"]
    assert "| fits the budget | no plan fits | yes |" in out.stdout


def test_the_oracle_table_shows_both_columns():
    from benchmarks import offload_llama_oracle as oracle_bench
    measured = dict(planned_gpu_mem=4.0, simulator=3 << 30,
                    oracle=int(3.5 * (1 << 30)), oracle_variables=2 << 30,
                    oracle_variable_count=300, host_variables=0,
                    host_variable_count=0)
    offloaded = dict(measured, fits=True, planned_gpu_mem=3.0,
                     oracle=int(2.5 * (1 << 30)),
                     oracle_variables=1 << 29, oracle_variable_count=153,
                     host_variables=1 << 30, host_variable_count=294)
    without = dict(fits=False, smallest=int(3.25 * (1 << 30)),
                   tried=[4.0], smallest_plan=measured)
    lines = oracle_bench.table(dict(
        config="0.25b", batch=1, seq=1024, gpu_mem=3.0,
        oracle={"without": without, "with": offloaded})).splitlines()
    assert lines[0].startswith("| Llama 0.25b, batch 1, sequence 1024, "
                               "rewritten (lms.function), 3.00 GiB GPU |")
    assert "| plan at the budget | no plan fits (smallest 3.25 GiB) | " \
        "fits |" in lines
    assert "| plan measured: planned for | 4.00 GiB | 3.00 GiB |" in lines
    assert "| oracle's device peak (runtime replay) | 3.50 GiB | " \
        "2.50 GiB |" in lines
    assert "| variables on the oracle's host | 0 | 1.00 GiB (294) |" \
        in lines
    assert "| oracle's peak within the 3.00 GiB GPU | no | yes |" in lines


@needs_keras_hub
def test_the_oracle_measures_the_tiny_llama_rewritten():
    """``--oracle`` on the tiny config: the simulator's plans (only the
    one with offload fits: `_check_only_the_plan_with_offload_fits`),
    then the step rewritten by lms.function on a CPU split in two, the
    oracle's replay with the weights on its GPU and every slot on its
    host; without offload no plan fits the budget, and the plan at the
    budget the smallest needs is over it in the oracle's replay too."""
    out = python("benchmarks/offload_llama.py", "--config", "tiny",
                 "--oracle", "--json", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    # The simulator's plans, which --oracle makes first (one run for both:
    # CI's time).
    _check_only_the_plan_with_offload_fits(out)
    row = json.loads(out.stdout.splitlines()[0])
    without, offloaded = row["oracle"]["without"], row["oracle"]["with"]
    gpu = row["gpu_mem"] * (1 << 30)
    assert offloaded["fits"] and offloaded["updates"] == 21
    assert offloaded["host_variables"] == row["with"]["slots"]
    assert offloaded["oracle_variables"] - row["with"]["weights"] < 64
    assert offloaded["oracle"] <= gpu
    assert not without["fits"] and without["smallest"] > gpu
    smallest = without["smallest_plan"]
    assert smallest["host_variables"] == 0
    assert smallest["oracle_variables"] == offloaded["oracle_variables"] + \
        offloaded["host_variables"]
    assert smallest["oracle"] > gpu
