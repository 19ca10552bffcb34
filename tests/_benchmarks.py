"""What the tests of `benchmarks/` share: the repository root, running a
benchmark script as its users do, and the smoke suite's small capacity
case."""

import os
import subprocess
import sys

from _doc_blocks import ROOT


def run_script(name, args, timeout=600):
    """``python benchmarks/<name> ARGS`` in a process of its own, tflms
    planning for 0.9 of each budget (the default ratio, set so the caller's
    environment does not change it), TensorFlow's log quiet; the finished
    `subprocess.CompletedProcess` (text output)."""
    env = dict(os.environ, TF_LMS_SIMULATOR_MEM_RATIO="0.9",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", name)] + args,
        capture_output=True, text=True, env=env, timeout=timeout,
        check=False)


def tiny_capacity_case():
    """The smoke suite's 3D U-Net search (sizes 16 to 60 within 0.01 GiB),
    without TensorFlow's swapping, which the step table does not use."""
    from benchmarks import suites
    (case,) = suites.SMOKE["capacity"]
    return dict(case, methods=["none", "tflms"])
