"""What scripts/device-check.sh recorded on a real NVIDIA H200, held against gpufleet.

The fixtures tests/fixtures/nvidia-smi/device-h200-driver-580.{xml,json} come from one
run of the script on this workplace's GPU machine (SOURCES.md beside them): the GPU's
`nvidia-smi -q -x`, the gpu_facts module's output there through NVML, through
nvidia-smi and parsing that capture, libcuda's own CUDA version, and CUDA's and
PyTorch's memory figures. Nothing here was typed in by hand.
"""
import json

import pytest

from conftest import FIXTURES
from gpufleet import cuda as gcuda
from gpufleet import cuda_versions
from gpufleet import gpu
from gpufleet import tune

MiB = 1024 ** 2
CAPTURE = FIXTURES / "nvidia-smi" / "device-h200-driver-580.xml"
RECORD = json.loads((FIXTURES / "nvidia-smi" / "device-h200-driver-580.json").read_text())


def module_facts(source):
    return RECORD["gpu_facts"][source]["ansible_facts"]["gpu"]


def test_the_parser_here_gives_what_the_module_gave_there():
    assert gpu.parse_nvidia_smi_xml(CAPTURE.read_bytes()) == module_facts("capture")
    assert module_facts("nvidia-smi") == module_facts("capture")


def test_nvml_and_nvidia_smi_agree_on_every_device_fact():
    nvml, xml = module_facts("nvml"), module_facts("nvidia-smi")
    assert (nvml["source"], xml["source"]) == ("nvml", "nvidia-smi")
    # NVML reads NVLink per link (none up on this one-GPU machine); the XML cannot tell
    assert (nvml["nvlink"], xml["nvlink"]) == (False, None)
    same = ("present", "driver_version", "cuda_driver_version", "count", "devices")
    assert {k: nvml[k] for k in same} == {k: xml[k] for k in same}
    device = nvml["devices"][0]
    assert (device["name"], device["compute_capability"], device["architecture"],
            device["memory_total_mib"], device["memory_reserved_mib"]) == (
        "NVIDIA H200", "9.0", "hopper", 143771, 616)


def test_the_driver_cuda_version_is_what_libcuda_says():
    record = RECORD["cuda"]
    assert record["cuDriverGetVersion"] == record["nvml_cuda_driver_version"] == 13000
    assert cuda_versions.driver_cuda_version(record["driver_version"]) == record["libcuda_cuda"]
    assert module_facts("nvml")["cuda_driver_version"] == record["libcuda_cuda"]


@pytest.mark.parametrize("runtime,cuda,mode", [
    ("nvidia_cuda_runtime-13.2.86", "13.2", "minor_version"),
    ("nvidia_cuda_runtime_cu12-12.8.90", "12.8", "native"),
])
def test_cuda_runtimes_run_where_the_compatibility_check_says(runtime, cuda, mode):
    """A real libcudart newer than the driver's CUDA (13.2 on 13.0) ran on the H200 as
    CUDA 13 minor-version compatibility says, and an older one (12.8) natively; the
    check decides the same from the driver version alone."""
    record = RECORD["cuda"]
    (wheel,) = [w for w in record["runtimes"] if w.startswith(runtime + "-")]
    ran = record["runtimes"][wheel]["result"]
    major, minor = map(int, cuda.split("."))
    assert ran["cudaRuntimeGetVersion"] == [0, major * 1000 + minor * 10]
    assert ran["cudaDriverGetVersion"] == [0, 13000]
    assert ran["cudaGetDeviceCount"] == [0, 1] and ran["cudaMalloc_1MiB"] == [0]
    verdict = gcuda.check(record["driver_version"], ["9.0"], cuda_version=cuda,
                          datacenter_gpu=True)
    assert verdict["mode"] == mode and verdict["compatible"] is True


def test_cuda_total_is_the_gpu_total_less_the_reserved_memory():
    mem = RECORD["memory"]
    cuda_total = mem["after_context"]["cuda_total"]
    # before any CUDA program NVML counts only the driver's reserve as used
    assert mem["nvml_total"] - cuda_total == mem["nvml_used_before"] == mem["nvml_v2_reserved"]
    assert -(-mem["nvml_v2_reserved"] // MiB) == module_facts("nvml")["devices"][0][
        "memory_reserved_mib"]


def test_the_tuner_budgets_from_what_cuda_reports():
    """vLLM's budget is cudaMemGetInfo's total x gpu_memory_utilization; the tuner's GPU
    memory, from the module's facts, is within one MiB below it (whole MiB, rounded
    down). Control: from the total alone it would be 616 MiB too high."""
    cuda_total = RECORD["memory"]["after_context"]["cuda_total"]
    for source in ("nvml", "nvidia-smi"):
        planned = tune._check_gpus(module_facts(source)["devices"])[0]["memory_bytes"]
        assert 0 <= cuda_total - planned < MiB, source
    device = dict(module_facts("nvml")["devices"][0], memory_reserved_mib=None)
    over = tune._check_gpus([device])[0]["memory_bytes"] - cuda_total
    assert over == pytest.approx(616 * MiB, abs=MiB)


def test_the_non_torch_estimate_covers_a_cuda_context_and_cublas():
    """The tuner's NON_TORCH_BYTES (0.75 GiB) holds what a CUDA context and cuBLAS took
    outside PyTorch's allocator on the H200 (PyTorch 2.11, CUDA 13.0), the way vLLM's
    MemorySnapshot counts non-torch memory (CUDA used less torch reserved)."""
    mem = RECORD["memory"]
    measured = mem["after_cublas"]["non_torch"]
    assert measured == mem["after_cublas"]["cuda_used"] - mem["after_cublas"]["torch_reserved"]
    assert 0.5 * 2 ** 30 < measured <= tune.NON_TORCH_BYTES
    print(f"non-torch on an H200: {measured / MiB:,.0f} MiB measured, "
          f"{tune.NON_TORCH_BYTES / MiB:,.0f} MiB estimated")
