"""``offload_optimizer`` on the zoo's Transformer encoder (Adam, a Session
graph): the device floor and resident bytes with the slots on the device
and on the host, and a budget between the two floors planned both ways;
the predicted step times (`tflms.steptime` on the default GPU and link:
with offload, the gradients and weights copied, the updates on the host).

    .venv-tf215/bin/python benchmarks/offload.py [--layers 4 --d-model 512
        --seq 128 --batch 4]

prints a markdown table. The budget is the midpoint of the two floors
(`autotune_gpu_mem` set so that, times TF_LMS_SIMULATOR_MEM_RATIO,
it is that), so no plan fits it without offload;
the row with offload gives the plan's predicted device peak there.
"""

import argparse
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from tflms import LMS, autotune, budget, pipeline, steptime  # noqa: E402
from zoo import models  # noqa: E402

_MIB = float(1 << 20)


def _quiet_lms(offload, gib):
    lms = LMS(offload_optimizer=offload)
    lms.autotune_gpu_mem = gib
    return lms


def measure(layers, d_model, seq, batch):
    """The numbers of one Transformer: a dict."""
    def build():
        with tf.Graph().as_default():
            return models.transformer_encoder(layers=layers, seq=seq,
                                              d_model=d_model, heads=4,
                                              batch=batch)
    roomy = 64.0  # GiB: far above the step, to read its floors
    without = _quiet_lms(False, roomy).run(build().graph)
    offloaded = _quiet_lms(True, roomy).run(build().graph)
    floor = pipeline.step_floor(without.planned)
    floor_off = pipeline.step_floor(offloaded.planned)
    limit = (floor.floor_bytes + floor_off.floor_bytes) / 2
    gib = limit / budget.mem_ratio() / (1 << 30)
    try:
        _quiet_lms(False, gib).run(build().graph)
        fits_without = True
    except autotune.AutotuneError:
        fits_without = False
    result = _quiet_lms(True, gib).run(build().graph)
    sim = result.planned.with_lms or result.planned.without_lms
    moved = offloaded.offload
    plain = steptime.predict_planned(without.planned)
    roomy_step = steptime.predict_planned(offloaded.planned)
    tight_step = steptime.predict_planned(pipeline.simulate_plan(
        result.planned))
    return {
        "model": "transformer %dx%d, seq %d, batch %d" % (
            layers, d_model, seq, batch),
        "weights_mib": moved.weight_bytes / _MIB,
        "slots_mib": moved.slot_bytes / _MIB,
        "floor_mib": floor.floor_bytes / _MIB,
        "floor_offload_mib": floor_off.floor_bytes / _MIB,
        "resident_mib": floor.resident_bytes / _MIB,
        "resident_offload_mib": floor_off.resident_bytes / _MIB,
        "budget_mib": limit / _MIB,
        "fits_without": fits_without,
        "peak_offload_mib": sim.peak_device_bytes / _MIB,
        "host_offload_mib": sim.peak_host_bytes / _MIB,
        "moved_mib": moved.moved_bytes() / _MIB,
        "gpu": plain.gpu,
        "link": steptime.interconnect_named(plain.interconnect).label,
        "step_ms": plain.with_lms_s * 1e3,
        "step_offload_ms": roomy_step.with_lms_s * 1e3,
        "step_budget_ms": tight_step.with_lms_s * 1e3,
        "host_update_ms": roomy_step.host_update_s * 1e3,
    }


def table(row):
    """A markdown table of `measure`'s numbers."""
    lines = [
        "| %s | without offload | with offload |" % row["model"],
        "|---|---:|---:|",
        "| weights / Adam slots (MiB) | %.1f / %.1f on the device | "
        "%.1f on the device / %.1f on the host |" % (
            row["weights_mib"], row["slots_mib"], row["weights_mib"],
            row["slots_mib"]),
        "| resident on the device (MiB) | %.1f | %.1f |" % (
            row["resident_mib"], row["resident_offload_mib"]),
        "| device floor (MiB) | %.1f | %.1f |" % (
            row["floor_mib"], row["floor_offload_mib"]),
        "| budget %.1f MiB | %s | fits: peak %.1f MiB, host %.1f MiB |" % (
            row["budget_mib"],
            "fits" if row["fits_without"] else "no plan fits",
            row["peak_offload_mib"], row["host_offload_mib"]),
        "| copied over the link per step (MiB) | 0 | %.1f |"
        % row["moved_mib"],
        "| updates' time on the host (ms) | 0 | %.2f |"
        % row["host_update_ms"],
        "| predicted step, no budget (ms, %s, %s) | %.2f | %.2f |" % (
            row["gpu"], row["link"], row["step_ms"],
            row["step_offload_ms"]),
        "| predicted step at the budget (ms) | - | %.2f |"
        % row["step_budget_ms"],
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    print(table(measure(args.layers, args.d_model, args.seq, args.batch)))


if __name__ == "__main__":
    main()
