"""The rank prefix of the [LMS] log lines."""

import json

import pytest

from tflms._logging import rank_prefix

_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "TF_CONFIG")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in _RANK_VARS:
        monkeypatch.delenv(var, raising=False)


def test_no_launcher_no_prefix():
    assert rank_prefix() == ""


@pytest.mark.parametrize("var", ["HOROVOD_RANK", "OMPI_COMM_WORLD_RANK",
                                 "PMI_RANK"])
def test_mpi_style_rank(monkeypatch, var):
    monkeypatch.setenv(var, "3")
    assert rank_prefix() == "[rank 3] "


def test_tf_config_task(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 1}}))
    assert rank_prefix() == "[worker 1] "


@pytest.mark.parametrize("config", ["not json", "[1, 2]",
                                    json.dumps({"cluster": {}})])
def test_unusable_tf_config_gives_no_prefix(monkeypatch, config):
    monkeypatch.setenv("TF_CONFIG", config)
    assert rank_prefix() == ""
