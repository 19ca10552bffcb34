"""``offload_optimizer`` on a Keras 3 Llama (KerasHub, random weights, AdamW):
the step planned with the optimizer's slots on the device and on the host
(issue 49, item 4; TensorFlow 2.16+ with Keras 3 and KerasHub).

    env -u TF_USE_LEGACY_KERAS TF_ENABLE_ONEDNN_OPTS=0 \
        python benchmarks/offload_llama.py [--config 0.25b|1b|tiny] \
        [--gpu-mem GIB] [--oracle]

The model (`CONFIGS`) is built from a config (`keras_hub_models`), compiled
with AdamW and sparse cross-entropy from logits, and its
``model.train_step`` traced by ``tf.function`` for one batch; the step is
indexed as ``lms.function`` plans it (`tf_function.step_of`) and planned
twice for ``--gpu-mem`` GiB (times TF_LMS_SIMULATOR_MEM_RATIO, as every
budget) on ``graph_step.step_target(settings, here=False)``: as it is, and
with its element-wise updates and slots on the host
(`offload.planning_step`), as ``tflms plan --offload-optimizer`` plans a
Keras 3 model. Nothing is rewritten: the numbers are the simulator's and
the step-time model's (the default GPU and link), with the host budget of
a server (`common.SERVER_HOST_MEM_GIB`).

``0.25b`` is issue 49's smaller pair (16 layers 1024 wide, grouped-query
attention, vocabulary 32000; batch 1, sequence 1024, 3 GiB); ``1b`` is
Llama-3.2-1B's architecture (batch 1, sequence 2048, 16 GiB), which
needs about 20 GB of host memory to build; ``tiny`` (2 layers 64 wide) is
for the tests, planned by default halfway between its two floors.

With ``--oracle`` the step is also rewritten for real and measured by
the oracle's runtime replay (`tflms.tf.oracle`), each variable on its own
device: the machine's CPU is split into two logical CPUs, the model built
on ``/cpu:1`` (the device LMS manages, the oracle's GPU) and
``LMS(cpu_device="/cpu:0")`` is the host, as in
tests/test_offload_keras3_training.py. ``lms.function(model.train_step,
optimizer=...)`` rewrites the step as ``fit`` would (with offload the
slots move to ``/cpu:0`` and the step is traced again), and the oracle
replays the rewritten graph with the weights on its GPU and the slots and
host ops on its CPU (`oracle.place_on_gpu`'s ``host``). Without offload,
where no plan fits the budget, the step is planned again at the budget
the smallest plan the tuner found needs, and that plan is measured.

Prints a markdown table, and with ``--json`` the numbers.
"""

import argparse
import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import common  # noqa: E402
from benchmarks import keras_hub_models  # noqa: E402

CONFIGS = {
    "0.25b": dict(vocab=32000, layers=16, hidden=1024, heads=16, kv_heads=4,
                  intermediate=2816, tie=False, seq=1024, batch=1,
                  gpu_mem=3.0),
    "1b": dict(vocab=128256, layers=16, hidden=2048, heads=32, kv_heads=8,
               intermediate=8192, tie=True, seq=2048, batch=1, gpu_mem=16.0),
    "tiny": dict(vocab=1000, layers=2, hidden=64, heads=4, kv_heads=2,
                 intermediate=128, tie=False, seq=32, batch=1, gpu_mem=None),
}


# With --oracle: the logical CPU that stands for the GPU.
from benchmarks.offload_llama_oracle import DEVICE  # noqa: E402


def build(config, seed=0):
    """The compiled `keras_hub.models.LlamaCausalLM` of `config` (a dict of
    `CONFIGS`), its optimizer's slots built (`keras_hub_models.build`,
    without dropout)."""
    return keras_hub_models.build("llama", config["seq"],
                                  dict(config, dropout=0.0), seed)


def trace(model, seq, batch):
    """The `GraphIndex` of `model`'s training step on one batch, as
    ``lms.function`` plans it, and its trainable parameters."""
    from tflms.tf.adapters import tf_function
    concrete = keras_hub_models.trace(model, "llama", seq, batch)
    _, index = tf_function.step_of(concrete.graph)
    params = sum(_elements(v.shape) for v in model.trainable_variables)
    return index, params


def _elements(shape):
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def settings_for(gpu_mem, batch, offload):
    from tflms import LMS
    lms = LMS(offload_optimizer=offload)
    lms.autotune_gpu_mem = gpu_mem
    lms.autotune_host_mem = common.SERVER_HOST_MEM_GIB
    lms.batch_size = batch
    return lms.settings


def plan(index, settings):
    """One column of the table (a dict): the step planned with `settings`
    (``offload_optimizer`` on: its updates on the host)."""
    from tflms import autotune, offload, pipeline, steptime
    from tflms import floor as floor_mod
    from tflms.tf.adapters import graph_step
    target = graph_step.step_target(settings, here=False)
    moved = None
    if settings.offload_optimizer:
        index, target, moved = offload.planning_step(
            index, target, settings.cpu_device, target.manages)
    roles = pipeline.classify(index, settings, target)
    lowest = floor_mod.floor_of(index, roles, settings.batch_size)
    col = {"floor": lowest.floor_bytes, "resident": lowest.resident_bytes,
           "budget": autotune.device_budget(settings.autotune_gpu_mem,
                                            settings.gpu_device)}
    if moved is not None:
        col.update(updates=len(moved.updates), left=list(moved.left),
                   slots=moved.slot_bytes, weights=moved.weight_bytes,
                   moved=moved.moved_bytes())
    try:
        planned = pipeline.plan(index, settings, roles=roles, target=target)
    except autotune.AutotuneError as err:
        col.update(fits=False, smallest=err.smallest_peak_bytes,
                   peak=None, host=None, step_ms=None)
        return col
    planned = pipeline.simulate_plan(planned)
    shown = planned.with_lms if planned.plan is not None \
        else planned.without_lms
    step = steptime.predict_planned(planned)
    col.update(fits=True, smallest=int(shown.peak_device_bytes),
               peak=int(shown.peak_device_bytes),
               host=int(shown.peak_host_bytes),
               swapped=len(planned.plan.swaps) if planned.plan else 0,
               recomputed=len(planned.plan.recomputes)
               if planned.plan else 0,
               step_ms=step.with_lms_s * 1e3,
               without_ms=step.without_lms_s * 1e3,
               host_update_ms=step.host_update_s * 1e3,
               gpu=step.gpu, link=step.interconnect)
    return col


def measure(name, gpu_mem=None, with_oracle=False):
    """The two columns of `name`'s config (a dict); with `with_oracle`
    also ``row["oracle"]`` (`oracle_columns`: the step rewritten, built
    on `DEVICE`, which `split_cpu` must have made)."""
    from tflms import budget
    config = CONFIGS[name]
    if with_oracle:
        import tensorflow as tf
        with tf.device(DEVICE):
            model = build(config)
    else:
        model = build(config)
    index, params = trace(model, config["seq"], config["batch"])
    gpu_mem = gpu_mem or config["gpu_mem"]
    if gpu_mem is None:
        # Halfway between the two floors, which no budget changes.
        roomy = 64.0
        floors = [plan_floor(index, settings_for(roomy, config["batch"], o))
                  for o in (False, True)]
        gpu_mem = sum(floors) / 2 / budget.mem_ratio() / (1 << 30)
    row = {"config": name, "params": params, "ops": index.num_ops,
           "seq": config["seq"], "batch": config["batch"],
           "gpu_mem": gpu_mem}
    for key, off in (("without", False), ("with", True)):
        row[key] = plan(index, settings_for(gpu_mem, config["batch"], off))
    if with_oracle:
        from benchmarks import offload_llama_oracle
        del index
        row["oracle"] = offload_llama_oracle.oracle_columns(
            model, config, gpu_mem)
    return row


def plan_floor(index, settings):
    """The floor of the step planned with `settings` (bytes)."""
    from tflms import offload, pipeline
    from tflms import floor as floor_mod
    from tflms.tf.adapters import graph_step
    target = graph_step.step_target(settings, here=False)
    if settings.offload_optimizer:
        index, target, _ = offload.planning_step(
            index, target, settings.cpu_device, target.manages)
    roles = pipeline.classify(index, settings, target)
    return floor_mod.floor_of(index, roles, settings.batch_size).floor_bytes


def _ms(milliseconds):
    return "-" if milliseconds is None else "%.0f" % milliseconds


def table(row):
    """The markdown table of `measure`'s row."""
    w, o = row["without"], row["with"]
    size = common.fmt_bytes
    lines = [
        "| Llama %s (%.1fM parameters, AdamW), batch %d, sequence %d, "
        "budget %s | without offload | with offload |" % (
            row["config"], row["params"] / 1e6, row["batch"], row["seq"],
            size(w["budget"])),
        "|---|---:|---:|",
        "| resident on the device | %s | %s |" % (size(w["resident"]),
                                                  size(o["resident"])),
        "| device floor | %s | %s |" % (size(w["floor"]), size(o["floor"])),
        "| smallest plan's device peak | %s | %s |" % (
            size(w["smallest"]), size(o["smallest"])),
        "| fits the budget | %s | %s |" % (
            "yes" if w["fits"] else "no plan fits",
            "yes" if o["fits"] else "no plan fits"),
        "| host memory at the peak | %s | %s |" % (size(w["host"]),
                                                   size(o["host"])),
        "| slots on the host / updates moved | 0 / 0 | %s / %d |" % (
            size(o["slots"]), o["updates"]),
        "| copied over the link per step for the updates | 0 | %s |"
        % size(o["moved"]),
        "| predicted step (ms%s) | %s | %s |" % (
            "" if not o.get("gpu") else ", %s, %s" % (o["gpu"], o["link"]),
            _ms(w["step_ms"]), _ms(o["step_ms"])),
        "| of which the updates on the host (ms) | - | %s |"
        % _ms(o.get("host_update_ms")),
        "| the step without LMS, were it to fit (ms) | %s | |"
        % _ms(o.get("without_ms")),
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS),
                        default="0.25b")
    parser.add_argument("--gpu-mem", type=float, default=None,
                        help="GPU memory, GiB (default: the config's)")
    parser.add_argument("--oracle", action="store_true",
                        help="also rewrite the step and measure it with "
                        "the oracle's replay (module docstring)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    common.setup_tensorflow("eager")
    if args.oracle:
        from benchmarks import offload_llama_oracle
        offload_llama_oracle.split_cpu()
    row = measure(args.config, args.gpu_mem, with_oracle=args.oracle)
    if args.json:
        print(json.dumps(row))
    print(table(row))
    if args.oracle:
        print()
        print(offload_llama_oracle.table(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
