"""`tflms._gc.paused`: the cyclic collector is off while LMS plans and
comes back as it was, also after an error."""

import gc

import pytest

from tflms import _gc


@pytest.fixture(autouse=True)
def _restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_off_inside_and_back_on_after():
    gc.enable()
    with _gc.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_stays_off_when_it_was_off():
    gc.disable()
    with _gc.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_restored_after_an_error():
    gc.enable()
    with pytest.raises(KeyError):
        with _gc.paused():
            raise KeyError("planning failed")
    assert gc.isenabled()
