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


@needs_keras_hub
def test_a_tiny_llama_fits_only_with_offload():
    """The tiny config, planned halfway between its two floors: every
    trainable variable's update moves (the embedding's sparse one too),
    and only the plan with offload fits."""
    out = python("benchmarks/offload_llama.py", "--config", "tiny",
                 "--json", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
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
