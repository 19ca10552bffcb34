"""Command-line flags for LMS, shared by every example.

Each example calls `add_lms_flags(parser)` while building its parser and
`make_lms(args)` once the model is built (or before training starts).  The
flags map one-to-one onto `tflms.LMS` arguments and properties, so the
example scripts never repeat that plumbing:

  --lms                     turn Large Model Support on (off by default)
  --swapout_threshold N     -1 (default) lets the auto-tuner choose
  --swapin_ahead N          -1 (default) lets the auto-tuner choose
  --swapin_groupby N        -1 (default) lets the auto-tuner choose
  --sync_mode {0,1,2,3}
  --serialization 1,3:5     levels to serialize (ints and slices)
  --serialization_by_size G GiB threshold for serializing levels
  --debug, --debug_level {1,2}
  --autotune_gpu_mem G      GiB the auto-tuner plans for (needed without GPU)
  --autotune_plot           write the simulator's memory plots
  --lms_plot_dir DIR        where the plots go (default .lms)

It also holds the two small things every example prints: which device the
graph will run on and the final ``RESULT ...`` line that tests parse.
"""

import argparse
import os
import sys

# Quiet TensorFlow's C++ start-up banner (CPU feature notes and the like);
# warnings and errors still show. A user's own setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

__all__ = [
    "add_lms_flags",
    "add_size_flags",
    "parse_serialization",
    "make_lms",
    "batch_loss_recorder",
    "keras_callbacks",
    "describe_devices",
    "print_result",
]


def parse_serialization(text):
    """Turn ``"1,3:5"`` into ``[1, "3:5"]`` for `LMS(serialization=...)`.

    Items are level numbers or Python slice strings (``start:stop`` or
    ``start:stop:step``, any part may be empty). Empty text means none.
    """
    if text is None:
        return []
    items = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        if ":" in item:
            parts = item.split(":")
            if len(parts) > 3 or not all(
                    p.strip().lstrip("-").isdigit() or not p.strip()
                    for p in parts):
                raise argparse.ArgumentTypeError(
                    "bad serialization slice %r; use e.g. 3:5 or 10:" % item)
            items.append(item)
        else:
            try:
                items.append(int(item))
            except ValueError:
                raise argparse.ArgumentTypeError(
                    "bad serialization level %r; use ints and slices such as "
                    "1,3:5" % item) from None
    return items


def _tflms_type(name):
    """The argparse converter `name` of `tflms._argparse_types` (shared with
    the ``tflms`` command), imported when a flag is first converted: importing
    tflms imports TensorFlow, which the examples load only after parsing so
    that --help answers at once."""
    def convert(text):
        from tflms import _argparse_types  # pylint: disable=import-outside-toplevel
        return getattr(_argparse_types, name)(text)
    convert.__name__ = name
    return convert


_positive_int = _tflms_type("positive_int")
_positive_float = _tflms_type("positive_float")


def add_size_flags(parser, image_size, batch_size, epochs, steps,
                   image_help="height and width of the input images"):
    """The size flags every example has: --image_size, --batch_size,
    --epochs and --steps (optimizer steps per epoch)."""
    group = parser.add_argument_group("sizes")
    if image_size is not None:
        group.add_argument("--image_size", type=_positive_int,
                           default=image_size,
                           help="%s (default %d)" % (image_help, image_size))
    group.add_argument("--batch_size", type=_positive_int, default=batch_size,
                       help="mini-batch size (default %d)" % batch_size)
    group.add_argument("--epochs", type=_positive_int, default=epochs,
                       help="number of epochs (default %d)" % epochs)
    group.add_argument("--steps", type=_positive_int, default=steps,
                       help="training steps per epoch (default %d)" % steps)
    return group


def add_lms_flags(parser):
    """Add the LMS flag group to an `argparse.ArgumentParser`."""
    group = parser.add_argument_group(
        "Large Model Support",
        "Tensor swapping between device and host memory. -1 for the three "
        "swap parameters asks the auto-tuner to pick them; on a machine "
        "without a GPU it also needs --autotune_gpu_mem.")
    group.add_argument("--lms", action="store_true",
                       help="enable Large Model Support")
    group.add_argument("--swapout_threshold", type=int, default=-1,
                       help="swap a tensor out when a consumer is more than "
                            "this many levels after its producer (-1: auto)")
    group.add_argument("--swapin_ahead", type=int, default=-1,
                       help="start each swap-in this many levels before its "
                            "consumer (-1: auto)")
    group.add_argument("--swapin_groupby", type=int, default=-1,
                       help="consumers within this many levels share one "
                            "swap-in (-1: auto)")
    group.add_argument("--sync_mode", type=int, choices=(0, 1, 2, 3),
                       default=0,
                       help="0 async copies, 1 wait for swap-outs, 2 wait "
                            "for swap-ins, 3 both (default 0)")
    group.add_argument("--serialization", type=parse_serialization,
                       default=[], metavar="LEVELS",
                       help="comma list of levels and slices to serialize, "
                            "e.g. 1,3:5")
    group.add_argument("--serialization_by_size", type=float, default=0.0,
                       metavar="GIB",
                       help="serialize levels whose outputs exceed this many "
                            "GiB (0: off)")
    group.add_argument("--debug", action="store_true",
                       help="log LMS details")
    group.add_argument("--debug_level", type=int, choices=(1, 2), default=1,
                       help="detail of --debug logs (default 1)")
    group.add_argument("--autotune_gpu_mem", type=_positive_float,
                       default=None, metavar="GIB",
                       help="device memory in GiB the auto-tuner plans for "
                            "(default: the GPU's)")
    group.add_argument("--autotune_plot", action="store_true",
                       help="write the auto-tuner's memory plots to "
                            "--lms_plot_dir")
    group.add_argument("--lms_plot_dir", default=".lms", metavar="DIR",
                       help="folder for --autotune_plot output "
                            "(default .lms)")
    return group


def make_lms(args, batch_size=None):
    """An `LMS` object configured from the parsed flags, or None when
    --lms is off.

    Turns TensorFlow's INFO logging on so the ``[LMS][0]`` lines show.
    `batch_size` is passed to `LMS.batch_size` so LMS can size tensors whose
    batch dimension is unknown. Keras passes it to the callback only when
    fit() gets arrays; with a generator the example must give it.
    """
    if not args.lms:
        return None
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tflms import LMS  # pylint: disable=import-outside-toplevel

    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    try:
        lms = LMS(swapout_threshold=args.swapout_threshold,
                  swapin_ahead=args.swapin_ahead,
                  swapin_groupby=args.swapin_groupby,
                  sync_mode=args.sync_mode,
                  serialization=args.serialization,
                  serialization_by_size=args.serialization_by_size,
                  debug=args.debug,
                  debug_level=args.debug_level)
        if batch_size is not None:
            lms.batch_size = batch_size
        if args.autotune_gpu_mem is not None:
            lms.autotune_gpu_mem = args.autotune_gpu_mem
        lms.autotune_plot = args.autotune_plot
        lms.plot_dir = args.lms_plot_dir
    except ValueError as e:
        # LMS's own messages name the setting and what it accepts.
        raise SystemExit("error: bad LMS flag: %s" % e) from None
    return lms


def keras2():
    """The Keras 2 the Keras examples build their models with: ``tf.keras``
    on TensorFlow 2.15, the tf-keras package on 2.16+ (what ``tf.keras`` is
    with ``TF_USE_LEGACY_KERAS=1``). LMS needs Keras 2: Keras 3 has no
    graph mode. Without tf-keras on 2.16+ the example exits with status 2
    and says what to install."""
    from tflms import _compat  # pylint: disable=import-outside-toplevel
    keras = _compat.keras2()
    if keras is None:
        print("error: " + _compat.keras3_message(
            "This example (%s)" % os.path.basename(sys.argv[0])),
              file=sys.stderr)
        raise SystemExit(2)
    return keras


def exit_unless_estimator(script):
    """Exit with status 2, saying why, when tf.estimator is missing (it was
    removed in TensorFlow 2.16)."""
    from tflms import _compat  # pylint: disable=import-outside-toplevel
    try:
        _compat.require_estimator(script)
    except _compat.UnsupportedStackError as e:
        print("error: %s" % e, file=sys.stderr)
        raise SystemExit(2) from None


def batch_loss_recorder(tf):
    """A Keras callback that records the loss of every training batch
    (``.losses``), so the examples can print the first and the last one."""

    del tf  # the callback must be one of the Keras the model is built with
    class BatchLoss(keras2().callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.losses = []

        def on_train_batch_end(self, batch, logs=None):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    return BatchLoss()


def keras_callbacks(tf, args):
    """The callbacks a Keras example trains with: `batch_loss_recorder`,
    then the LMS callback from `make_lms` when --lms is on.

    Keras cannot tell LMS the batch size when fed by a generator, and the
    auto-tuner needs it to size tensors, so --batch_size is passed to LMS.

    Returns:
      (recorder, callbacks) for ``model.fit(..., callbacks=callbacks)``.
    """
    recorder = batch_loss_recorder(tf)
    lms = make_lms(args, batch_size=args.batch_size)
    return recorder, [recorder] + ([lms] if lms is not None else [])


def describe_devices():
    """One line naming the device TensorFlow will place the model on."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return "Devices: %d GPU(s) found; the model runs on %s" % (
            len(gpus), gpus[0].name)
    return "Devices: no GPU found; the model runs on the CPU"


def _fmt(value):
    return "%.4f" % float(value)


def print_result(first_loss, loss, accuracy=None, **extra):
    """Print the final, parseable line:
    ``RESULT first_loss=2.3012 loss=0.1234 accuracy=0.9500``."""
    fields = [("first_loss", first_loss), ("loss", loss)]
    if accuracy is not None:
        fields.append(("accuracy", accuracy))
    fields.extend(sorted(extra.items()))
    print("RESULT " + " ".join("%s=%s" % (k, _fmt(v)) for k, v in fields),
          flush=True)
