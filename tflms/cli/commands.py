"""The commands: `main` parses the arguments and runs `tflms plan`,
`tflms verify` or `tflms capacity` in this process, turning the errors a
user can fix into one line on stderr and exit status 2."""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

from tflms.cli.arguments import (build_parser, check_capacity_arguments,
                                 lms_from_args)
from tflms.cli.loading import PlanError, is_keras3_plan, load_graph
from tflms.cli.planning import plan_graph
from tflms.cli.rendering import render


EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_ERROR = 0, 1, 2


class _Progress:
    """`tflms plan`'s progress lines on stderr, one per phase, each with the
    seconds since the command started; silent when off."""

    def __init__(self, command, enabled, stream=None):
        self._prefix = "tflms %s" % command
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self._stream, "isatty", None)
                           and self._stream.isatty())
        self.enabled = enabled
        self._start = time.monotonic()

    def __call__(self, text):
        if self.enabled:
            print("%s [%5.1f s] %s" % (self._prefix,
                                       time.monotonic() - self._start, text),
                  file=self._stream, flush=True)


def _run_command(args, work):
    """Set up a command's own process, run ``work()`` and turn the errors a
    user can fix into one line on stderr and exit status 2."""
    from tflms import autotune
    from tflms import simulator
    import tensorflow as tf
    # Keras 2 builds its training graph only in graph mode; this is the
    # command's own process, not a library import. A Keras 3 model is
    # traced in eager mode.
    if not is_keras3_plan(args.graph, args):
        tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(
        tf.compat.v1.logging.INFO if args.verbose
        else tf.compat.v1.logging.ERROR)
    prefix = "tflms %s: error:" % args.command
    try:
        return work()
    except autotune.NoGpuError as e:
        print("%s %s For this command: pass --autotune-gpu-mem <GiB of the "
              "GPU you plan for>." % (prefix, e), file=sys.stderr)
    except simulator.BatchSizeError as e:
        print("%s %s. For this command: pass --batch-size N." % (prefix, e),
              file=sys.stderr)
    except (PlanError, ValueError) as e:
        print("%s %s" % (prefix, e), file=sys.stderr)
    return EXIT_ERROR


def _plan_command(args):
    def work():
        progress = _Progress(args.command, args.progress)
        progress("loading %s ..." % args.graph)
        loaded = load_graph(args.graph, args)
        report = plan_graph(loaded, args, args.graph, progress)
        progress("done")
        if args.json:
            print(json.dumps(report.as_dict(), indent=1, sort_keys=True))
        else:
            print("\n".join(render(report, args)))
        return EXIT_FITS if report.fits else EXIT_DOES_NOT_FIT
    return _run_command(args, work)


def _capacity_command(args):
    from tflms.cli import capacity_command as capacity_cli

    def work():
        word = args.dimension
        start = getattr(args, "start_" + word)
        limit = getattr(args, "max_" + word)
        if limit is not None and start > limit:
            raise PlanError(
                "--start-%s %d is above --max-%s %d: give a --max-%s of at "
                "least %d" % (word, start, word, limit, word, start))
        progress = _Progress(args.command, args.progress)
        found = capacity_cli.find(args, progress)
        progress("done")
        lines = capacity_cli.render(found, args)
        lines += capacity_cli.write_outputs(found, args)
        print("\n".join(lines))
        return (EXIT_FITS if found.largest_with_lms is not None
                else EXIT_DOES_NOT_FIT)
    return _run_command(args, work)


def render_verify(report):
    """The lines `tflms verify` prints."""
    lines = list(report.notes)
    lines += ["oneDNN: %s" % ("on" if report.onednn else "off"),
              "Steps: %d with and without LMS" % report.steps]
    if report.losses_without:
        lines.append("Losses without LMS: %s" % ", ".join(
            "%.8g" % x for x in report.losses_without))
        lines.append("Losses with LMS:    %s" % ", ".join(
            "%.8g" % x for x in report.losses_with))
    lines.append("Variables compared: %d; largest difference %.3g" % (
        report.variables, report.max_abs_difference))
    if report.global_step is not None:
        lines.append("Global step advanced: %d without LMS, %d with LMS" %
                     report.global_step)
    lines.append("Swap ops that ran: %d of the %d LMS added" % (
        report.swap_ops_ran, report.swap_ops))
    if report.kernels_differ:
        lines.append(
            "TensorFlow fused differently with the swap ops (float rounding "
            "may differ; see --rtol): %s" % ", ".join(
                "%s %d->%d" % (k, a, b)
                for k, (a, b) in report.kernels_differ.items()))
    for name in report.different[:10]:
        lines.append("DIFFERENT: %s" % name)
    if report.ops_not_run:
        lines.append("NOT RUN with LMS (ran without it): %s" % ", ".join(
            report.ops_not_run[:10]))
    if report.swap_ops_not_run:
        lines.append("Swap ops that did not run: %s" % ", ".join(
            report.swap_ops_not_run[:10]))
    if report.swap_ops_removed:
        lines.append("Swap ops TensorFlow's graph optimizer removed: %s"
                     % ", ".join(report.swap_ops_removed[:10]))
    lines.append("Ops the training step runs with LMS and did not run "
                 "without it, other than LMS's own: %s" % (
                     ", ".join(report.ops_entering_step[:10])
                     if report.ops_entering_step else "none"))
    if report.grappler is not None:
        lines += report.grappler.lines()
    lines.append("VERDICT: %s" % (
        "PASS - training with LMS matched training without it"
        if report.ok else "FAIL - training with LMS differed"))
    return lines


# Set by `tflms verify` for the process it starts to verify a Keras 3
# model: the folder TF_DUMP_GRAPH_PREFIX names, which that process uses
# and the starting one removes.
_DUMP_DIR_ENV = "TFLMS_VERIFY_DUMP_DIR"


def _verify_keras3(args, argv, fresh):
    """`tflms verify` of a Keras 3 file: a `VerifyReport`
    (`tflms.tf.verify_keras3`), or the exit status of the process it ran in.

    The witness that the swap ops ran is in the graphs TensorFlow dumps
    when TF_DUMP_GRAPH_PREFIX and TF_DUMP_GRAPH_NAME_FILTER are set, and
    TensorFlow reads the filter at the first function a process runs. In a
    process that had not imported TensorFlow when the command started
    (`fresh`: the command's own), nothing has run yet and the variables
    are set here; otherwise (`main` called by a program that may have run
    functions) the command runs again in a new Python process with them
    set."""
    from tflms.tf import verify_keras3
    for flag, given in (("--train-op", args.train_op),
                        ("--loss-tensor", args.loss_tensor),
                        ("--inference", args.inference)):
        if given:
            raise PlanError(
                "%s is for Session graphs; %s was saved by Keras 3, whose "
                "training step is its model.train_step (with the saved or "
                "--loss loss): remove %s" % (flag, args.graph, flag))

    def run(dump):
        return verify_keras3.verify(
            args.graph, lms_from_args(args), dump, steps=args.steps,
            options=verify_keras3.ModelOptions(
                args.batch_size, args.loss, args.optimizer),
            rtol=args.rtol)

    given = os.environ.get(_DUMP_DIR_ENV)
    if given and os.environ.get("TF_DUMP_GRAPH_PREFIX") == given:
        return run(given)  # the process started below
    names = ("TF_DUMP_GRAPH_PREFIX", "TF_DUMP_GRAPH_NAME_FILTER",
             _DUMP_DIR_ENV)
    with tempfile.TemporaryDirectory(prefix="tflms_verify_") as dump:
        values = dict(zip(names, (dump, verify_keras3.DUMP_FILTER, dump)))
        if not fresh:
            sys.stdout.flush()
            sys.stderr.flush()
            return subprocess.run(
                [sys.executable, "-m", "tflms"] + [str(a) for a in argv],
                env=dict(os.environ, **values), check=False).returncode
        saved = {name: os.environ.get(name) for name in names}
        os.environ.update(values)
        try:
            return run(dump)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _verify_command(args, argv=(), fresh=False):
    from tflms.tf import verify as verifying

    def work():
        if is_keras3_plan(args.graph, args):
            report = _verify_keras3(args, argv, fresh)
            if isinstance(report, int):
                return report
        else:
            report = verifying.verify(
                lambda: load_graph(args.graph, args).graph,
                lms_from_args(args), steps=args.steps,
                batch_size=args.batch_size, train_op_names=args.train_op,
                loss_name=args.loss_tensor, rtol=args.rtol)
        if args.json:
            print(json.dumps(dataclasses.asdict(report), indent=1,
                             sort_keys=True))
        else:
            print("\n".join(render_verify(report)))
        return 0 if report.ok else 1
    return _run_command(args, work)


def _quieten_tensorflow(args):
    """For the command's own process: TensorFlow's C++ INFO and WARNING
    lines hidden (``TF_CPP_MIN_LOG_LEVEL=2``) unless the user set the
    variable or asked for --verbose. Only before TensorFlow is imported,
    which reads the variable once."""
    if not args.verbose and "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None, program=False):
    """Entry point of ``tflms`` and ``python -m tflms``.

    Args:
      argv: the arguments (default: ``sys.argv[1:]``).
      program: True when this is the process's own program (`__main__`),
        which may then quieten TensorFlow's logging for itself; callers in
        a library process leave it False.
    """
    # Nothing TensorFlow runs can have happened in a process that has not
    # imported it (tflms verify on a Keras 3 file counts on that).
    fresh = "tensorflow" not in sys.modules
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if program:
        _quieten_tensorflow(args)
    if args.command == "plan":
        return _plan_command(args)
    if args.command == "verify":
        return _verify_command(args, argv, fresh)
    if args.command == "capacity":
        check_capacity_arguments(parser, args)
        return _capacity_command(args)
    parser.error("unknown command %r" % args.command)
    return EXIT_ERROR
