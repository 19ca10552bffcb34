"""benchmarks/keras3_applications_grid.py: the table of its cases, from
the RESULT lines tests/test_keras3_applications.py prints (literal rows:
the cases themselves take minutes each and are run by hand)."""

import pytest

from benchmarks import keras3_applications_grid as grid

pytestmark = pytest.mark.one_stack

_MIB = 1 << 20


def _row(**changes):
    row = dict(app="Xception", size=142, budget="auto", onednn=1,
               outcome="rewritten", swapouts=10, swapins=10, recomputes=1,
               peak=397 * _MIB, smallest=250 * _MIB,
               budget_bytes=283 * _MIB, base_losses=[1.5, 0.5],
               losses=[1.5, 0.5], missing=[], off_cpu=[],
               accumulated=[], base_accumulated=[], num_weights=236,
               different=0, largest_difference=0.0, problems=[],
               verdict="same", wall=34.2)
    row.update(changes)
    return row


def test_a_row_says_what_ran_and_what_the_memory_optimizer_did():
    lines = grid.table([
        _row(),
        _row(size=71, budget="fixed", onednn=0, missing=["lms/a"],
             losses=[1.5, 0.25], different=3, base_accumulated=["AddN_7"],
             accumulated=["AddN_3", "AddN_7"],
             verdict="3 of 236 weights different"),
        dict(app="DenseNet121", size=64, budget="fixed", onednn=0,
             verdict="timed out", wall=1800.0)]).splitlines()
    assert len(lines) == 5 and lines[0].count("|") == lines[1].count("|")
    assert lines[2] == (
        "| Xception | 142 | auto: 283 MiB (250 to 397) | on | 10 (1) | "
        "20 of 20 | 0 of 236 | yes | none / none | same | 34 |")
    assert lines[3] == (
        "| Xception | 71 | fixed | off | 10 (1) | 19 of 20 | 3 of 236 | no "
        "| AddN_7 / AddN_3, AddN_7 | 3 of 236 weights different | 34 |")
    assert lines[4] == ("| DenseNet121 | 64 | fixed | off | | | | | | "
                        "timed out | 1800 |")
