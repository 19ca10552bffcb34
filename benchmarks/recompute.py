"""Bytes moved per step by the auto-tuned plan with and without recompute,
at the same budget (issue 15, item 2).

    python benchmarks/recompute.py resnet50 --size 224 --batch 8 \
        --budget-ratio 0.5
    python benchmarks/recompute.py unet3d --size 64 --budget-ratio 0.5

The budget is a share of the simulator's peak without LMS; both plans are
planned by `pipeline.plan` (what `LMS.run` applies) and replayed by the
simulator. Prints one JSON line per setting.
"""

import argparse
import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import common  # noqa: E402
from benchmarks import models  # noqa: E402
from tflms.tf import reader  # noqa: E402
from tflms import pipeline  # noqa: E402
from tflms.settings import Settings  # noqa: E402

_GIB = float(1 << 30)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["resnet50", "unet3d"])
    parser.add_argument("--size", type=int, default=None,
                        help="image side (resnet50) or volume side (unet3d)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--budget-ratio", type=float, default=0.5)
    args = parser.parse_args(argv)
    built = models.build_sized(args.model, args.size, args.batch)
    index = reader.build_index(built.graph)
    base = Settings(batch_size=built.batch_size)
    without = pipeline.simulate_without(
        index, pipeline.classify(index, base), base)
    budget_gib = without.peak_device_bytes * args.budget_ratio / _GIB
    env = {"TF_LMS_SIMULATOR_MEM_RATIO": "1"}
    for recompute in (False, True):
        settings = base.replace(autotune_gpu_mem=budget_gib,
                                autotune_host_mem=common.SERVER_HOST_MEM_GIB,
                                recompute=recompute)
        planned = pipeline.plan(index, settings, env=env)
        plan = planned.plan
        print(json.dumps({
            "model": built.description, "recompute": recompute,
            "budget_gib": round(budget_gib, 4),
            "without_lms_peak_gib": round(without.peak_device_bytes / _GIB,
                                          4),
            "peak_gib": round(planned.with_lms.peak_device_bytes / _GIB, 4),
            "swapped_tensors": len(plan.swaps),
            "recomputed_tensors": len(plan.recomputes),
            "cloned_ops": sum(len(r.ops) for r in plan.recomputes),
            "moved_gib": round(plan.moved_bytes() / _GIB, 4),
            "recomputed_gib": round(plan.recompute_bytes() / _GIB, 4),
        }), flush=True)


if __name__ == "__main__":
    main()
