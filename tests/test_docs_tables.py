"""Tests for tools/docs_tables.py: the docs' tables are made from the code.

The settings tables of docs/parameters.md come from `tflms.settings`, the
GPU and link tables of docs/performance.md and the names of docs/plan.md
from `tflms.hardware`. A new setting, GPU or link fails these tests until
the pages are made again (``python tools/docs_tables.py``).
"""

import dataclasses
import os
import shutil
import subprocess
import sys

import pytest

from _doc_blocks import ROOT
from tflms import hardware
from tflms import settings

sys.path.insert(0, os.path.join(ROOT, "tools"))

import docs_tables  # noqa: E402

_REGENERATE = "regenerate them with: python tools/docs_tables.py"


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def test_the_pages_hold_the_tables_made_today():
    for rel, (text, made) in docs_tables.made_pages().items():
        assert made == text, "%s's tables differ from the code; %s" % (
            rel, _REGENERATE)
    parameters = _read("docs/parameters.md")
    for kind in (settings.CONSTRUCTOR, settings.PROPERTY):
        assert docs_tables.parameters_table(kind) + "\n" in parameters, kind
    performance = _read("docs/performance.md")
    assert docs_tables.gpu_table() in performance
    assert docs_tables.link_table() in performance
    assert docs_tables.names_text() in _read("docs/plan.md")


def test_parameter_tables_keep_the_prose():
    page = ("# P\n\nintro\n\n## Constructor arguments\n\n| old |\n| --- |\n"
            "| x |\n\nafter 1\n\n## Properties\n\ntext\n\n| old |\n"
            "| --- |\n\nafter 2\n")
    new = docs_tables.with_parameter_tables(page)
    assert new == (
        "# P\n\nintro\n\n## Constructor arguments\n\n"
        + docs_tables.parameters_table(settings.CONSTRUCTOR)
        + "\n\nafter 1\n\n## Properties\n\ntext\n\n"
        + docs_tables.parameters_table(settings.PROPERTY) + "\n\nafter 2\n")
    assert docs_tables.with_parameter_tables(new) == new
    with pytest.raises(ValueError, match="needs a '## Properties' heading"):
        docs_tables.with_parameter_tables(
            "## Constructor arguments\n\n| a |\n")


def test_a_parameter_row_shows_the_default_and_the_doc():
    table = docs_tables.parameters_table(settings.CONSTRUCTOR).split("\n")
    assert table[0] == "| Argument | Default | Effect |"
    names = [f.name for f in settings.fields(settings.CONSTRUCTOR)]
    assert [row.split("`")[1] for row in table[2:]] == names
    field = settings.fields(settings.CONSTRUCTOR)[0]
    assert table[2].endswith("| %s |" % field.metadata["doc"])


def test_a_new_gpu_makes_the_pages_stale(monkeypatch):
    b200 = dataclasses.replace(hardware.GPUS["H100-SXM5-80GB"],
                               name="B200-SXM6-192GB")
    monkeypatch.setitem(hardware.GPUS, b200.name, b200)
    assert "| `B200-SXM6-192GB` |" in docs_tables.gpu_table()
    assert "`B200-SXM6-192GB`; `pcie3`" in docs_tables.names_text()
    for rel in docs_tables.HARDWARE_PAGES:
        text = _read(rel)
        assert docs_tables.with_hardware_tables(text) != text, rel


def test_tables_list_each_gpu_and_link_once_and_mark_the_defaults():
    gpus = docs_tables.gpu_table().split("\n")
    assert len(gpus) == 2 + len(hardware.GPUS)
    for name, row in zip(hardware.GPUS, gpus[2:]):
        assert row.startswith("| `%s`" % name)
        assert ("(default)" in row) == (name == hardware.DEFAULT_GPU)
    assert "| 1,555 GB/s | 40 GiB | 108 x 1,410 MHz, 8.0, 40 MiB |" in gpus[4]
    links = docs_tables.link_table().split("\n")
    assert len(links) == 2 + len(hardware.INTERCONNECTS)
    assert links[3].startswith("| `pcie4` PCIe 4.0 x16 (default) | 31.5 |")
    assert "| 450 | 416 | 170 |" in docs_tables.link_table()


def test_hardware_tables_keep_the_prose_and_reject_unknown_markers():
    page = ("before\n\n<!-- hardware:links -->\nold\n<!-- /hardware:links "
            "-->\n\nin a cell: <!-- hardware:names -->old<!-- "
            "/hardware:names -->.\n")
    new = docs_tables.with_hardware_tables(page)
    assert new == (
        "before\n\n<!-- hardware:links -->\n" + docs_tables.link_table()
        + "\n<!-- /hardware:links -->\n\nin a cell: <!-- hardware:names -->"
        + docs_tables.names_text() + "<!-- /hardware:names -->.\n")
    assert docs_tables.with_hardware_tables(new) == new
    with pytest.raises(ValueError, match=(
            r"<!-- hardware:cpus --> names nothing tools/docs_tables.py "
            r"makes; use one of gpus, links, names")):
        docs_tables.with_hardware_tables(
            "<!-- hardware:cpus -->x<!-- /hardware:cpus -->")


def test_the_script_rewrites_stale_pages_without_tensorflow(tmp_path):
    """``python tools/docs_tables.py`` with TensorFlow unimportable: a
    stale page is reported by ``--check`` and rewritten without it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for rel in (docs_tables.PARAMETERS_PAGE,) + docs_tables.HARDWARE_PAGES:
        shutil.copy(os.path.join(ROOT, rel), tmp_path / rel)
    plan = docs / "plan.md"
    plan.write_text(plan.read_text().replace(
        docs_tables.names_text(), "old names"))
    script = os.path.join(ROOT, "tools", "docs_tables.py")

    def run(*args):
        code = ("import runpy, sys; sys.modules['tensorflow'] = None; "
                "sys.argv = [%r] + %r; runpy.run_path(%r, run_name="
                "'__main__')" % (script, list(args), script))
        return subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path),
                              capture_output=True, text=True, timeout=120)

    checked = run("--check", "--root", str(tmp_path))
    assert checked.returncode == 1, checked.stderr
    assert checked.stdout == "stale: docs/plan.md\n"
    assert "old names" in plan.read_text()
    written = run("--root", str(tmp_path))
    assert written.returncode == 0, written.stderr
    assert written.stdout == "rewrote: docs/plan.md\n"
    assert plan.read_text() == _read("docs/plan.md")
    assert run("--check", "--root", str(tmp_path)).returncode == 0
