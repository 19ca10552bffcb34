"""Tests for tflms/hardware.py: the named GPUs and links and their checks.

A new GPU is one row in `hardware.GPUS`; these tests fail until the row
carries what the oracle and the step-time model need, and
tests/test_docs_tables.py until the docs that list the GPUs are made again
(``python tools/docs_tables.py``).
"""

import argparse
import dataclasses

import pytest

from benchmarks import gpu_measure
from tflms import hardware


def test_names_are_the_keys_and_unique():
    assert all(key == gpu.name for key, gpu in hardware.GPUS.items())
    assert all(key == link.name
               for key, link in hardware.INTERCONNECTS.items())
    names = (list(hardware.GPUS) + list(hardware.INTERCONNECTS)
             + [hardware.INSTANT.name])
    assert len(set(names)) == len(names)
    labels = [link.label for link in hardware.INTERCONNECTS.values()]
    assert len(set(labels)) == len(labels)
    device_names = [gpu.device_name for gpu in hardware.GPUS.values()]
    assert len(set(device_names)) == len(device_names)
    assert hardware.DEFAULT_GPU in hardware.GPUS
    assert hardware.DEFAULT_INTERCONNECT in hardware.INTERCONNECTS
    assert hardware.LINKS == tuple(
        (link.label, link.bytes_per_s / 1e9)
        for link in hardware.INTERCONNECTS.values())


def test_gpu_named_takes_a_name_or_a_gpu_and_names_the_known_ones():
    a100 = hardware.GPUS["A100-SXM4-40GB"]
    assert hardware.gpu_named("A100-SXM4-40GB") is a100
    assert hardware.gpu_named(a100) is a100
    with pytest.raises(ValueError, match=(
            r"^gpu 'A100' is not known; use one of V100-SXM2-16GB, "
            r"V100-SXM2-32GB, A100-SXM4-40GB, A100-SXM4-80GB, "
            r"H100-SXM5-80GB, H100-PCIe-80GB$")):
        hardware.gpu_named("A100")


def test_interconnect_named_takes_a_name_a_link_or_instant():
    pcie4 = hardware.INTERCONNECTS["pcie4"]
    assert hardware.interconnect_named("pcie4") is pcie4
    assert hardware.interconnect_named(pcie4) is pcie4
    assert hardware.interconnect_named("instant") is hardware.INSTANT
    with pytest.raises(ValueError, match=(
            r"^interconnect 'pcie6' is not known; use one of pcie3, pcie4, "
            r"pcie5, nvlink2, nvlink-c2c, or 'instant' for copies that "
            r"take no time$")):
        hardware.interconnect_named("pcie6")


@pytest.mark.parametrize("name", list(hardware.GPUS))
def test_every_gpu_has_its_rates_chip_and_sources(name):
    gpu = hardware.GPUS[name]
    for field in dataclasses.fields(gpu):
        if field.name != "bf16_flops":
            assert getattr(gpu, field.name) not in (None, ""), field.name
    assert 0 < gpu.fp32_flops <= gpu.tensor_flops < gpu.half_flops
    # bfloat16 tensor cores came with Ampere (compute capability 8.0), at
    # the float16 rate.
    if gpu.compute_capability >= "8":
        assert gpu.bf16_flops == gpu.half_flops
    else:
        assert gpu.bf16_flops is None
    assert gpu.compute_capability.count(".") == 1
    # The datasheet's FP32 rate is SMs x FP32 lanes per SM (64 up to
    # Ampere's GA100, 128 on Hopper) x 2 FLOP per fused multiply-add x the
    # boost clock: the whitepaper's chip and the datasheet's rate agree.
    per_sm_cycle = gpu.fp32_flops / (gpu.sms * gpu.boost_clock_mhz * 1e6 * 2)
    lanes = 128 if gpu.compute_capability >= "9" else 64
    assert per_sm_cycle == pytest.approx(lanes, rel=0.01)
    assert gpu.source.startswith("NVIDIA ") and "https://" in gpu.source
    assert "whitepaper" in gpu.architecture_source
    assert "https://" in gpu.architecture_source


def test_gpu_measure_families_come_from_hardware():
    families = dict(gpu_measure._GPU_NAMES)
    assert families == {"V100": "V100-SXM2-16GB", "A100": "A100-SXM4-40GB",
                        "H100": "H100-SXM5-80GB"}
    assert {key.split("-")[0] for key in hardware.GPUS} == set(families)


class _FakeTf:
    """Just what `gpu_measure.guess_gpu` asks TensorFlow: a device name."""

    def __init__(self, device_name):
        details = {"device_name": device_name}
        experimental = type("Experimental", (), {
            "get_device_details": staticmethod(lambda device: details)})
        self.config = type("Config", (), {"experimental": experimental})


@pytest.mark.parametrize("device_name, key", [
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ("Tesla V100-PCIE-16GB", "V100-SXM2-16GB"),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_gpu_measure_guesses_the_gpu_from_its_name(device_name, key):
    guess = gpu_measure.guess_gpu(
        _FakeTf(device_name), "/physical_device:GPU:0")
    assert guess == (key, device_name)


def _with_gpus(fake, devices):
    fake.config.list_physical_devices = staticmethod(lambda kind: devices)
    return fake


def test_gpu_measure_finds_the_gpu_to_predict_for(capsys):
    """`find_gpu`: a known GPU gives the predictions' GPU; `--gpu` wins
    over the name; an unknown one without `--gpu` stops with a message
    naming it and the option; without a GPU the default GPU is predicted
    for and the exit status says nothing was measured; a dry run does not
    look."""
    gpu0 = ["/physical_device:GPU:0"]

    def find(name, devices, gpu=None, dry_run=False):
        args = argparse.Namespace(gpu=gpu, dry_run=dry_run)
        found = gpu_measure.find_gpu(_with_gpus(_FakeTf(name), devices),
                                     args, "benchmarks/x.py")
        return found, args.gpu

    assert find("NVIDIA A100-SXM4-80GB", gpu0) == (
        (True, "NVIDIA A100-SXM4-80GB", 0), "A100-SXM4-80GB")
    assert find("NVIDIA A100-SXM4-80GB", gpu0, gpu="V100-SXM2-16GB") == (
        (True, "NVIDIA A100-SXM4-80GB", 0), "V100-SXM2-16GB")
    assert capsys.readouterr().err == ""
    assert find("NVIDIA GeForce RTX 4090", gpu0) == (
        (True, "NVIDIA GeForce RTX 4090", None), None)
    assert ("benchmarks/x.py: GPU:0 is 'NVIDIA GeForce RTX 4090', which "
            "tflms has no figures for; pass --gpu with the nearest of its "
            "GPUs for the predictions") in capsys.readouterr().err
    assert find("", []) == ((False, None, 2), hardware.DEFAULT_GPU)
    assert gpu_measure.no_gpu_message("benchmarks/x.py") in \
        capsys.readouterr().err
    assert find("", gpu0, dry_run=True) == (
        (False, None, 0), hardware.DEFAULT_GPU)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name, rates", [
    # (fp32, tf32, fp16, bf16) dense TFLOP/s from the datasheets: V100 has
    # no TF32 (float32 products stay on the CUDA cores) and no bfloat16
    # tensor cores; the H100 datasheet's TF32 and FP16/BF16 figures are
    # with sparsity, twice these.
    ("V100-SXM2-16GB", (15.7, 15.7, 125, 15.7)),
    ("A100-SXM4-40GB", (19.5, 156, 312, 312)),
    ("H100-SXM5-80GB", (67, 494.5, 989.5, 989.5)),
])
def test_peak_flops_per_precision(name, rates):
    gpu = hardware.GPUS[name]
    assert tuple(gpu.peak_flops(p) / 1e12 for p in hardware.PRECISIONS) \
        == pytest.approx(rates, rel=1e-12)
    with pytest.raises(ValueError, match=r"^precision must be one of fp32, "
                       r"tf32, fp16, bf16; got 'fp8'$"):
        gpu.peak_flops("fp8")


def test_links_have_a_rate_each_way():
    for link in hardware.INTERCONNECTS.values():
        assert 0 < link.d2h_bytes_per_s <= link.bytes_per_s
        assert 0 < link.h2d_bytes_per_s <= link.bytes_per_s
    # PCIe and NVLink 2.0: their specification's rate both ways.
    for name in ("pcie3", "pcie4", "pcie5", "nvlink2"):
        link = hardware.INTERCONNECTS[name]
        assert link.h2d_bytes_per_s == link.d2h_bytes_per_s \
            == link.bytes_per_s
    # Grace Hopper: measured, far slower from the device to the host.
    c2c = hardware.INTERCONNECTS["nvlink-c2c"]
    assert (c2c.bytes_per_s, c2c.h2d_bytes_per_s, c2c.d2h_bytes_per_s) == (
        450e9, 416e9, 170e9)
    # A link made with one rate gets it both ways; either can be given.
    one = hardware.Interconnect("x", "x", 10.0, "test")
    assert (one.h2d_bytes_per_s, one.d2h_bytes_per_s) == (10.0, 10.0)
    two = hardware.Interconnect("x", "x", 10.0, "test", d2h_bytes_per_s=4.0)
    assert (two.h2d_bytes_per_s, two.d2h_bytes_per_s) == (10.0, 4.0)
