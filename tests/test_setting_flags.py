"""The LMS settings' command-line flags (`tflms.setting_flags`): made from
the settings' fields, read back into a `Settings`."""

import argparse

import pytest

from tflms import setting_flags
from tflms.settings import AUTO, Settings


def _parser(**kwargs):
    parser = argparse.ArgumentParser(prog="p")
    setting_flags.add_arguments(parser, **kwargs)
    return parser


def test_flags_are_the_settings_names_with_dashes():
    assert setting_flags.flag_of("swapout_threshold") == "--swapout-threshold"


def test_flags_read_back_into_settings_over_a_base_and_overrides():
    args = _parser().parse_args(
        ["--swapout-threshold", "3", "--no-recompute",
         "--autotune-gpu-mem", "2.5"])
    chosen = setting_flags.from_arguments(args, swapin_ahead=4)
    assert chosen.swapout_threshold == 3
    assert chosen.recompute is False
    assert chosen.autotune_gpu_mem == 2.5
    assert chosen.swapin_ahead == 4
    # Flags not given keep their defaults; a three-way switch stays None.
    assert setting_flags.from_arguments(_parser().parse_args([])) == \
        Settings()
    assert Settings().recompute is None and Settings().swapin_groupby == AUTO


def test_only_the_named_settings_get_flags_and_are_read():
    parser = _parser(names=["swapout_threshold"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--swapin-ahead", "2"])
    args = parser.parse_args(["--swapout-threshold", "5"])
    args.swapin_ahead = 9  # not among `names`: not read
    chosen = setting_flags.from_arguments(args, names=["swapout_threshold"])
    assert chosen.swapout_threshold == 5 and chosen.swapin_ahead == AUTO


def test_a_deprecated_alias_warns_and_sets_the_setting(capsys):
    parser = _parser(aliases={"autotune_gpu_mem": ["--gpu-mem"]})
    args = parser.parse_args(["--gpu-mem", "3"])
    assert setting_flags.from_arguments(args).autotune_gpu_mem == 3.0
    assert "--gpu-mem is deprecated; use --autotune-gpu-mem" in \
        capsys.readouterr().err
    assert "--gpu-mem" not in parser.format_help()


def test_an_unknown_setting_is_named():
    with pytest.raises(ValueError, match="no command-line flag for "
                       "setting\\(s\\) bogus"):
        _parser(names=["bogus"])


def test_a_bad_value_names_the_setting():
    args = _parser().parse_args([])
    with pytest.raises(ValueError, match="swapout_threshold"):
        setting_flags.from_arguments(args, swapout_threshold=-2)
