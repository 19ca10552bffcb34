"""Every LMS setting, in one frozen object.

`Settings` is the single description of what LMS can be told: each field
carries its default, its check (Python value -> normalised value, or a
`ValueError` naming the setting, the value and the fix), its command-line
converter and help, and its documentation. The `LMS` constructor and
properties, the ``tflms`` command's flags, the example scripts' flags and
the tables of docs/parameters.md (``python tools/docs_tables.py``) are all
made from these fields, so adding a setting means adding one field here
(and using it). The flags are made in `tflms.setting_flags`.

This module and its checks (`tflms.validation`) import only the standard
library, so the example scripts can build their ``--help`` without loading
TensorFlow.

One module: the one declaration of the settings and what is made from
its fields (checks in `tflms.validation`, tables in tools/docs_tables.py).
"""

import argparse
import dataclasses
import functools

from tflms import _argparse_types as T
from tflms import hardware
from tflms import validation as V

__all__ = [
    "AUTO",
    "Settings",
    "fields",
    "parse_serialization",
    "serialization_slices",
]

# A swap parameter set to AUTO is chosen by the auto-tuner.
AUTO = V.AUTO

CONSTRUCTOR = "constructor"  # an argument of LMS(...)
PROPERTY = "property"        # set on the LMS object after construction

_FILTER_KINDS = (
    ("excl_output_by_scopes",
     "Tensors made by operations whose names start with one of these "
     "prefixes are never swapped."),
    ("excl_output_by_types",
     "Tensors made by operations of these types (e.g. `'Conv2D'`) are never "
     "swapped."),
    ("excl_input_by_scopes",
     "Operations whose names start with one of these prefixes never read a "
     "swapped-in tensor (they keep reading the original, which therefore "
     "stays on the device until they ran)."),
    ("excl_input_by_types", "The same, by operation type."),
    ("incl_output_by_scopes",
     "When not empty, only tensors made by operations under these prefixes "
     "may be swapped (the `excl_` sets still apply)."),
    ("incl_output_by_types",
     "When not empty, only tensors made by operations of these types may be "
     "swapped."),
    ("incl_input_by_scopes",
     "When not empty, only operations under these prefixes may read "
     "swapped-in tensors."),
    ("incl_input_by_types",
     "When not empty, only operations of these types may read swapped-in "
     "tensors."),
)
FILTER_NAMES = tuple(name for name, _ in _FILTER_KINDS)


# ---- checks: Python value -> normalised value ------------------------------
# A field's check is ``check(value, setting_name)``. Most checks of
# `tflms.validation` serve one setting and name it themselves; the few that
# serve several (booleans, name sets, folders) take the name first.
def _one(check):
    """A check of one setting's value as a field's check."""
    def field_check(value, setting):
        del setting  # the check names its one setting itself
        return check(value)
    field_check.__name__ = check.__name__
    return field_check


def _named(check):
    """A ``check(setting_name, value)`` shared by settings, as a field's
    check."""
    def field_check(value, setting):
        return check(setting, value)
    field_check.__name__ = check.__name__
    return field_check


def _check_serialization(value, setting):
    del setting
    serialization_slices(value)  # raises for a bad entry
    return tuple(value)


# ---- serialization: the one parser of each form ----------------------------
def parse_serialization(text):
    """Command-line text ``"1,3:5"`` -> ``(1, "3:5")`` for `serialization`.

    Items are level numbers or Python slice strings; empty text means none.

    Raises:
      argparse.ArgumentTypeError: for an item that is neither.
    """
    if text is None:
        return ()
    items = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            value = item
        try:
            serialization_slices([value])
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        items.append(value)
    return tuple(items)


def serialization_slices(spec):
    """Validate a `serialization` setting and normalise it to slices.

    Args:
      spec: iterable of level indices (int) and Python-slice strings such as
        ``'3:5'`` (levels 3 and 4), ``'10:'``, ``':4'`` or ``'2:20:2'``.

    Returns:
      A tuple of `slice` objects.

    Raises:
      ValueError: naming the entry that cannot be parsed.
    """
    if isinstance(spec, (str, bytes)) or not hasattr(spec, "__iter__"):
        raise ValueError(
            "serialization must be a list of level indices or 'a:b' slice "
            "strings, e.g. [1, '3:5']; got %r" % (spec,))
    return tuple(_slice_of(item) for item in spec)


def _slice_of(item):
    if isinstance(item, bool):
        raise ValueError("serialization entries must be ints or 'a:b' "
                         "strings; got %r" % (item,))
    if isinstance(item, int):
        if item < 0:
            raise ValueError("serialization level must be >= 0; got %d"
                             % item)
        return slice(item, item + 1)
    if isinstance(item, str):
        text = item.strip()
        try:
            if ":" in text:
                parts = [int(x) if x.strip() else None
                         for x in text.split(":")]
                # A slice has at most three parts and its step cannot be 0.
                if len(parts) <= 3 and not (len(parts) == 3
                                            and parts[2] == 0):
                    return slice(*parts)
            else:
                value = int(text)
                if value >= 0:
                    return slice(value, value + 1)
        except ValueError:
            pass
    raise ValueError(
        "serialization entry %r cannot be parsed; use a level index such "
        "as 7 or a Python slice string such as '3:5' (levels 3 and 4)"
        % (item,))


def _names_text(text):
    """Command-line text ``"a,b"`` -> ``frozenset({"a", "b"})``."""
    return frozenset(item.strip() for item in text.split(",") if item.strip())


def _setting(default, check, doc, kind=CONSTRUCTOR, flag=None, text=None,
             metavar=None, shown_default=None):
    """A dataclass field with its description.

    Args:
      default: the default value (already normalised).
      check: ``check(value, setting_name)`` -> normalised value.
      doc: the Effect column of docs/parameters.md (Markdown).
      kind: CONSTRUCTOR or PROPERTY.
      flag: help text of the command-line flag; None: no flag.
      text: command-line converter (text -> value); None: a switch
        (``store_true``) for booleans.
      metavar: shown for the flag's value.
      shown_default: the Default column, when ``repr(default)`` is not it.
    """
    return dataclasses.field(default=default, metadata={
        "check": check, "doc": doc, "kind": kind, "flag": flag,
        "text": text, "metavar": metavar, "shown_default": shown_default})


@dataclasses.dataclass(frozen=True)
class Settings:
    """What LMS was told, checked and normalised.

    Build it with keywords (``Settings(swapout_threshold=40)``), change it
    with `replace`. Every value is checked when the object is made; a bad
    one raises `ValueError` naming the setting, the value and what is
    allowed.
    """

    swapout_threshold: int = _setting(
        AUTO, _one(V.check_threshold),
        "A tensor is swapped out when one of its readers runs more than this "
        "many levels after the tensor was made; only those far readers get "
        "it through a swap-in, nearer readers keep reading the original. "
        "Smaller: more tensors swapped, less device memory, more transfers. "
        "Integer >= 1, or -1.",
        flag="swap a tensor for readers more than N levels after it was "
             "made (default -1: auto)",
        text=T.auto_int(1), metavar="N", shown_default="`-1` (auto)")
    swapin_groupby: int = _setting(
        AUTO, _one(V.check_groupby),
        "Far readers of the same tensor whose levels are within this "
        "distance of each other share one swap-in. Larger: fewer copies "
        "back, but the tensor stays on the device from the first to the last "
        "reader of the group. 0: one swap-in per reader level. Integer >= 0, "
        "or -1.",
        flag="readers within N levels share one swap-in (default -1: auto)",
        text=T.auto_int(0), metavar="N", shown_default="`-1` (auto)")
    swapin_ahead: int = _setting(
        AUTO, _one(V.check_ahead),
        "How early a tensor comes back: its swap-in is started by a control "
        "dependency from an operation on the reader's path at a level lower "
        "than (reader's level - `swapin_ahead`), as late as possible within "
        "that. Larger: the copy has more time to finish (less waiting), but "
        "the tensor occupies device memory longer. Integer >= 1, or -1. If "
        "no suitable operation exists, the swap-in waits for the reader's "
        "other inputs instead.",
        flag="start swap-ins more than N levels before their reader "
             "(default -1: auto)",
        text=T.auto_int(1), metavar="N", shown_default="`-1` (auto)")
    sync_mode: int = _setting(
        0, _one(V.check_sync_mode),
        "0: copies run asynchronously with computation. 1: synchronous "
        "swap-outs: the tensor's remaining device readers wait until its "
        "copy to the host has finished. 2: synchronous swap-ins: each "
        "swap-in waits for the reader's other inputs, so the tensor comes "
        "back just in time (`swapin_ahead` and `swapin_groupby` are then "
        "ignored). 3: both. Synchronous modes make computation wait for the "
        "copies, so device memory is freed and refilled when the plan says "
        "rather than when a slow link gets there; they give up overlapping "
        "copies with computation. Auto-tuning raises the mode by itself when "
        "nothing fits.",
        flag="0 async, 1 sync swap-outs, 2 sync swap-ins, 3 both "
             "(default 0)",
        text=T.choice_int((0, 1, 2, 3)), metavar="{0,1,2,3}")
    recompute: object = _setting(
        None, _one(V.check_recompute),
        "Also consider making a swapped tensor again, just before its far "
        "readers, from tensors on the device then, by cloning the "
        "stateless operations that made it (ReLU, batch norm in training "
        "mode, add, concat, pooling...), instead of copying it out and "
        "back. The values are bit-identical. `None` (the default): when "
        "auto-tuning, a swap is replaced where the plan still fits the "
        "budget with its copies timed (`interconnect`) and the predicted "
        "step (`gpu`, `interconnect`) is shorter, and the clones may then "
        "go through convolutions and matrix products too; the tuner keeps "
        "the plan with the least predicted step and logs the recomputes "
        "it chose. With fixed parameters nothing is recomputed. `True`: "
        "the same when auto-tuning, and with fixed parameters too (cheap "
        "operations only, at most four per tensor) where a recompute "
        "peaks no higher than the swap-only plan and moves fewer bytes "
        "(which needs `batch_size` for unknown dimensions). `False`: "
        "swaps only, never a cloned operation in the graph. Recomputes cost "
        "compute instead of transfers (docs/benchmarks.md, \"Cheaper plans "
        "at the same size\").",
        flag="recompute swapped tensors by cloning the operations that "
             "made them, where that pays (default: when auto-tuning; "
             "--recompute also with fixed parameters, --no-recompute "
             "never)",
        shown_default="`None` (when auto-tuning)")
    serialization: tuple = _setting(
        (), _check_serialization,
        "Levels whose operations run one at a time, chained by control "
        "dependencies: a list of level indices and Python slice strings, "
        "e.g. `[1, '3:5']` is levels 1, 3 and 4, `['10:']` every level from "
        "10. Levels are those of the original sort. Use it when the "
        "operations of one level make large outputs that cannot all be on "
        "the device at once.",
        flag="levels to serialize: comma list of levels and slices, "
             "e.g. 1,3:5",
        text=parse_serialization, metavar="LEVELS", shown_default="`[]`")
    serialization_by_size: float = _setting(
        0.0, _one(V.check_serialization_by_size),
        "Also serialize every level whose device operations' outputs "
        "together exceed this many GiB.",
        flag="serialize levels whose outputs exceed this many GiB (0: off)",
        text=T.nonnegative_float, metavar="GIB", shown_default="`0` (off)")
    debug: bool = _setting(
        False, _named(V.check_bool),
        "Log details: with `debug_level=1` the operations of every level "
        "and, for each swapped tensor, its swap-ins and their triggers; with "
        "2 also which operations wait for swap-outs.",
        flag="log LMS details")
    debug_level: int = _setting(
        1, _one(V.check_debug_level), "1 or 2; see `debug`.",
        flag="detail of the debug log (default 1)",
        text=T.choice_int((1, 2)), metavar="{1,2}")
    cpu_device: str = _setting(
        "/cpu:0", _one(V.check_cpu_device),
        "Where the swap operations run (their outputs live in host memory): "
        "the host. Must name a CPU device; every other device the step "
        "computes on is managed, a logical `'/cpu:1'` beside it included.",
        flag="device of the swap operations (default /cpu:0)",
        text=str, metavar="DEVICE")
    gpu_device: object = _setting(
        None, _one(V.check_gpu_device),
        "Only operations placed on this device are managed (their tensors "
        "swapped, their swap-ins started there), e.g. `'/device:GPU:1'`. "
        "`None`: every operation not placed on the host (`cpu_device`), "
        "including unplaced ones (which TensorFlow puts on the GPU). "
        "Multi-tower models run one LMS per device.",
        flag="plan only for ops on this device, e.g. /device:GPU:0 "
             "(default: every op not on the host, cpu_device)",
        text=str, metavar="DEVICE")
    offload_optimizer: object = _setting(
        False, _one(V.check_offload_optimizer),
        "`True`: keep the optimizer's slots (Adam's moments, momentum...) "
        "in host memory and run each variable's update there, as "
        "ZeRO-Offload does: the gradient goes to `cpu_device` once it is "
        "made, the new weights come back to the device variable. Frees "
        "the slots' device memory for copies of the gradients and "
        "weights over the link per step. `'auto'`: only when no plan "
        "fits the device without it. Session graphs (and Keras 2's) "
        "only (docs/offload.md).",
        flag="optimizer slots and updates on the host (docs/offload.md)")
    batch_size: object = _setting(
        None, _one(V.check_batch_size),
        "Mini-batch size, used for the first unknown dimension of every "
        "shape when sizing tensors. Keras `fit()` with arrays sets it from "
        "its `batch_size`; set it yourself for generators, `Sequence`s and "
        "graphs with `None` batch dimensions when auto-tuning.",
        kind=PROPERTY,
        flag="mini-batch size, for shapes whose batch dimension is unknown",
        text=T.positive_int, metavar="N")
    is_training: bool = _setting(
        True, _named(V.check_bool),
        "Learning mode to plan for: decides which branch of Keras' "
        "learning-phase conditionals and which fused batch-norm operations "
        "run. Set `False` for inference-only graphs.",
        kind=PROPERTY)
    order_peaks: bool = _setting(
        True, _named(V.check_bool),
        "When auto-tuning finds no plan that fits, look for control edges "
        "that make one operation of a crowded level run before another (a "
        "filter gradient that frees a swapped-in tensor before the input "
        "gradient that allocates one as large), search again with them, and "
        "keep them in the plan. When the plan found needs synchronous "
        "swap-ins (`sync_mode` 2 or 3), also search with such edges and "
        "keep them if that plan's predicted step is shorter. They change "
        "when operations run, never what they compute. `False`: neither "
        "(report that nothing fits; keep the synchronous plan).",
        kind=PROPERTY)
    autotune_gpu_mem: object = _setting(
        None, _one(V.check_gpu_mem),
        "GiB of device memory the auto-tuner plans for; `None` asks "
        "TensorFlow for the GPU's memory (an error on a machine without a "
        "GPU).",
        kind=PROPERTY,
        flag="device memory to plan for, in GiB (default: this machine's "
             "GPU's). The budget is this times TF_LMS_SIMULATOR_MEM_RATIO "
             "(default 0.9)",
        text=T.positive_float, metavar="GIB")
    autotune_host_mem: object = _setting(
        None, _one(V.check_host_mem),
        "GiB of host memory the swapped tensors may use at once; `None`: "
        "this machine's physical memory divided by the training processes "
        "on it (Horovod / MPI local size). Swapped tensors live in pinned "
        "host memory, which the system cannot page out. When the plan that "
        "fits the device needs more, auto-tuning recomputes swapped "
        "tensors instead (as `recompute` does, whatever its value) until "
        "it fits, and raises if it cannot; the log says which memory bound "
        "the plan. Fixed parameters are applied as given, with a warning.",
        kind=PROPERTY,
        flag="host memory swapped tensors may use, in GiB (default: this "
             "machine's physical memory / processes on the node)",
        text=T.positive_float, metavar="GIB")
    interconnect: str = _setting(
        hardware.DEFAULT_INTERCONNECT, _one(V.check_interconnect),
        "The CPU-GPU link the auto-tuner counts copy times at: a swapped "
        "tensor stays on the device until its copy to the host has "
        "finished, and a swapped-in copy occupies the device from the start "
        "of its copy, as predicted by the step-time model "
        "(docs/performance.md) on `gpu` and this link. The plan the tuner "
        "returns fits the budget with copies that take that long (by "
        "default: at PCIe 4.0 x16 speed on a V100); fixed parameters are "
        "applied as given. One of %s, or `'instant'`: copies take no time "
        "(the tuner's accounting before copy times were counted; the "
        "choice among fitting plans is then by bytes moved). Auto-tuning "
        "also chooses, among the plans that fit, the one with the least "
        "step time predicted on `gpu` and this link, and `recompute` "
        "weighs clones against transfers on them. `tflms plan` also "
        "predicts the step time on it." % ", ".join(
            "`'%s'` (%s)" % (name, link.label)
            for name, link in hardware.INTERCONNECTS.items()),
        kind=PROPERTY,
        flag="CPU-GPU link copies are timed at: %s, or instant (default "
             "%s)" % (", ".join(hardware.INTERCONNECTS),
                      hardware.DEFAULT_INTERCONNECT),
        text=str, metavar="LINK",
        shown_default="`'%s'`" % hardware.DEFAULT_INTERCONNECT)
    gpu: str = _setting(
        hardware.DEFAULT_GPU, _one(V.check_gpu),
        "The GPU whose published peak rates time the operations when the "
        "auto-tuner counts copy times and predicts step times (see "
        "`interconnect`): faster operations leave a copy fewer of them to "
        "hide behind. It does not set the memory budget "
        "(`autotune_gpu_mem` does). One of %s."
        % ", ".join("`'%s'`" % name for name in hardware.GPUS),
        kind=PROPERTY,
        flag="GPU whose peak rates time the ops: %s (default %s)" % (
            ", ".join(hardware.GPUS), hardware.DEFAULT_GPU),
        text=str, metavar="GPU")
    grappler_check: bool = _setting(
        False, _named(V.check_bool),
        "After the rewrite, compare Grappler's optimization of the step "
        "with and without LMS's edits (fused kernels, nodes removed or "
        "merged, operand order; `tflms.tf.grappler_check`): each difference "
        "is logged with the swaps next to it, the report is "
        "`lms.last_run.grappler`. Costs two more optimizations of the step "
        "(docs/tf2.md); `tflms verify` always runs it.",
        kind=PROPERTY, flag="compare Grappler's optimization of the step "
        "with and without LMS's edits and log the differences")
    grappler_repair: bool = _setting(
        False, _named(V.check_bool),
        "Before the rewrite, apply the plan to a copy of the step and "
        "compare Grappler's optimization of it with the step's "
        "(`grappler_check`); drop from the plan the swaps, recomputes and "
        "control edges next to each difference and try again, up to three "
        "rounds, so that Grappler optimizes the step as without LMS. The "
        "log says what was dropped and the plan's peak after; the last "
        "comparison is `lms.last_run.grappler`. Costs a Grappler "
        "optimization of the step and one more per round (docs/tf2.md).",
        kind=PROPERTY, flag="drop the parts of the plan that make Grappler "
        "optimize the step otherwise than without LMS")
    autotune_plot: bool = _setting(
        False, _named(V.check_bool),
        "Write the expected-memory plots and the distance histogram into "
        "`plot_dir` while auto-tuning.",
        kind=PROPERTY, flag="write the auto-tuner's memory plots")
    plot_dir: str = _setting(
        ".lms", _named(V.check_plot_dir),
        "Folder for those files (created if needed).",
        kind=PROPERTY, flag="folder for the memory plots (default .lms)",
        text=str, metavar="DIR")
    excl_output_by_scopes: frozenset = frozenset()
    excl_output_by_types: frozenset = frozenset()
    excl_input_by_scopes: frozenset = frozenset()
    excl_input_by_types: frozenset = frozenset()
    incl_output_by_scopes: frozenset = frozenset()
    incl_output_by_types: frozenset = frozenset()
    incl_input_by_scopes: frozenset = frozenset()
    incl_input_by_types: frozenset = frozenset()

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            checked = field.metadata["check"](value, field.name)
            object.__setattr__(self, field.name, checked)
        V.check_gpu_not_host(self.gpu_device, self.cpu_device)

    def replace(self, **changes):
        """A copy with `changes`, checked like the constructor's values."""
        unknown = sorted(set(changes) - {f.name for f in fields()})
        if unknown:
            raise ValueError("unknown LMS setting(s) %s; the settings are %s"
                             % (", ".join(unknown), ", ".join(
                                 f.name for f in fields())))
        return dataclasses.replace(self, **changes)

    # ---- what the planner reads -------------------------------------------
    @functools.cached_property
    def serialization_levels(self):
        """`serialization` as a tuple of `slice` objects."""
        return serialization_slices(self.serialization)

    @property
    def autotune_requested(self):
        """True if any of the three swap parameters is left to the tuner."""
        return AUTO in (self.swapout_threshold, self.swapin_ahead,
                        self.swapin_groupby)


def _filter_field(name, doc):
    """Give the eight filter fields their descriptions (they share all but
    the text)."""
    field = Settings.__dataclass_fields__[name]
    field.metadata = _setting(
        frozenset(), _named(V.check_name_set), doc, kind=PROPERTY,
        flag="comma list; see docs/parameters.md", text=_names_text,
        metavar="NAMES").metadata


for _name, _doc in _FILTER_KINDS:
    _filter_field(_name, _doc)
del _name, _doc


def fields(kind=None):
    """The `dataclasses.Field` of every setting (of one `kind`), in order."""
    return tuple(f for f in dataclasses.fields(Settings)
                 if kind is None or f.metadata["kind"] == kind)
