"""Trains a zoo model without LMS and with LMS and recompute, in this
process, and prints what `test_recompute_training.py` checks, as JSON.

Run as a script (``python tests/_recompute_training.py MODEL``) in a
subprocess: the test chooses `TF_ENABLE_ONEDNN_OPTS` for it, which
TensorFlow reads once when it loads.
"""

import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tflms.tf import reader  # noqa: E402
from tflms import LMS  # noqa: E402

import test_equivalence as eq  # noqa: E402
from _graphs import unexecuted_nodes  # noqa: E402

SIZES = {
    "cnn_bn": dict(image=12, channels=6, depth=4, batch=2),
    # ConcatV2 of parallel convs, then batch norm and pooling.
    "cnn_branchy": dict(image=8, channels=3, depth=2, branches=3, batch=2),
    "keras_resnet": dict(image=16, batch=2, blocks=(1, 1)),
    # Large enough that, tuned for an H100 on PCIe 3.0, recomputing
    # through convolutions shortens the predicted step (`tuned_lms`).
    "keras_resnet_64": dict(image=64, batch=4, blocks=(2, 2)),
}


def tuned_lms(graph):
    """LMS auto-tuned for half the graph's simulated peak without LMS, on a
    fast GPU over a slow link (H100, PCIe 3.0), where copies are exposed and
    recomputing through convolutions shortens the predicted step."""
    # Imported here: only the tuned case needs the planning modules.
    from tflms import pipeline
    from tflms.settings import Settings
    settings = Settings(gpu="H100-SXM5-80GB", interconnect="pcie3",
                        recompute=True)
    index = reader.build_index(graph)
    without = pipeline.simulate_without(
        index, pipeline.classify(index, settings), settings)
    os.environ["TF_LMS_SIMULATOR_MEM_RATIO"] = "1"
    return LMS.from_settings(settings.replace(
        autotune_gpu_mem=0.5 * without.peak_device_bytes / (1 << 30)))


def main(name):
    tf.compat.v1.disable_eager_execution()
    eq.SIZES.update(SIZES)
    eq._BUILDER_OF["keras_resnet_64"] = "keras_resnet"
    # "<model>:tuned": auto-tuned (convolutions may be cloned); otherwise
    # fixed parameters swapping every tensor (cheap clones only).
    name, _, mode = name.partition(":")
    base_losses, base_weights, base_md = eq.train(eq.build(name))
    model = eq.build(name)
    if mode == "tuned":
        lms = tuned_lms(model.graph)
    else:
        lms = LMS(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0,
                  recompute=True)
    result = lms.run(model.graph)
    losses, weights, md = eq.train(model)
    ran = {n.node_name for d in md.step_stats.dev_stats for n in d.node_stats}
    optimized = {n.name for pg in md.partition_graphs for n in pg.node}
    clones = result.rewrite.recompute_ops
    # A clone gone from the optimized graph was fused by Grappler into the
    # clone it reads (batch norm + ReLU with oneDNN), or merged with a twin
    # (two recomputes cloning the same op with the same trigger): those
    # are named, and must have run.
    memo = {}

    def trigger_of(op):
        # Grappler removes Identity ops and moves their readers, control
        # readers too, to the Identity's input: a trigger that is an
        # Identity (`tuple/control_dependency` of a gradient) is its
        # source's twin.
        while op.type == "Identity" and op.inputs:
            op = op.inputs[0].op
        return op.name

    def signature(name):
        # What a clone computes: its type and inputs, clones by signature.
        if name not in memo:
            op = model.graph.get_operation_by_name(name)
            memo[name] = (op.type, tuple(
                (signature(t.op.name), t.value_index) if t.op.name in clones
                else t.name for t in op.inputs),
                tuple(sorted({trigger_of(c) for c in op.control_inputs})))
        return memo[name]

    gone = {}
    for name in clones:
        if name not in optimized:
            inputs = [t.op.name for t in
                      model.graph.get_operation_by_name(name).inputs]
            gone[name] = [i for i in inputs
                          if i in clones and i in optimized] or [
                c for c in clones if c != name and c in optimized
                and signature(c) == signature(name)]
    index = result.planned.index
    print(json.dumps({
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "recomputed": [index.names[r.producer]
                       for r in result.planned.plan.recomputes],
        "cloned_types": sorted({index.types[o]
                                for r in result.planned.plan.recomputes
                                for o in r.ops}),
        # Clones a recompute reads from another recompute (not cloned
        # twice): ``('recompute', ...)`` sources.
        "shared_reads": sum(src[0] == "recompute"
                            for r in result.planned.plan.recomputes
                            for srcs in r.inputs for src in srcs),
        "clones": list(result.rewrite.recompute_ops),
        "clones_ran": [c for c in clones if c in ran],
        "clones_gone": gone,
        "swapouts": len(result.swapout_ops),
        "unrun": sorted(unexecuted_nodes(md) - unexecuted_nodes(base_md)),
        "same_losses": losses == base_losses,
        "losses": [float(x) for x in losses],
        "same_weights": all(np.array_equal(a, b)
                            for a, b in zip(base_weights, weights)),
        "weights": len(weights),
        # A new LMS object: the same one answers a second call for the same
        # graph from its last run.
        "rewritten_again": (tuned_lms(model.graph) if mode == "tuned" else
                            LMS(swapout_threshold=1, swapin_ahead=1,
                                swapin_groupby=0, recompute=True)).run(
                                    model.graph).outcome.name,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
