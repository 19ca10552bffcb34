"""tflms.ranks: where this process stands in a distributed job, read from
the variables job launchers set (Horovod, Open MPI, PMI, TF_CONFIG)."""

import json

import pytest

from tflms import ranks


def test_rank_info_from_launcher_variables():
    assert ranks.rank_info({}) == ranks.RankInfo()
    hvd_env = {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "8",
               "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "4"}
    assert ranks.rank_info(hvd_env) == ranks.RankInfo(
        5, 8, 1, 4, "horovod")
    mpi_env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
               "OMPI_COMM_WORLD_LOCAL_RANK": "1",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert ranks.rank_info(mpi_env) == ranks.RankInfo(
        3, 4, 1, 2, "mpi")
    tf_config = {"TF_CONFIG": json.dumps({
        "cluster": {"chief": ["127.0.0.1:1"],
                    "worker": ["127.0.0.1:2", "127.0.0.1:3"]},
        "task": {"type": "worker", "index": 1}})}
    # All three on one host: they share its memory.
    assert ranks.rank_info(tf_config) == ranks.RankInfo(
        2, 3, 2, 3, "tf_config", "worker", 1)
    # Members whose address names this task's host, loopback names as one.
    two_hosts = {"TF_CONFIG": json.dumps({
        "cluster": {"chief": ["localhost:1"],
                    "worker": ["node-b:2", "127.0.0.1:3", "Node-B:4"]},
        "task": {"type": "worker", "index": 2}})}
    assert ranks.rank_info(two_hosts) == ranks.RankInfo(
        3, 4, 1, 2, "tf_config", "worker", 2)
    chief = dict(two_hosts, TF_CONFIG=two_hosts["TF_CONFIG"].replace(
        '"type": "worker", "index": 2', '"type": "chief", "index": 0'))
    assert ranks.rank_info(chief) == ranks.RankInfo(
        0, 4, 0, 2, "tf_config", "chief", 0)
    # The local facts are read whatever the launcher (the auto-tuner's GPU
    # and host budgets use them).
    assert ranks.rank_info({"HOROVOD_LOCAL_RANK": "1",
                                  "HOROVOD_LOCAL_SIZE": "4"}) == \
        ranks.RankInfo(local_rank=1, local_size=4)
    with pytest.raises(ValueError, match=r"HOROVOD_RANK='x' must be an "
                       r"integer \(it is set by the job launcher"):
        ranks.rank_info({"HOROVOD_RANK": "x"})
    with pytest.raises(ValueError, match="TF_CONFIG='{' is not JSON of an "
                       "object"):
        ranks.rank_info({"TF_CONFIG": "{"})
    with pytest.raises(ValueError, match=r"TF_CONFIG='\[1\]' is not JSON"):
        ranks.rank_info({"TF_CONFIG": "[1]"})


def test_pmi_variables_and_the_launchers_priority():
    assert ranks.rank_info({"PMI_RANK": "2", "PMI_SIZE": "6"}) == \
        ranks.RankInfo(rank=2, size=6, launcher="mpi")
    # A rank without a size: the job has at least rank + 1 processes.
    assert ranks.rank_info({"PMI_RANK": "2"}).size == 3
    # Horovod's variables win over Open MPI's, whose win over PMI's.
    both = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2",
            "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
            "PMI_RANK": "5", "PMI_SIZE": "6"}
    info = ranks.rank_info(both)
    assert (info.rank, info.size, info.launcher) == (1, 2, "horovod")
    del both["HOROVOD_RANK"], both["HOROVOD_SIZE"]
    info = ranks.rank_info(both)
    assert (info.rank, info.size, info.launcher) == (3, 4, "mpi")


def test_without_an_argument_it_reads_this_process(monkeypatch):
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                 "HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE",
                 "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    assert ranks.rank_info() == ranks.RankInfo()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    info = ranks.rank_info()
    assert (info.rank, info.size, info.launcher) == (1, 2, "mpi")
