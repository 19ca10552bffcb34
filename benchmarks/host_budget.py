"""Plans within a host budget (issue 26, item 3): what a smaller host costs.

    python benchmarks/host_budget.py resnet50 --size 6592 \
        --host-gib 256 40 30 20
    python benchmarks/host_budget.py unet3d --size 352 --host-gib 256 16 8

Auto-tunes the model for ``--gpu-mem`` GiB (default 16, times
TF_LMS_SIMULATOR_MEM_RATIO) once per host budget (``autotune_host_mem``)
through `pipeline.plan`, the path `LMS.run` takes, with ``recompute=False``:
every recompute in a row was made by the host stage (tflms/stages/host.py)
because the host bound the plan. Prints one JSON line per budget, then a
markdown table: swaps, recomputes, the simulated host and device peaks, the
predicted step (`tflms.steptime`, ``--gpu``, ``--interconnect``), which
memory bound the plan, and the CPU seconds planning took. Nothing is run:
sizes are static.
"""

import argparse
import json
import os
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import models  # noqa: E402
from benchmarks.common import fmt_bytes, setup_tensorflow  # noqa: E402
from tflms.tf import reader  # noqa: E402
from tflms import pipeline  # noqa: E402
from tflms import steptime  # noqa: E402
from tflms.settings import Settings  # noqa: E402
from tflms.stages.host import HostMemoryError  # noqa: E402


def measure(model, host_gibs, size=None, batch=1, gpu_mem=16.0,
            gpu=steptime.DEFAULT_GPU,
            interconnect=steptime.DEFAULT_INTERCONNECT):
    """One row (a dict) per host budget in `host_gibs`."""
    built = models.build_sized(model, size, batch)
    index = reader.build_index(built.graph)
    # recompute=False: every recompute in a row is the host stage's.
    base = Settings(batch_size=built.batch_size, autotune_gpu_mem=gpu_mem,
                    gpu=gpu, interconnect=interconnect, recompute=False)
    roles = pipeline.classify(index, base)
    rows = []
    for host_gib in host_gibs:
        row = {"model": built.description, "host_gib": host_gib}
        start = time.process_time()
        try:
            planned = pipeline.plan(
                index, base.replace(autotune_host_mem=host_gib), roles=roles)
        except HostMemoryError as err:
            row.update(bound="host: no plan", error=str(err))
        else:
            plan = planned.plan
            step = steptime.predict_planned(planned, gpu=gpu,
                                            interconnect=interconnect)
            row.update(
                swaps=len(plan.swaps), recomputes=len(plan.recomputes),
                host_peak_bytes=planned.with_lms.peak_host_bytes,
                device_peak_bytes=planned.with_lms.peak_device_bytes,
                budget_bytes=planned.budget_bytes,
                # recompute is off: only the host stage recomputes.
                bound="host" if plan.recomputes else "device",
                without_lms_ms=round(step.without_lms_s * 1e3, 1),
                step_ms=round(step.with_lms_s * 1e3, 1),
                recompute_ms=round(step.recompute_s * 1e3, 1))
        row["plan_cpu_s"] = round(time.process_time() - start, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def table(rows):
    """Markdown lines of `rows` (from `measure`)."""
    lines = ["| model | host budget | bound by | swaps | recomputes | host "
             "peak | device peak | step (no LMS) | planning |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append("| %s | %g GiB | %s | | | | | | %.1f s CPU |" % (
                row["model"], row["host_gib"], row["bound"],
                row["plan_cpu_s"]))
            continue
        lines.append(
            "| %s | %g GiB | %s | %d | %d | %s | %s of %s | %.1f ms (%.1f "
            "ms) | %.1f s CPU |" % (
                row["model"], row["host_gib"], row["bound"], row["swaps"],
                row["recomputes"], fmt_bytes(row["host_peak_bytes"]),
                fmt_bytes(row["device_peak_bytes"]),
                fmt_bytes(row["budget_bytes"]), row["step_ms"],
                row["without_lms_ms"], row["plan_cpu_s"]))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=("resnet50", "unet3d"))
    parser.add_argument("--size", type=int, default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--gpu-mem", type=float, default=16.0)
    parser.add_argument("--gpu", default=steptime.DEFAULT_GPU)
    parser.add_argument("--interconnect",
                        default=steptime.DEFAULT_INTERCONNECT)
    parser.add_argument("--host-gib", type=float, nargs="+",
                        default=[256.0, 40.0, 30.0, 20.0])
    args = parser.parse_args(argv)
    setup_tensorflow("v2")
    rows = measure(args.model, args.host_gib, size=args.size,
                   batch=args.batch, gpu_mem=args.gpu_mem, gpu=args.gpu,
                   interconnect=args.interconnect)
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
