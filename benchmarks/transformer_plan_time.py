"""How long tracing and planning take on KerasHub's transformers, and which
planning stage costs most (issue 47, item 4; TensorFlow 2.16+ with Keras 3
and KerasHub).

    env -u TF_USE_LEGACY_KERAS TF_ENABLE_ONEDNN_OPTS=0 \
        python benchmarks/transformer_plan_time.py \
        [--family gpt2 llama gemma bert] [--seq 1024 2048 4096] \
        [--batch 8] [--gpu-mem 16] [--size small|tiny]

Each model is built from a config with random weights (no downloads;
`FAMILIES`), compiled with AdamW and sparse cross-entropy from logits, and
its ``model.train_step`` traced by ``tf.function`` for one batch of
``--batch`` sequences of each length; the step is then indexed and planned
for ``--gpu-mem`` GiB as ``lms.function`` plans it for a GPU
(`tf_function.step_of`, then `pipeline.plan` on
``graph_step.step_target(settings, here=False)``).
Each (model, length) runs in a process of its own, so no case pays for
another's memory or imports.

The table: model, sequence, the step's ops, the CPU seconds
(`time.process_time`, which a busy machine does not inflate) of building
the model (its layers, weights and optimizer slots: what training without
LMS pays too, so outside the goal), of tracing the step, of indexing and
of planning, the last three's total against the goal (`GOAL_CPU_S`),
the costliest
planning stage (`pipeline.Planned.stage_seconds`) and its seconds, and
what the plan came to (fits, or the smallest plan a failed search names).

``--size small`` (the default) is GPT-2 small's published config and the
other families at the same depth and width (`FAMILIES` says how each
differs); ``--size tiny`` is two layers 64 wide, for the tests.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import common  # noqa: E402

GOAL_CPU_S = 30.0  # issue 47: tracing and planning, any model, up to 4096

# Depth and width of GPT-2 small (12 layers, 768 wide) for every family,
# with each family's own vocabulary and attention layout: Llama's
# grouped-query attention (4 key-value heads for 12 query heads) and
# SwiGLU, Gemma's single key-value head and 256k vocabulary, BERT base's
# masked LM. `max_sequence_length` (GPT-2, BERT) is the traced length.
FAMILIES = {
    "gpt2": dict(vocab=50257, intermediate=3072),
    "llama": dict(vocab=32000, intermediate=2048, kv_heads=4),
    "gemma": dict(vocab=256000, intermediate=6144, kv_heads=1),
    "bert": dict(vocab=30522, intermediate=3072),
}
SIZES = {
    "small": dict(layers=12, heads=12, hidden=768),
    "tiny": dict(layers=2, heads=2, hidden=64),
}
_TINY_VOCAB = 1000
MASKED = 20  # BERT's masked positions per sequence (mask_positions)


def build(family, seq, size="small", seed=0):
    """The compiled KerasHub model of `family` at `size`, built for
    sequences of `seq` tokens, with the input signature of its step:
    ``(model, (x_spec, y_spec) as the batch's structure of shapes)``."""
    import keras
    import keras_hub
    keras.utils.set_random_seed(seed)
    models = keras_hub.models
    shape = SIZES[size]
    fam = FAMILIES[family]
    vocab = fam["vocab"] if size == "small" else _TINY_VOCAB
    intermediate = fam["intermediate"] * shape["hidden"] // 768
    common_args = dict(vocabulary_size=vocab, num_layers=shape["layers"],
                       hidden_dim=shape["hidden"],
                       intermediate_dim=intermediate, dropout=0.1)
    heads = shape["heads"]
    if family == "gpt2":
        model = models.GPT2CausalLM(models.GPT2Backbone(
            num_heads=heads, max_sequence_length=seq, **common_args),
            preprocessor=None)
    elif family == "llama":
        model = models.LlamaCausalLM(models.LlamaBackbone(
            num_query_heads=heads,
            num_key_value_heads=min(fam["kv_heads"], heads),
            **common_args), preprocessor=None)
    elif family == "gemma":
        model = models.GemmaCausalLM(models.GemmaBackbone(
            num_query_heads=heads, num_key_value_heads=fam["kv_heads"],
            head_dim=shape["hidden"] // heads, **common_args),
            preprocessor=None)
    elif family == "bert":
        model = models.BertMaskedLM(models.BertBackbone(
            num_heads=heads, max_sequence_length=seq, **common_args),
            preprocessor=None)
    else:
        raise ValueError("family must be one of %s; got %r"
                         % (", ".join(FAMILIES), family))
    model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True),
                  jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    return model


def signature(family, seq, batch):
    """The ``(x, y)`` `tf.TensorSpec` structure of one batch."""
    import tensorflow as tf
    tokens = tf.TensorSpec([batch, seq], tf.int32)
    x = {"token_ids": tokens,
         "padding_mask": tf.TensorSpec([batch, seq], tf.int32)}
    if family == "bert":
        x["segment_ids"] = tokens
        x["mask_positions"] = tf.TensorSpec([batch, MASKED], tf.int32)
        return x, tf.TensorSpec([batch, MASKED], tf.int32)
    return x, tokens


def measure(family, seq, batch, gpu_mem, size="small"):
    """One row (a dict): the CPU seconds of tracing, indexing and
    planning `family`'s step at `seq`, and what planning said."""
    import keras_hub  # noqa: F401 (imported before the clocks start)
    import tensorflow as tf
    from tflms import LMS
    from tflms import autotune
    from tflms import pipeline
    from tflms.tf.adapters import graph_step, tf_function
    row = {"family": family, "seq": seq}
    began = time.process_time()
    model = build(family, seq, size)
    row["build_s"] = time.process_time() - began
    began = time.process_time()
    concrete = tf.function(model.train_step, jit_compile=False) \
        .get_concrete_function(signature(family, seq, batch))
    row["trace_s"] = time.process_time() - began
    row["ops"] = len(concrete.graph.get_operations())
    lms = LMS()
    lms.autotune_gpu_mem = gpu_mem
    lms.autotune_host_mem = common.SERVER_HOST_MEM_GIB
    lms.batch_size = batch
    began = time.process_time()
    _, index = tf_function.step_of(concrete.graph)
    row["index_s"] = time.process_time() - began
    row["step_ops"] = len(index.names)
    began = time.process_time()
    try:
        planned = pipeline.plan(
            index, lms.settings, target=graph_step.step_target(
                lms.settings, here=False))
    except autotune.AutotuneError as err:
        stages = err.stage_seconds
        row["outcome"] = "no plan: smallest %s" % common.fmt_bytes(
            err.smallest_peak_bytes)
    else:
        stages = planned.stage_seconds
        if planned.plan is None:
            row["outcome"] = "fits without LMS"
        else:
            row["outcome"] = "fits: %s, %d swapped" % (
                common.fmt_bytes(planned.with_lms.peak_device_bytes),
                len(planned.plan.swaps))
    row["plan_s"] = time.process_time() - began
    row["stages"] = [list(s) for s in stages]
    row["total_s"] = row["trace_s"] + row["index_s"] + row["plan_s"]
    return row


def costliest(row):
    """``(name, seconds)`` of the stage of `row` that took longest."""
    if not row.get("stages"):
        return ("-", 0.0)
    return tuple(max(row["stages"], key=lambda s: s[1]))


def table(rows, gpu_mem):
    """The markdown table of `rows`."""
    lines = [
        "| model | sequence | ops | build s | trace s | index s | plan s | "
        "trace + index + plan s (goal %g) | costliest stage | its s | "
        "%g GiB plan |" % (GOAL_CPU_S, gpu_mem),
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append("| %s | %d | - | - | - | - | - | - | - | - | "
                         "failed: %s |" % (r["family"], r["seq"],
                                           r["error"]))
            continue
        name, secs = costliest(r)
        lines.append(
            "| %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f%s | %s | %.1f "
            "| %s |"
            % (r["family"], r["seq"], r["ops"], r["build_s"], r["trace_s"],
               r["index_s"],
               r["plan_s"], r["total_s"],
               "" if r["total_s"] <= GOAL_CPU_S else " (over)", name, secs,
               r["outcome"]))
    return "\n".join(lines)


def _one(family, seq, args):
    """`measure` in a process of its own: its row."""
    command = [sys.executable, os.path.abspath(__file__), "--one",
               "--family", family, "--seq", str(seq), "--batch",
               str(args.batch), "--gpu-mem", str(args.gpu_mem), "--size",
               args.size]
    done = subprocess.run(command, capture_output=True, text=True,
                          check=False)
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr.strip().splitlines() or ["exit %d"
                                                 % done.returncode])[-1]
    return {"family": family, "seq": seq, "error": tail[:200]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", nargs="+", default=["gpt2"],
                        choices=sorted(FAMILIES))
    parser.add_argument("--seq", type=int, nargs="+",
                        default=[1024, 2048, 4096])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gpu-mem", type=float, default=16.0,
                        help="GPU memory, GiB (autotune_gpu_mem)")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--one", action="store_true",
                        help=argparse.SUPPRESS)  # a row, in this process
    args = parser.parse_args(argv)
    if args.one:
        common.setup_tensorflow("eager")
        row = measure(args.family[0], args.seq[0], args.batch, args.gpu_mem,
                      args.size)
        print(json.dumps(row), flush=True)
        return 0
    rows = []
    for family in args.family:
        for seq in args.seq:
            row = _one(family, seq, args)
            rows.append(row)
            if "error" in row:
                print("%s %d: failed: %s" % (family, seq, row["error"]),
                      flush=True)
                continue
            print("%s %d: %d ops, build %.1f s, trace %.1f s, index %.1f s, "
                  "plan %.1f s (%s)  stages: %s" % (
                      family, seq, row["ops"], row["build_s"], row["trace_s"],
                      row["index_s"], row["plan_s"], row["outcome"],
                      ", ".join("%s %.1f" % (n, s) for n, s in row["stages"]
                                if s >= 0.05)), flush=True)
    print(table(rows, args.gpu_mem))
    return 0


if __name__ == "__main__":
    sys.exit(main())
