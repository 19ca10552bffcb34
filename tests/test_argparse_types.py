"""The argparse converters shared by ``tflms plan`` and the examples: what
they accept, and the messages (flag, value, what to give) they produce."""

import argparse
import os
import sys

import pytest

from tflms import cli
from tflms._argparse_types import auto_int, positive_float, positive_int

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "examples"))

import _lms_flags  # noqa: E402  pylint: disable=wrong-import-position


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
        (["--gpu-mem", "-2"], "argument --gpu-mem: must be a number > 0; "
                              "got '-2'"),
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
    args = parser.parse_args(["--batch_size", "8", "--autotune_gpu_mem",
                              "1.5"])
    assert (args.batch_size, args.autotune_gpu_mem) == (8, 1.5)
    assert _parse_error(parser, ["--steps", "0"], capsys).endswith(
        "argument --steps: must be an int >= 1; got '0'")
    assert _parse_error(parser, ["--autotune_gpu_mem", "inf"],
                        capsys).endswith(
        "argument --autotune_gpu_mem: must be a number > 0; got 'inf'")
