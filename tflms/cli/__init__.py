"""``tflms plan GRAPH``: will this model fit on that GPU, and at what cost?

The planning command loads a saved training graph into a fresh `tf.Graph`,
lets `LMS` rewrite it exactly as it would before training (auto-tuning
included), and reports what the simulator expects of one training step:

* the graph summary (ops, edges, levels of the categorized topological sort,
  learning parameters);
* the device memory peak without LMS and with the plan LMS applied, against
  the budget (``--autotune-gpu-mem`` GiB, or the GPU's memory, times
  ``TF_LMS_SIMULATOR_MEM_RATIO``);
* the swapping parameters and the bytes moved per step, and what those bytes
  cost at common host-device link bandwidths;
* the memory plots (`tflms.plots`).

It needs no GPU: nothing is run, and no session is created except the one
Keras makes while loading weights.

Accepted graphs:

* a MetaGraph file (``.meta``, from ``tf.compat.v1.train.Saver`` or
  ``export_meta_graph``) of a training graph;
* a SavedModel folder written by ``tf.compat.v1.saved_model.Builder``; the
  MetaGraph tagged ``train`` is used when there is one;
* a Keras model: an ``.h5`` / ``.keras`` file or a Keras SavedModel folder
  (``model.save(folder)``). Its training graph is built as ``fit()`` would:
  compiled with the saved loss and optimizer (``--loss`` / ``--optimizer``
  when it was saved without them), then the train function is made.

Exit status: 0 when one step fits the budget (with or without LMS), 1 when
it cannot fit, 2 for bad arguments or a graph that cannot be planned.

While it works, ``tflms plan`` prints one short line per phase on stderr
(``tflms plan [  4.1 s] planning 12,345 ops: ...``) when stderr is a
terminal, or always with ``--progress`` (never with ``--no-progress``); the
report itself goes to stdout. Run as a program (``tflms``, ``python -m
tflms``), the command sets ``TF_CPP_MIN_LOG_LEVEL=2`` for its own process
unless the user set it or passed ``--verbose``, which hides TensorFlow's
C++ INFO and WARNING lines (CPU features, oneDNN, CUDA probing); importing
`tflms.cli` as a library changes nothing.

The modules: commands.py (`main`, the two commands and their errors),
arguments.py (the parser, the settings' flags, `lms_from_args`),
loading.py (`load_graph`), planning.py (`plan_graph` and its
`PlanReport`), rendering.py (`render`, the report as text) and
capacity_command.py (`tflms capacity`). They import TensorFlow and the planning
modules inside the functions that need them, so that ``tflms --help`` and
argument errors do not wait for TensorFlow.
"""

from tflms.cli.arguments import build_parser
from tflms.cli.commands import main
from tflms.cli.loading import PlanError, load_graph
from tflms.cli.planning import LINKS, plan_graph

__all__ = ["LINKS", "PlanError", "build_parser", "load_graph", "plan_graph",
           "main"]
