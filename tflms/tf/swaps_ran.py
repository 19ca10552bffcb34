"""Did the swaps run? Which of LMS's swap operations TensorFlow ran, for
TensorFlow 2 code (`lms.function(step)`, Keras 3 `fit` with the callback).

    from tflms.tf.swaps_ran import watch_swaps

    with watch_swaps(lms) as swaps:
        model.fit(x, y, callbacks=[lms])
    print(swaps)               # 19 of the 19 swap operations LMS added ran ...
    assert swaps.all_ran

The step statistics of an eager function call come back empty on
TensorFlow 2.21, so the check reads the graphs TensorFlow's executors run
instead: inside the ``with`` block TensorFlow collects, for every function
it instantiates, the per-device partition graphs (the eager context's
graph collection, which ``tf.summary.trace_on(graph=True)`` also uses).
It needs no environment variable: Keras 3's `fit` inlines the rewritten
step into its own train function (``multi_step_on_iterator`` or
``one_step_on_iterator``), so a ``TF_DUMP_GRAPH_NAME_FILTER`` on the
rewritten step's name finds nothing, and TensorFlow reads that variable
only once, before the first function runs. When the block ends, the swap
operations of LMS's latest rewrite (`lms.last_run`) are looked up in the
collected graphs.

TensorFlow partitions a function when it first runs it, so the block must
contain that first call (the first `fit` with the callback, the first call
of `lms.function(step)`). The graphs are kept in memory until the block
ends: use it to check, not in every training run. It takes over graph
collection for the block (`tf.summary.trace_on(graph=True)` around it
misses the block's graphs).
"""

import contextlib
import dataclasses
import glob
import os

import tensorflow as tf

from tflms.tf import function_api

__all__ = ["SwapsRan", "watch_swaps", "checked", "partition_graph_files",
           "swap_ops_in_partition_graphs", "swap_ops_in_graph_defs"]


@dataclasses.dataclass
class SwapsRan:
    """Which of a rewrite's swap operations ran.

    Attributes:
      expected: the swap-out and swap-in operations LMS added (names as in
        `RunResult.swapout_ops` and `swapin_ops`); empty before the block
        ends, or when LMS added none.
      ran: ``{name: device}`` of those found in the partition graphs
        TensorFlow ran.
      missing: the expected operations found in no partition graph.
      partition_graphs: how many partition graphs TensorFlow made in the
        block.
    """

    expected: tuple = ()
    ran: dict = dataclasses.field(default_factory=dict)
    missing: tuple = ()
    partition_graphs: int = 0

    @property
    def all_ran(self):
        """True if LMS added swap operations and every one of them ran."""
        return bool(self.expected) and not self.missing

    def __str__(self):
        if not self.expected:
            return ("LMS added no swap operations (no rewrite ended inside "
                    "the block, or the plan needed none)")
        devices = sorted(set(self.ran.values()))
        text = "%d of the %d swap operations LMS added ran" % (
            len(self.ran), len(self.expected))
        if devices:
            text += " (on %s)" % ", ".join(devices)
        if self.missing:
            text += "; not in any of the %d partition graphs: %s" % (
                self.partition_graphs, ", ".join(self.missing))
        return text


def checked(result, graph_defs):
    """A `SwapsRan`: which swap ops of `result` (a `RunResult`, or None)
    are in `graph_defs`, the partition graphs TensorFlow ran."""
    expected = (tuple(result.swapout_ops) + tuple(result.swapin_ops)
                if result is not None else ())
    found = swap_ops_in_graph_defs(graph_defs, expected)
    ran = {name: found[name] for name in expected if name in found}
    return SwapsRan(expected=expected, ran=ran,
                    missing=tuple(n for n in expected if n not in ran),
                    partition_graphs=len(graph_defs))


@contextlib.contextmanager
def watch_swaps(lms):
    """Context manager: has TensorFlow collect the partition graphs of the
    functions it runs inside the block, and yields a `SwapsRan` that, when
    the block ends, says which swap operations of `lms.last_run` ran.

    Args:
      lms: the `LMS` whose rewrite runs inside the block (the callback
        given to `fit`, or the LMS whose `function` made the step).
    """
    swaps = SwapsRan()
    with function_api.partition_graphs_made() as graph_defs:
        yield swaps
    found = checked(lms.last_run, graph_defs)
    for field in dataclasses.fields(SwapsRan):
        setattr(swaps, field.name, getattr(found, field.name))


# ---- the swap ops in partition graphs --------------------------------------
def partition_graph_files(dump_dir):
    """The per-device partition graphs (``.pbtxt`` paths) TensorFlow wrote
    into `dump_dir`, the folder of ``TF_DUMP_GRAPH_PREFIX``: the graphs its
    executors run."""
    return set(glob.glob(os.path.join(dump_dir, "*_partition_*.pbtxt")))


def swap_ops_in_partition_graphs(paths, names=()):
    """``{swap op name: device}`` of LMS's swap ops in the partition graphs
    at `paths`, reading only the last graph TensorFlow dumped per function
    and device (``<name>.<n>.pbtxt``, the highest ``n``); names as
    `swap_ops_in_graph_defs` gives them."""
    # Imported here: only this check reads text protos.
    from google.protobuf import text_format
    last = {}
    for path in paths:
        base = os.path.basename(path)[:-len(".pbtxt")]
        key, seq = base.split(".")[0], int(base.split(".")[1])
        if key not in last or seq > last[key][0]:
            last[key] = (seq, path)
    graph_defs = []
    for _, path in last.values():
        graph_def = tf.compat.v1.GraphDef()
        with open(path, encoding="utf-8") as f:
            text_format.Parse(f.read(), graph_def)
        graph_defs.append(graph_def)
    return swap_ops_in_graph_defs(graph_defs, names)


def swap_ops_in_graph_defs(graph_defs, names=()):
    """``{swap op name: device}`` of LMS's swap ops in `graph_defs`.

    Inlining prefixes the names of a function's ops, and a swap-in's name
    starts with its tensor's op (`rewriter.swapin_op_name`): a swap op is
    known by the part of its name from ``lms/`` on (``.../conv/Relu-lms/
    swapin_conv_Relu_0`` by ``lms/swapin_conv_Relu_0``), which is unique.
    The keys are the names in `names` (such as `RunResult.swapin_ops`)
    that were found, and ``lms/...`` for swap ops not in `names`."""
    given = {"lms/" + n.rpartition("lms/")[2]: n for n in names}
    found = {}
    for graph_def in graph_defs:
        for node in graph_def.node:
            # Swap ops are Identity ops: TensorFlow's own nodes named
            # after them (a NoOp grouping a swap-in's cross-device
            # triggers, sends and receives) are not.
            if node.op != "Identity":
                continue
            _, sep, own = node.name.rpartition("lms/")
            if sep and own.startswith(("swapout_", "swapin_")):
                key = "lms/" + own
                found[given.get(key, key)] = node.device
    return found
