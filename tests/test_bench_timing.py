"""benchmarks/timing.py: the growth exponent of planning time against
graph size."""

import pytest

from benchmarks import timing


def test_growth_exponent_of_a_power_law():
    points = [(n, 3e-6 * n ** 1.5) for n in (1e4, 5e4, 2e5)]
    assert timing.growth_exponent(points) == pytest.approx(1.5)
    assert timing.growth_exponent(points[:1]) is None
