"""benchmarks/remat_side_by_side.py: the longest sequence without LMS,
with keras.RematScope and with LMS, on a tiny GPT-2."""

import argparse
import re

from _keras3 import needs_keras_hub, python

from benchmarks import remat_side_by_side as bench


def test_error_line_is_the_message_keras_puts_in_bold():
    err = ValueError("in user code:\n  File x\n    ValueError: Exception "
                     "encountered.\n    \x1b[1mThe custom_gradient "
                     "decorator currently supports\n keywords arguments."
                     "\x1b[0m\n    Arguments received: ...")
    assert bench.error_line(err) == ("The custom_gradient decorator "
                                     "currently supports keywords "
                                     "arguments.")
    assert bench.error_line(RuntimeError("a\nb\n")) == "RuntimeError: b"


def test_table_rows_say_longest_failures_and_the_step_against_without():
    args = argparse.Namespace(batch=8, gpu_mem=16.0, lo=256)
    lines = bench.table([
        dict(family="gpt2", column="none", longest=512, peak=10 << 30,
             step_without_ms=500.0),
        dict(family="gpt2", column="full", error="refused"),
        dict(family="gpt2", column="activations", longest=None),
        dict(family="gpt2", column="lms", longest=2048, peak=14 << 30,
             oracle_peak=14 << 30, step_with_ms=3000.0,
             step_without_ms=2000.0),
    ], args).splitlines()
    assert lines[2] == ("| gpt2 | without LMS | 512 | 10.00 GiB | - | "
                        "500 ms | 500 ms |")
    assert lines[3] == ("| gpt2 | `RematScope(mode='full')` | fails: "
                        "refused | - | - | - | - |")
    assert lines[4].startswith("| gpt2 | `RematScope(mode='activations')` "
                               "| none from 256 |")
    assert lines[5] == ("| gpt2 | LMS | 2048 | 14.00 GiB | 14.00 GiB | "
                        "3000 ms (1.50x) | 2000 ms |")


@needs_keras_hub
def test_a_tiny_gpt2_trains_longer_with_lms_and_remat_full_is_refused():
    """A budget that the tiny GPT-2 meets without LMS only at short
    lengths: LMS reaches at least as far, and ``RematScope("full")`` is
    refused inside tf.function with TensorFlow's message."""
    out = python("benchmarks/remat_side_by_side.py", "--size", "tiny",
                 "--family", "gpt2", "--columns", "none", "full", "lms",
                 "--batch", "2", "--gpu-mem", "0.01", "--lo", "32", "--hi",
                 "160", "--step", "32", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {}
    for line in out.stdout.splitlines()[-3:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        rows[cells[1]] = cells[2]
    assert rows["`RematScope(mode='full')`"].startswith(
        "fails: The custom_gradient decorator currently supports keywords "
        "arguments only when eager execution is enabled")
    none = int(re.match(r"\d+", rows["without LMS"]).group())
    assert int(rows["LMS"]) >= none
