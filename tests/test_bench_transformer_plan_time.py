"""benchmarks/transformer_plan_time.py: the CPU seconds of tracing,
indexing and planning KerasHub's transformers, and the costliest stage."""

import re

from _keras3 import needs_keras_hub, python

from benchmarks import transformer_plan_time as bench
from tflms import stages

STAGE_NAMES = ["context"] + [s.name for s in stages.STAGES]


def test_table_names_the_costliest_stage_and_flags_rows_over_the_goal():
    rows = [
        dict(family="gpt2", seq=1024, ops=14800, build_s=2.0, trace_s=9.0,
             index_s=1.0,
             plan_s=5.0, total_s=15.0, outcome="fits: 14.38 GiB, 192 "
             "swapped", stages=[["context", 0.5], ["swaps", 3.0],
                                ["order", 1.5]]),
        dict(family="gpt2", seq=4096, ops=14800, build_s=2.0, trace_s=9.0,
             index_s=1.0,
             plan_s=40.0, total_s=50.0, outcome="no plan: smallest 20 GiB",
             stages=[["swaps", 10.0], ["order", 30.0]]),
        dict(family="bert", seq=4096, error="MemoryError"),
    ]
    lines = bench.table(rows, 16.0).splitlines()
    assert lines[2] == ("| gpt2 | 1024 | 14800 | 2.0 | 9.0 | 1.0 | 5.0 | "
                        "15.0 | swaps | 3.0 | fits: 14.38 GiB, 192 "
                        "swapped |")
    assert lines[3] == ("| gpt2 | 4096 | 14800 | 2.0 | 9.0 | 1.0 | 40.0 | "
                        "50.0 (over) | order | 30.0 | no plan: smallest 20 "
                        "GiB |")
    assert lines[4].startswith("| bert | 4096 | - |")
    assert "failed: MemoryError" in lines[4]


@needs_keras_hub
def test_two_families_are_traced_and_planned_with_their_stages_timed():
    """Two families of the benchmark at the tiny size (a causal and a
    masked language model; Llama and Gemma are traced and trained in
    test_keras3_transformers.py), planned for a budget below its step (so
    the stages have work): one row each, the stages in the order
    `pipeline.plan` runs them."""
    out = python("benchmarks/transformer_plan_time.py", "--size", "tiny",
                 "--family", "gpt2", "bert", "--seq",
                 "32", "--batch", "2", "--gpu-mem", "0.02", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines()
            if re.match(r"\| (gpt2|llama|gemma|bert) \|", line)]
    assert [r.split("|")[1].strip() for r in rows] == ["gpt2", "bert"]
    for line in out.stdout.splitlines():
        if re.match(r"(gpt2|llama|gemma|bert) 32: ", line):
            named = [s.split()[0] for s in line.split("stages: ")[1]
                     .split(", ") if s]
            assert set(named) <= set(STAGE_NAMES), line
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert int(cells[2]) > 1000  # the step's ops
        assert cells[8] in STAGE_NAMES
        assert re.match(r"(fits|no plan)", cells[10]), row
