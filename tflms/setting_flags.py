"""Command-line flags made from the LMS settings' fields: the ``tflms``
command's and the example scripts' (`add_arguments`), read back into a
`Settings` (`from_arguments`).

Each setting with a ``flag`` in its field metadata (`tflms.settings`) gets
one flag, spelt `flag_of` its name; its converter and help come from the
same field. Standard library only, like `tflms.settings`, so the examples
build their ``--help`` without loading TensorFlow.
"""

import argparse
import sys

from tflms.settings import Settings, fields

__all__ = ["flag_of", "add_arguments", "from_arguments"]


def flag_of(name):
    """The command-line flag of setting `name`: ``--swapout-threshold``.

    Both the ``tflms`` command and the example scripts spell every LMS flag
    this way (argparse's convention: words joined by dashes).
    """
    return "--" + name.replace("_", "-")


class _DeprecatedAlias(argparse.Action):
    """A flag kept for old command lines: hidden from ``--help``, it warns
    on stderr and then does what the flag it stands for does."""

    def __init__(self, option_strings, dest, use, switch=False, **kwargs):
        if switch:
            kwargs["nargs"] = 0
        super().__init__(option_strings, dest, **kwargs)
        self.use = use
        self.switch = switch

    def __call__(self, parser, namespace, values, option_string=None):
        print("warning: %s is deprecated; use %s" % (option_string, self.use),
              file=sys.stderr)
        setattr(namespace, self.dest, True if self.switch else values)


def add_arguments(group, names=None, aliases=None):
    """Add a flag for each setting in `names` (default: every setting that
    has one) to an argparse parser or group.

    Args:
      group: the parser or argument group.
      names: setting names, in the order wanted.
      aliases: ``{setting: [old flag, ...]}``: deprecated spellings that
        still work, hidden from ``--help`` and warned about when used.

    Every flag is `flag_of` its setting, the one spelling of the ``tflms``
    command and the examples, and its destination is the setting's name, so
    `from_arguments` reads them back.

    Raises:
      ValueError: for a name in `names` or `aliases` that is not a setting
        with a flag.
    """
    flagged = {f.name: f for f in fields() if f.metadata["flag"] is not None}
    unknown = sorted(set(names or ()).union(aliases or ()) - set(flagged))
    if unknown:
        raise ValueError(
            "no command-line flag for setting(s) %s; the settings with flags "
            "are %s" % (", ".join(unknown), ", ".join(flagged)))
    chosen = list(flagged.values()) if names is None else [
        flagged[n] for n in names]
    for field in chosen:
        meta = field.metadata
        flag = flag_of(field.name)
        switch = meta["text"] is None
        if switch and field.default is None:
            # A switch whose default is neither on nor off (`recompute`):
            # --name turns it on, --no-name off, neither keeps the default.
            group.add_argument(flag, dest=field.name,
                               action=argparse.BooleanOptionalAction,
                               default=None, help=meta["flag"])
        elif switch:
            group.add_argument(flag, dest=field.name, action="store_true",
                               default=field.default, help=meta["flag"])
        else:
            group.add_argument(flag, dest=field.name, type=meta["text"],
                               default=field.default, metavar=meta["metavar"],
                               help=meta["flag"])
        for alias in (aliases or {}).get(field.name, ()):
            extra = {} if switch else {"type": meta["text"]}
            group.add_argument(alias, dest=field.name, action=_DeprecatedAlias,
                               use=flag, switch=switch,
                               default=argparse.SUPPRESS,
                               help=argparse.SUPPRESS, **extra)
    return group


def from_arguments(args, base=None, names=None, **overrides):
    """`Settings` from parsed flags (those `add_arguments` added), over
    `base` (default: the defaults), with `overrides` last.

    Args:
      args: the `argparse.Namespace`.
      base: the `Settings` to start from.
      names: read only these settings from `args` (default: every setting
        `args` has an attribute for).
      **overrides: settings given by the caller.

    Raises:
      ValueError: from the checks, naming the setting and the value.
    """
    wanted = set(names) if names is not None else None
    values = {}
    for field in fields():
        if wanted is not None and field.name not in wanted:
            continue
        if hasattr(args, field.name):
            values[field.name] = getattr(args, field.name)
    values.update(overrides)
    return (base or Settings()).replace(**values)
