"""The ``tflms`` argument parser: `plan` and `verify`, the LMS settings'
flags (from `tflms.settings`), and the `LMS` the parsed arguments ask for
(`lms_from_args`)."""

import argparse

from tflms import setting_flags
from tflms._argparse_types import nonnegative_float, positive_int


def build_parser():
    """The ``tflms`` argument parser (sub-commands ``plan``, ``verify``,
    ``capacity``)."""
    parser = argparse.ArgumentParser(
        prog="tflms",
        description="TensorFlow Large Model Support tools.")
    commands = parser.add_subparsers(dest="command", title="commands")
    commands.required = True
    plan = commands.add_parser(
        "plan",
        help="predict device memory with and without LMS for a saved graph",
        description=(
            "Load a saved training graph, let LMS plan it as it would before "
            "training, and print the expected device memory peak of one step "
            "without and with LMS, the swapping parameters, the bytes "
            "swapped and their transfer time per step, and write the memory "
            "plots. No GPU needed. Exit status 0: fits; 1: cannot fit; "
            "2: error."),
        epilog=("GRAPH is a MetaGraph file (.meta), a SavedModel folder, or a "
                "Keras model (.h5, .keras, or a Keras SavedModel folder). "
                "Example: tflms plan model.h5 --batch-size 32 "
                "--autotune-gpu-mem 16"))
    _graph_arguments(plan, plan_output=True)
    verify = commands.add_parser(
        "verify",
        help="train a saved graph a few steps with and without LMS and "
             "compare",
        description=(
            "Load a saved training graph twice, rewrite one copy with LMS, "
            "train both copies a few steps on this machine's CPU from the "
            "same variable values and the same random inputs (with oneDNN "
            "as TensorFlow has it here: TF_ENABLE_ONEDNN_OPTS), and compare "
            "losses, every variable, the global step and which ops ran. "
            "A model saved by Keras 3 (TensorFlow 2.16+): its "
            "model.train_step trained with tf.function and with "
            "lms.function, losses and every variable compared, every swap "
            "op found in the graphs TensorFlow ran. "
            "Exit status 0: identical; 1: any difference; 2: error."),
        epilog=("GRAPH as for `tflms plan`; the train op comes from the "
                "graph's train_op collection unless --train-op names it. "
                "Examples: tflms verify model.meta --batch-size 8 "
                "--autotune-gpu-mem 4; tflms verify model.keras "
                "--batch-size 8 --autotune-gpu-mem 4"))
    _graph_arguments(verify)
    _capacity_arguments(commands)
    for flag in _PLAN_ONLY_FLAGS:
        # No default: an unused flag sets no attribute, so the settings
        # read from the arguments keep their own defaults (plot_dir).
        verify.add_argument(flag, action=_PlanOnly, nargs=0,
                            default=argparse.SUPPRESS,
                            help=argparse.SUPPRESS)
    check = verify.add_argument_group("verification")
    check.add_argument("--steps", type=positive_int, default=3, metavar="N",
                       help="training steps per copy (default 3)")
    check.add_argument("--train-op", action="append", default=[],
                       metavar="NAME",
                       help="op that runs one training step (repeatable); "
                            "default: the train_op collection")
    check.add_argument("--loss-tensor", default=None, metavar="NAME",
                       help="tensor to compare at every step; default: the "
                            "first of the losses collection")
    check.add_argument("--rtol", type=float, default=0.0,
                       help="relative tolerance; default 0: bit-identical")
    return parser


# LMS settings `tflms plan` and `tflms verify` take, in --help order, and
# the spellings of earlier versions they still accept.
_SETTING_FLAGS = ("batch_size", "autotune_gpu_mem", "autotune_host_mem",
                  "swapout_threshold",
                  "swapin_ahead", "swapin_groupby", "sync_mode", "recompute",
                  "serialization", "serialization_by_size", "cpu_device",
                  "gpu_device", "offload_optimizer", "interconnect", "gpu")
_OLD_FLAGS = {"autotune_gpu_mem": ["--gpu-mem"]}


def _model_arguments(sub, settings, verb, note=""):
    """The graph, the LMS `settings`' flags and the Keras models' --loss
    and --optimizer, which every command takes."""
    sub.add_argument("graph", metavar="GRAPH",
                     help="the saved model or graph to %s" % verb)
    lms = sub.add_argument_group(
        "LMS settings", "As the LMS settings of the same names "
        "(docs/parameters.md)%s." % note)
    setting_flags.add_arguments(lms, settings, aliases=_OLD_FLAGS)
    keras = sub.add_argument_group("Keras models")
    keras.add_argument("--loss", default=None,
                       help="loss to compile with (default: the saved one, "
                            "else 'mse')")
    keras.add_argument("--optimizer", default=None,
                       help="optimizer to compile with (default: the saved "
                            "one, else 'adam')")


def _tag_argument(group):
    group.add_argument("--tag", default=None,
                       help="SavedModel tag set to load, comma-separated "
                            "(default: 'train' if present, else the first)")


def _graph_arguments(sub, plan_output=False):
    """Arguments `plan` and `verify` share: the graph and LMS's settings;
    with `plan_output`, `plan`'s own flags for plots, the oracle and
    progress lines.

    The settings' flags come from `tflms.settings` (names, converters,
    defaults and help), like the example scripts'."""
    _model_arguments(sub, _SETTING_FLAGS, "plan",
                     "; -1 lets the auto-tuner choose")
    other = sub.add_argument_group("graphs and output")
    _tag_argument(other)
    other.add_argument("--inference", action="store_true",
                       help="plan for inference: lms.is_training = False, "
                            "and for Keras models the forward graph only "
                            "(no loss, no train function)")
    other.add_argument("--json", action="store_true",
                       help="print the report as one JSON object")
    other.add_argument("-v", "--verbose", action="store_true",
                       help="show LMS's own [LMS] log lines and "
                            "TensorFlow's INFO and WARNING lines (on "
                            "stderr)")
    if plan_output:
        _plan_output_arguments(other)


# `plan`'s output flags, which `verify` (it trains and compares, it draws
# and measures nothing) refuses instead of ignoring.
_PLAN_ONLY_FLAGS = ("--plot-dir", "--no-plots", "--oracle", "--progress",
                    "--no-progress")


def _plan_output_arguments(other):
    """`plan`'s flags for plots, the oracle and progress lines, added to
    its argument group `other`."""
    setting_flags.add_arguments(other, ("plot_dir",))
    other.add_argument("--no-plots", action="store_true",
                       help="do not write plots")
    other.add_argument("--oracle", action="store_true",
                       help="also measure the step without and with LMS on "
                            "Grappler's virtual GPU (tflms.tf.oracle: "
                            "TensorFlow's own placement and schedule, "
                            "replayed with the executor's buffer rules); "
                            "slower than the simulator")
    other.add_argument("--progress", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="one line per phase (loading, planning, plots) "
                            "on stderr while it works; default: when stderr "
                            "is a terminal")


# LMS settings `tflms capacity` takes (the batch is what it searches).
_CAPACITY_SETTING_FLAGS = ("autotune_gpu_mem", "autotune_host_mem", "gpu",
                           "interconnect", "recompute", "cpu_device",
                           "offload_optimizer")


def _capacity_arguments(commands):
    """`tflms capacity`: the graph, the settings it plans with, the
    search's bounds and outputs."""
    sub = commands.add_parser(
        "capacity",
        help="find the largest batch (or longest sequence) a GPU trains "
             "without LMS, with LMS and within an overhead",
        description=(
            "Load a saved training graph and find, by galloping then "
            "binary search over the batch size, the largest batch whose "
            "step fits the device budget without LMS, the largest LMS can "
            "plan to fit, and (--max-overhead) the largest whose predicted "
            "step with LMS is within PCT% of the step without LMS at the "
            "same batch. Prints the batches tried (predicted peaks without "
            "and with LMS, step times, samples per second, bytes moved each "
            "way, the floor no plan goes below). --dimension sequence "
            "searches the sequence length of a Keras 3 model instead, with "
            "the batch fixed (--batch-size): axis 1 of every input the "
            "model leaves unknown, up to the longest the model was built "
            "for (a KerasHub backbone's max_sequence_length). Every number "
            "is a prediction (simulator and step-time model). No GPU "
            "needed. Exit status 0: some size fits; 1: none; 2: error."),
        epilog=("GRAPH as for `tflms plan`; its batch dimension must be "
                "free (a Keras model, or placeholders of shape [None, "
                "...]); a Keras 3 model is traced once per batch. Example: "
                "tflms capacity model.keras --autotune-gpu-mem 16 "
                "--gpu V100-SXM2-16GB --max-overhead 10 --plot capacity.png; "
                "tflms capacity gpt2.keras --dimension sequence "
                "--batch-size 8 --autotune-gpu-mem 16"))
    sub.set_defaults(inference=False, no_plots=True, oracle=False)
    _model_arguments(sub, _CAPACITY_SETTING_FLAGS, "search")
    search = sub.add_argument_group("search and output")
    search.add_argument("--max-overhead", type=nonnegative_float,
                        default=None, metavar="PCT",
                        help="also find the largest batch (or longest "
                             "sequence) whose predicted step with LMS is "
                             "within PCT%% of the step without LMS at the "
                             "same size")
    search.add_argument("--dimension", choices=DIMENSIONS, default="batch",
                        help="what to search: the batch (default), or the "
                             "sequence length (Keras 3 models; axis 1 of "
                             "every input whose axis 1 is unknown) at the "
                             "batch --batch-size fixes")
    search.add_argument("--batch-size", type=positive_int, default=None,
                        metavar="N",
                        help="the fixed batch of --dimension sequence")
    search.add_argument("--start-batch", type=positive_int, default=None,
                        metavar="N", help="first batch tried (default 1)")
    search.add_argument("--max-batch", type=positive_int,
                        default=None, metavar="N",
                        help="largest batch tried (default 1048576)")
    search.add_argument("--start-sequence", type=positive_int, default=None,
                        metavar="N", help="first sequence length tried "
                        "(--dimension sequence; default 1)")
    search.add_argument("--max-sequence", type=positive_int, default=None,
                        metavar="N", help="longest sequence tried "
                        "(--dimension sequence; default: the longest the "
                        "model was built for, else 1048576)")
    search.add_argument("--json", default=None, metavar="FILE",
                        help="write the answers and every batch (or "
                             "sequence length) tried to FILE as JSON")
    search.add_argument("--plot", default=None, metavar="FILE",
                        help="draw samples per second against the batch "
                             "(tokens per second against the sequence "
                             "length), without and with LMS, to FILE (PNG; "
                             "needs matplotlib)")
    search.add_argument("--oracle", action="store_true",
                        help="measure the largest batch without LMS and the "
                             "largest with LMS again on Grappler's virtual "
                             "GPU (as tflms plan --oracle), beside the "
                             "simulator's peaks")
    _tag_argument(search)
    search.add_argument("-v", "--verbose", action="store_true",
                        help="show TensorFlow's INFO and WARNING lines")
    search.add_argument("--progress", action=argparse.BooleanOptionalAction,
                        default=None,
                        help="one line per batch on stderr while it works; "
                             "default: when stderr is a terminal")


# The dimensions `tflms capacity --dimension` searches (as
# `tflms.capacity.DIMENSIONS`, not imported here to keep --help quick).
DIMENSIONS = ("batch", "sequence")

# Each dimension's own flags, which the other refuses.
_DIMENSION_FLAGS = {"batch": ("start_batch", "max_batch"),
                    "sequence": ("batch_size", "start_sequence",
                                 "max_sequence")}


def check_capacity_arguments(parser, args):
    """`tflms capacity`'s flags that go together: the other dimension's
    flags refused (an argument error naming the flag and the fix), the
    fixed batch required for the sequence, the bounds' defaults set."""
    other = "sequence" if args.dimension == "batch" else "batch"
    for name in _DIMENSION_FLAGS[other]:
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            parser.error(
                "argument %s: %s %s is a flag of --dimension %s, and this "
                "search is over the %s%s: remove %s, or add --dimension %s"
                % (flag, flag, getattr(args, name), other, args.dimension,
                   " (the default)" if args.dimension == "batch" else "",
                   flag, other))
    if args.dimension == "sequence":
        if args.batch_size is None:
            parser.error(
                "argument --batch-size: --dimension sequence searches the "
                "sequence length at a fixed batch: pass --batch-size N "
                "(the batch you train with)")
        if args.oracle:
            parser.error(
                "argument --oracle: the oracle measures batches as tflms "
                "plan does, which traces a Keras 3 model at its saved "
                "shapes, not at a sequence length: remove --oracle with "
                "--dimension sequence")
        if args.start_sequence is None:
            args.start_sequence = 1
        return
    if args.start_batch is None:
        args.start_batch = 1
    if args.max_batch is None:
        args.max_batch = 1 << 20


class _PlanOnly(argparse.Action):
    """`verify`'s answer to `plan`'s output flags: an argument error."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            "%s is an option of `tflms plan`, not of `tflms verify`: verify "
            "trains the graph on this machine's CPU with and without LMS and "
            "compares the results; it writes no plots and measures no "
            "memory. Remove %s, or run `tflms plan GRAPH %s` for that."
            % (option_string, option_string, option_string))


def lms_from_args(args, loaded=None):
    """An `LMS` with the command line's settings
    (`setting_flags.from_arguments`); for a loaded graph without a backward
    phase, or with --inference, it plans for inference."""
    from tflms import lms as _lms
    overrides = {}
    if loaded is not None:
        overrides["is_training"] = loaded.training and not args.inference
    return _lms.LMS.from_settings(
        setting_flags.from_arguments(args, **overrides))
