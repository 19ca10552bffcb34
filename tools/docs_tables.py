"""Make the tables of the docs from the code they describe.

The settings tables of docs/parameters.md come from the fields of
`tflms.settings.Settings` (default, documentation); the GPU and link tables
of docs/performance.md and the names of docs/plan.md come from
`tflms.hardware` (rates, chips, sources). A setting, a GPU or a link added
there reaches the docs by running this script; tests/test_docs_tables.py
fails while they differ.

    python tools/docs_tables.py            # rewrite the three pages
    python tools/docs_tables.py --check    # exit 1 if one would change

The hardware tables are written between the comments
``<!-- hardware:NAME -->`` and ``<!-- /hardware:NAME -->``, which Markdown
readers do not see; the settings tables replace the first table under the
headings "## Constructor arguments" and "## Properties". Everything else on
a page is its own prose and is kept. Standard library and the two pure
modules only: no TensorFlow.
"""

import argparse
import os
import re
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tflms import hardware  # noqa: E402
from tflms import settings  # noqa: E402

PARAMETERS_PAGE = "docs/parameters.md"
HARDWARE_PAGES = ("docs/performance.md", "docs/plan.md")

_T, _G = 1e12, 1e9
_GIB, _MIB = 1 << 30, 1 << 20


# ---- docs/parameters.md: the settings -------------------------------------
def _shown_default(field):
    shown = field.metadata["shown_default"]
    if shown is not None:
        return shown
    if isinstance(field.default, frozenset):
        return "`set()`"
    return "`%r`" % (field.default,)


def parameters_table(kind):
    """The Markdown table of docs/parameters.md for `kind`
    (`settings.CONSTRUCTOR`: "Argument", `settings.PROPERTY`: "Property")."""
    head = "Argument" if kind == settings.CONSTRUCTOR else "Property"
    lines = ["| %s | Default | Effect |" % head, "| --- | --- | --- |"]
    for field in settings.fields(kind):
        lines.append("| `%s` | %s | %s |" % (
            field.name, _shown_default(field), field.metadata["doc"]))
    return "\n".join(lines)


# The heading each table of docs/parameters.md sits under.
_TABLE_HEADINGS = ((settings.CONSTRUCTOR, "## Constructor arguments"),
                   (settings.PROPERTY, "## Properties"))
_TABLE = re.compile(r"^\|.*\|[ \t]*\n(?:\|.*\|[ \t]*\n?)*", re.M)


def with_parameter_tables(text):
    """`text` (docs/parameters.md) with the first table after each of its
    "## Constructor arguments" and "## Properties" headings replaced by
    `parameters_table`; the prose around them is kept.

    Raises:
      ValueError: when a heading or its table is missing.
    """
    for kind, heading in _TABLE_HEADINGS:
        start = re.search(r"^%s[ \t]*$" % re.escape(heading), text, re.M)
        # The table must be in the heading's own section.
        end = re.compile(r"^#{1,2} ", re.M).search(text, start.end()) \
            if start else None
        match = _TABLE.search(text, start.end(), end.start() if end
                              else len(text)) if start else None
        if match is None:
            raise ValueError(
                "docs/parameters.md needs a %r heading followed by a "
                "Markdown table; add them and rerun python "
                "tools/docs_tables.py" % heading)
        table = parameters_table(kind) + "\n"
        text = text[:match.start()] + table + text[match.end():]
    return text


# ---- docs/performance.md and docs/plan.md: the hardware -------------------
def _number(value):
    """``1555.0 -> "1,555"``, ``15.75 -> "15.75"``."""
    return format(value, ",g")


def _source_title(source):
    # A source's title is its text before the first parenthesis (the
    # numbers it backs and its address follow).
    return source.split(" (")[0]


def gpu_table():
    """The Markdown table of `hardware.GPUS`: rates, memory, chip,
    sources."""
    rows = [
        "| GPU (`--gpu`) | FP32 TFLOP/s | matmul/conv peak for float32 | "
        "FP16 tensor | BF16 tensor | HBM bandwidth | memory | SMs x boost "
        "clock, compute capability, L2 (the oracle's GPU) | sources |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for gpu in hardware.GPUS.values():
        # Matmuls of a float32 graph get TF32 where the tensor cores are
        # faster than the CUDA cores (the `Gpu.tensor_flops` docstring).
        kind = "FP32" if gpu.tensor_flops == gpu.fp32_flops else "TF32"
        chip = "%d x %s MHz, %s, %s MiB" % (
            gpu.sms, _number(gpu.boost_clock_mhz), gpu.compute_capability,
            _number(gpu.l2_bytes / _MIB))
        rows.append("| `%s`%s | %s | %s (%s) | %s | %s | %s GB/s | %s GiB | "
                    "%s | %s; %s |" % (
                        gpu.name,
                        " (default)" if gpu.name == hardware.DEFAULT_GPU
                        else "",
                        _number(gpu.fp32_flops / _T),
                        _number(gpu.tensor_flops / _T), kind,
                        _number(gpu.half_flops / _T),
                        "none" if gpu.bf16_flops is None
                        else _number(gpu.bf16_flops / _T),
                        _number(gpu.memory_bandwidth / _G),
                        _number(gpu.memory_bytes / _GIB), chip,
                        _source_title(gpu.source),
                        _source_title(gpu.architecture_source)))
    return "\n".join(rows)


def link_table():
    """The Markdown table of `hardware.INTERCONNECTS`: the peak rate per
    direction, the rates copies get each way, source."""
    rows = ["| link (`--interconnect`) | GB/s per direction (peak) | "
            "host to device (swap-ins) | device to host (swap-outs) | "
            "source |",
            "|---|---:|---:|---:|---|"]
    for link in hardware.INTERCONNECTS.values():
        rows.append("| `%s` %s%s | %s | %s | %s | %s |" % (
            link.name, link.label,
            " (default)" if link.name == hardware.DEFAULT_INTERCONNECT
            else "",
            _number(link.bytes_per_s / _G),
            _number(link.h2d_bytes_per_s / _G),
            _number(link.d2h_bytes_per_s / _G), link.source))
    return "\n".join(rows)


def names_text():
    """The names `--gpu` and `--interconnect` take, for docs/plan.md."""
    def named(names, default):
        return ", ".join("`%s`%s" % (name, " (default)" if name == default
                                     else "") for name in names)
    return "%s; %s, or `%s` (copies take no time)" % (
        named(hardware.GPUS, hardware.DEFAULT_GPU),
        named(hardware.INTERCONNECTS, hardware.DEFAULT_INTERCONNECT),
        hardware.INSTANT.name)


# Marker name -> (text, whether it is a block of its own lines).
_GENERATED = {
    "gpus": (gpu_table, True),
    "links": (link_table, True),
    "names": (names_text, False),
}
_MARKED = re.compile(r"<!-- hardware:(\w+) -->(.*?)<!-- /hardware:\1 -->",
                     re.S)


def with_hardware_tables(text):
    """`text` with what stands between each pair of hardware markers made
    again from `hardware.GPUS` and `hardware.INTERCONNECTS`; everything
    else is kept.

    Raises:
      ValueError: for a marker name this script does not make.
    """
    def made(match):
        name = match.group(1)
        if name not in _GENERATED:
            raise ValueError(
                "<!-- hardware:%s --> names nothing tools/docs_tables.py "
                "makes; use one of %s" % (name, ", ".join(_GENERATED)))
        make, block = _GENERATED[name]
        inside = "\n%s\n" % make() if block else make()
        return "<!-- hardware:%s -->%s<!-- /hardware:%s -->" % (
            name, inside, name)
    return _MARKED.sub(made, text)


# ---- the pages ------------------------------------------------------------
def made_pages(root=_ROOT):
    """``{relative path: (text now, text made)}`` for the three pages."""
    makers = {PARAMETERS_PAGE: with_parameter_tables}
    makers.update({page: with_hardware_tables for page in HARDWARE_PAGES})
    pages = {}
    for rel, make in makers.items():
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            text = f.read()
        pages[rel] = (text, make(text))
    return pages


def main(argv=None):
    """Rewrite the tables of the three pages, or with ``--check`` list
    those that would change and return 1."""
    parser = argparse.ArgumentParser(
        prog="python tools/docs_tables.py",
        description="Make the tables of docs/parameters.md (from "
                    "tflms/settings.py), docs/performance.md and "
                    "docs/plan.md (from tflms/hardware.py) again, keeping "
                    "the prose around them.")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a page would change")
    parser.add_argument("--root", default=_ROOT,
                        help="the checkout whose docs/ to rewrite "
                             "(default: this script's)")
    args = parser.parse_args(argv)
    stale = []
    for rel, (text, made) in made_pages(args.root).items():
        if made == text:
            continue
        stale.append(rel)
        if not args.check:
            with open(os.path.join(args.root, rel), "w",
                      encoding="utf-8") as f:
                f.write(made)
    for rel in stale:
        print(("stale: " if args.check else "rewrote: ") + rel)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
