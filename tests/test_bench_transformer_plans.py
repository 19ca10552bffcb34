"""benchmarks/transformer_plans.py: a KerasHub transformer's smallest plan
against its floor (issue 47)."""

import re

from _keras3 import needs_keras_hub, python


@needs_keras_hub
def test_a_tiny_llama_is_planned_down_to_near_its_floor():
    """``--family llama`` at two layers 64 wide (Llama's vocabulary,
    rotary embeddings, grouped-query attention and SwiGLU), planned
    without the oracle: one row with the floor and the smallest plan's
    ratio to it, and the buffers at that plan's peak are Llama's."""
    out = python("benchmarks/transformer_plans.py", "32", "--family",
                 "llama", "--layers", "2", "--heads", "2", "--hidden", "64",
                 "--intermediate", "128", "--batch", "2", "--gpu-mem",
                 "0.05", "--no-oracle", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = [line for line in out.stdout.splitlines()
              if line.startswith("| 32 |")]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1].endswith("MiB")  # the floor
    assert re.match(r"1\.\d\dx$", cells[4]), row
    assert re.search(r"simulator .*llama_causal_lm", out.stdout)
