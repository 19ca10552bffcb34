"""The argparse converters shared by ``tflms plan`` and the examples: what
they accept, and the messages (flag, value, what to give) they produce."""

import argparse
import os
import sys

import pytest

from tflms import cli
from tflms import settings
from tflms._argparse_types import (auto_int, choice_int, nonnegative_float,
                                  positive_float, positive_int)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "examples"))

import _lms_flags  # noqa: E402


def test_positive_int():
    assert positive_int("1") == 1 and positive_int(" 12 ") == 12
    for bad in ("0", "-3", "1.5", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError,
                           match=r"^must be an int >= 1; got '%s'$"
                           % bad.replace(".", r"\.")):
            positive_int(bad)


def test_positive_float():
    assert positive_float("0.5") == 0.5 and positive_float("16") == 16.0
    for bad in ("0", "-1", "inf", "nan", "x"):
        with pytest.raises(argparse.ArgumentTypeError,
                           match=r"^must be a number > 0; got '%s'$" % bad):
            positive_float(bad)


def test_auto_int():
    ahead, groupby = auto_int(1), auto_int(0)
    assert ahead("-1") == -1 and ahead("3") == 3
    assert groupby("0") == 0 and groupby("-1") == -1
    with pytest.raises(argparse.ArgumentTypeError,
                       match=r"^must be -1 \(auto\) or an int >= 1; got '0'$"):
        ahead("0")
    for bad in ("-2", "x", "1.0"):
        with pytest.raises(argparse.ArgumentTypeError,
                           match=r"^must be -1 \(auto\) or an int >= 0; "
                                 r"got '%s'$" % bad.replace(".", r"\.")):
            groupby(bad)


def test_nonnegative_float_and_choice_int():
    assert nonnegative_float("0") == 0.0 and nonnegative_float("2.5") == 2.5
    for bad in ("-0.1", "inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError,
                           match=r"^must be a number >= 0; got '%s'$"
                           % bad.replace(".", r"\.")):
            nonnegative_float(bad)
    mode = choice_int((0, 1, 2, 3))
    assert mode("3") == 3
    with pytest.raises(argparse.ArgumentTypeError,
                       match=r"^must be one of 0, 1, 2, 3; got '4'$"):
        mode("4")


def test_parse_serialization():
    """The one parser of --serialization text, shared by tflms and the
    examples; its items are what `LMS(serialization=...)` accepts."""
    parse = settings.parse_serialization
    assert parse("1,3:5") == (1, "3:5")
    assert parse(" 2 , 10: ,:4, 1:9:2") == (2, "10:", ":4", "1:9:2")
    assert parse("") == () and parse(None) == ()
    for bad in ("a", "1:b", "1:2:3:4", "-1", "1:2:0"):
        with pytest.raises(argparse.ArgumentTypeError,
                           match=r"serialization (entry|level)"):
            parse(bad)
    chosen = settings.Settings(serialization=parse("1,3:5"))
    assert chosen.serialization_levels == (slice(1, 2), slice(3, 5))


def _parse_error(parser, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_cli_errors_name_flag_value_and_fix(capsys):
    parser = cli.build_parser()
    cases = [
        (["--batch-size", "0"], "argument --batch-size: must be an int >= 1; "
                                "got '0'"),
        (["--autotune-gpu-mem", "-2"],
         "argument --autotune-gpu-mem: must be a number > 0; got '-2'"),
        (["--swapin-ahead", "0"], "argument --swapin-ahead: must be -1 "
                                  "(auto) or an int >= 1; got '0'"),
        (["--swapin-groupby", "-5"], "argument --swapin-groupby: must be -1 "
                                     "(auto) or an int >= 0; got '-5'"),
    ]
    for argv, message in cases:
        assert _parse_error(parser, ["plan", "g.meta"] + argv,
                            capsys).endswith(message)


def test_example_flags_use_the_same_converters(capsys):
    parser = argparse.ArgumentParser()
    _lms_flags.add_size_flags(parser, image_size=28, batch_size=4, epochs=1,
                              steps=2)
    _lms_flags.add_lms_flags(parser)
    args = parser.parse_args(["--batch_size", "8", "--autotune-gpu-mem",
                              "1.5"])
    assert (args.batch_size, args.autotune_gpu_mem) == (8, 1.5)
    assert _parse_error(parser, ["--steps", "0"], capsys).endswith(
        "argument --steps: must be an int >= 1; got '0'")
    assert _parse_error(parser, ["--autotune-gpu-mem", "inf"],
                        capsys).endswith(
        "argument --autotune-gpu-mem: must be a number > 0; got 'inf'")
