"""Command-line flags for LMS, shared by every example.

Each example calls `add_lms_flags(parser)` while building its parser and
`make_lms(args)` once the model is built (or before training starts). The
flags are made from the fields of `tflms.settings.Settings`, the one
description of every LMS setting, and are spelled as the ``tflms`` command
spells them (``--swapout-threshold``); `make_lms` builds the `LMS` from
`tflms.setting_flags.from_arguments`. ``python <example> --help`` lists them:

  --lms                      turn Large Model Support on (off by default)
  --swapout-threshold N      -1 (default) lets the auto-tuner choose
  --swapin-groupby N         -1 (default) lets the auto-tuner choose
  --swapin-ahead N           -1 (default) lets the auto-tuner choose
  --sync-mode {0,1,2,3}
  --serialization LEVELS     levels to serialize, e.g. 1,3:5
  --serialization-by-size G  GiB threshold for serializing levels
  --debug, --debug-level {1,2}
  --cpu-device, --gpu-device DEVICE
  --autotune-gpu-mem G       GiB the auto-tuner plans for (needed without GPU)
  --autotune-plot            write the simulator's memory plots
  --plot-dir DIR             where the plots go (default .lms)
  --excl-output-by-scopes NAMES ... the eight include/exclude filters

LMS's batch size comes from the example's own ``--batch_size``. The old
underscore spellings (``--swapout_threshold``, ``--lms_plot_dir``...) still
work, hidden from ``--help``, with a deprecation warning.

It also holds the two small things every example prints: which device the
graph will run on and the final ``RESULT ...`` line that tests parse.
"""

import os
import sys

# Quiet TensorFlow's C++ start-up banner (CPU feature notes and the like);
# warnings and errors still show. A user's own setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

# Standard library only: --help must answer without loading TensorFlow.
from tflms import _argparse_types  # noqa: E402
from tflms import setting_flags  # noqa: E402
from tflms import settings  # noqa: E402

__all__ = [
    "add_lms_flags",
    "add_size_flags",
    "LMS_FLAG_SETTINGS",
    "make_lms",
    "batch_loss_recorder",
    "keras_callbacks",
    "describe_devices",
    "print_result",
]

# The settings with an LMS flag in the examples: every one with a flag
# except batch_size, which the examples' own --batch_size gives.
LMS_FLAG_SETTINGS = tuple(
    f.name for f in settings.fields()
    if f.metadata["flag"] is not None and f.name != "batch_size")

# Deprecated spellings from before the flags were shared with the tflms
# command: every underscore name, and --lms_plot_dir for --plot-dir.
_OLD_FLAGS = {name: ["--" + name] for name in LMS_FLAG_SETTINGS
              if "_" in name}
_OLD_FLAGS["plot_dir"] = ["--lms_plot_dir"]

_positive_int = _argparse_types.positive_int


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
                       help="mini-batch size (default %d); LMS sizes tensors "
                            "whose batch dimension is unknown with it"
                            % batch_size)
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
        "without a GPU it also needs --autotune-gpu-mem. The settings are "
        "described in docs/parameters.md.")
    group.add_argument("--lms", action="store_true",
                       help="enable Large Model Support")
    setting_flags.add_arguments(group, names=LMS_FLAG_SETTINGS,
                                aliases=_OLD_FLAGS)
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
    overrides = {} if batch_size is None else {"batch_size": batch_size}
    try:
        chosen = setting_flags.from_arguments(args, names=LMS_FLAG_SETTINGS,
                                         **overrides)
    except ValueError as e:
        # The checks' messages name the setting, the value and the fix.
        raise SystemExit("error: bad LMS flag: %s" % e) from None
    import tensorflow as tf
    from tflms import LMS

    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    lms = LMS(**{f.name: getattr(chosen, f.name)
                 for f in settings.fields(settings.CONSTRUCTOR)})
    for field in settings.fields(settings.PROPERTY):
        setattr(lms, field.name, getattr(chosen, field.name))
    return lms


def keras2():
    """The Keras 2 the Keras examples build their models with: ``tf.keras``
    on TensorFlow 2.15, the tf-keras package on 2.16+ (what ``tf.keras`` is
    with ``TF_USE_LEGACY_KERAS=1``). LMS needs Keras 2: Keras 3 has no
    graph mode. Without tf-keras on 2.16+ the example exits with status 2
    and says what to install."""
    from tflms.tf import compat
    keras = compat.keras2()
    if keras is None:
        print("error: " + compat.keras3_message(
            "This example (%s)" % os.path.basename(sys.argv[0])),
              file=sys.stderr)
        raise SystemExit(2)
    return keras


def exit_unless_estimator(script):
    """Exit with status 2, saying why, when tf.estimator is missing (it was
    removed in TensorFlow 2.16)."""
    from tflms.tf import compat
    try:
        compat.require_estimator(script)
    except compat.UnsupportedStackError as e:
        print("error: %s" % e, file=sys.stderr)
        raise SystemExit(2) from None


def batch_loss_recorder(tf, keras=None):
    """A Keras callback that records the loss of every training batch
    (``.losses``), so the examples can print the first and the last one.

    `keras`: the Keras the model is built with (the callback must be one of
    its callbacks); None: Keras 2 (`keras2`)."""

    del tf
    class BatchLoss((keras or keras2()).callbacks.Callback):
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
    import tensorflow as tf
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
