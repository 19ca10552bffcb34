"""Helpers shared by the distributed job scripts.

The jobs run as scripts (``python tests/dist_jobs/<job>.py``), so this
module is imported as ``_common`` from the scripts' own folder. Importing it
imports TensorFlow: a job sets TF_CPP_MIN_LOG_LEVEL and the repository path
first.
"""

import faulthandler
import json
import os
import sys

import numpy as np
import tensorflow as tf

from tflms.tf import reader
from tflms import LMS
from tflms import analysis

# The mirrored jobs' two towers (logical CPUs standing in for GPUs), their
# host, and the fixed LMS settings every job uses. The host is the
# ``cpu_device`` setting, and LMS manages every other device the step
# computes on (`tflms.target.Target.manages`), so the towers are planned as
# two GPUs would be.
TOWERS = ("/cpu:1", "/cpu:2")
HOST = "/cpu:0"
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0,
             cpu_device=HOST)


def setup_cpu_devices(count, graph_mode=True):
    """Split the CPU into `count` logical devices and turn graph mode on
    (unless not `graph_mode`: a TF2 job). The job names its host with the
    ``cpu_device`` setting. Must run before TensorFlow initialises its
    runtime.
    """
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * count)
    if graph_mode:
        tf.compat.v1.disable_eager_execution()


def mlp_loss(x, labels):
    """The jobs' model: a 4-layer MLP on 16 features, 3 classes; its loss."""
    h = x
    for i in range(4):
        h = tf.compat.v1.layers.dense(
            h, 32, activation=tf.nn.relu, name="dense%d" % i,
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
                seed=i))
    logits = tf.compat.v1.layers.dense(
        h, 3, name="logits",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=7))
    return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)


def model_fn(features, labels, mode):
    """Estimator model: `mlp_loss`, SGD."""
    loss = mlp_loss(features["x"], labels)
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def lms_for_mode(mode):
    """The LMS objects of a mirrored job's MODE: 'none' (no LMS), 'one' (one
    LMS for every tower) or 'per_device' (one LMS per tower, gpu_device
    set)."""
    if mode == "none":
        return []
    if mode == "one":
        return [LMS(**FIXED)]
    if mode == "per_device":
        return [LMS(gpu_device=d, **FIXED) for d in TOWERS]
    raise ValueError("MODE must be 'none', 'one' or 'per_device'; got %r"
                     % (mode,))


def run_mirrored_modes(train):
    """A mirrored job's main: ``JOB OUT_DIR MODE[,MODE...]`` runs
    ``train(out, mode)`` for each mode in one process, on three logical
    CPUs (CPU:0 the host), and dumps tracebacks if it hangs."""
    out, modes = sys.argv[1], sys.argv[2].split(",")
    faulthandler.dump_traceback_later(200, exit=True)
    setup_cpu_devices(3)
    for mode in modes:
        train(out, mode)


def save_result(out, stem, mode, weights, record):
    """Writes OUT/STEM.npz (`weights`: name -> array) and OUT/STEM.json
    (`record`), then prints 'done MODE'."""
    np.savez(os.path.join(out, stem + ".npz"), **weights)
    with open(os.path.join(out, stem + ".json"), "w", encoding="utf-8") as f:
        json.dump(record, f)
    print("done", mode, flush=True)


def describe_swaps(graph, lms_list):
    """Where each swap of the given LMS objects' last rewrites is: devices
    of the swapped tensor's producer, of the two swap ops, of the swap-in's
    consumers and triggers."""
    swaps = []
    for lms in lms_list:
        result = lms.last_run
        for name in (result.swapin_ops if result else ()):
            swapin = graph.get_operation_by_name(name)
            swapout = swapin.inputs[0].op
            swaps.append({
                "swapin": name, "swapout": swapout.name,
                "source_device": swapout.inputs[0].op.device,
                "swap_devices": [swapin.device, swapout.device],
                "consumer_devices": sorted(
                    c.device for c in swapin.outputs[0].consumers()),
                "trigger_devices": sorted(
                    c.device for c in swapin.control_inputs),
            })
    return swaps


def make_input_fn(seed):
    """Estimator input_fn for `model_fn`: 64 random examples drawn with
    `seed`, in batches of 8, repeated."""
    def input_fn():
        rng = np.random.RandomState(seed)
        x = rng.randn(64, 16).astype(np.float32)
        y = rng.randint(0, 3, 64).astype(np.int32)
        return tf.compat.v1.data.Dataset.from_tensor_slices(
            ({"x": x}, y)).batch(8, drop_remainder=True).repeat()
    return input_fn


def executed_names(run_metadata):
    """Names of the ops a traced step ran."""
    return {n.node_name for d in run_metadata.step_stats.dev_stats
            for n in d.node_stats}


class TraceHook(tf.compat.v1.train.SessionRunHook):
    """Traces every step; `executed` collects the names of the ops run."""

    def __init__(self):
        self.executed = set()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(
            fetches=None, options=tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

    def after_run(self, run_context, run_values):
        self.executed |= executed_names(run_values.run_metadata)


def collective_contacts(graph, result):
    """(number of collective ops, swap ops wired to one of them).

    A swap op is wired to a collective when it reads one's output, feeds
    one, or has one as a control input (a swap-in trigger). LMS must never
    do any of these.
    """
    index = reader.build_index(graph)
    collectives = {index.names[i] for i in analysis.collective_ops(index)}
    contacts = []
    names = () if result is None else (
        tuple(result.swapout_ops) + tuple(result.swapin_ops))
    for name in names:
        op = graph.get_operation_by_name(name)
        touched = [t.op.name for t in op.inputs]
        touched += [c.name for c in op.control_inputs]
        touched += [c.name for t in op.outputs for c in t.consumers()]
        contacts += ["%s <-> %s" % (name, t) for t in touched
                     if t in collectives]
    return len(collectives), contacts
