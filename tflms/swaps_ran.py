"""Did the swaps run? Which of LMS's swap operations TensorFlow ran, for
TensorFlow 2 code (`lms.function(step)`, Keras 3 `fit` with the callback).

    from tflms.swaps_ran import watch_swaps

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

from tflms import _tf_function
from tflms import function

__all__ = ["SwapsRan", "watch_swaps"]


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


def _checked(result, graph_defs):
    expected = (tuple(result.swapout_ops) + tuple(result.swapin_ops)
                if result is not None else ())
    found = function.swap_ops_in_graph_defs(graph_defs, expected)
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
    with _tf_function.partition_graphs_made() as graph_defs:
        yield swaps
    checked = _checked(lms.last_run, graph_defs)
    for field in dataclasses.fields(SwapsRan):
        setattr(swaps, field.name, getattr(checked, field.name))
