"""Tests of gpufleet.gpu and the gpu_facts module.

Inputs are real: nvidia-smi captures in tests/fixtures/nvidia-smi/ and lspci listings in
tests/fixtures/sysfs/ (sources in their SOURCES.md). The expected values below were read
from the XML by hand (driver_version, cuda_version, per-<gpu> product_name, uuid,
pci_bus_id, pci_device_id, fb_memory_usage/total, persistence_mode, current_mig,
product_architecture). NVML is replaced by a stand-in object that has pynvml's own
exception classes and constants.
"""
import json
import os
import re
import sys
import types
import xml.etree.ElementTree as ET

import pynvml
import pytest

from conftest import FIXTURES
from gpufleet import gpu
from helpers import run_module

import gpu_facts

CAPTURES = FIXTURES / "nvidia-smi"
SYSFS = FIXTURES / "sysfs"

# file: (driver, cuda, [(name, uuid, pci_bus_id, pci_device_id, memory_mib,
#                        compute_capability, architecture, persistence, mig)])
EXPECTED = {
    # captured by scripts/device-check.sh on this project's H200 device machine
    "device-h200-driver-580.xml": ("580.159.04", "13.0", [
        ("NVIDIA H200", "GPU-166192c3-cdf9-ffe9-5ed0-6358f1ce50db",
         "00000000:00:06.0", "0x2335", 143771, "9.0", "hopper", True, False)]),
    "netdata-a100-sxm4-mig.xml": ("510.47.03", "11.6", [
        ("NVIDIA A100-SXM4-40GB", "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a",
         "00000000:00:04.0", "0x20b0", 40960, "8.0", "ampere", False, True)]),
    "netdata-rtx-2080-win.xml": ("516.59", "11.7", [
        ("NVIDIA GeForce RTX 2080", "GPU-fbd55ed4-1eec-4423-0a47-ad594b4333e3",
         "00000000:0A:00.0", "0x1e87", 8192, "7.5", "turing", False, False)]),
    "netdata-rtx-3060.xml": ("515.65.01", "11.7", [
        ("NVIDIA GeForce RTX 3060 Laptop GPU", "GPU-473d8d0f-d462-185c-6b36-6fc23e23e571",
         "00000000:01:00.0", "0x2520", 6144, "8.6", "ampere", False, False)]),
    "netdata-rtx-4090-driver-535.xml": ("535.86.05", "12.2", [
        ("NVIDIA GeForce RTX 4090", "GPU-71d1acc2-662d-2166-bf9f-65272d2fc437",
         "00000000:84:00.0", "0x2684", 24564, "8.9", "ada", True, False)]),
    # trimmed upstream: no driver, pci, memory, persistence or MIG elements
    "netdata-rtx-pro-6000-driver-580.xml": (None, None, [
        ("NVIDIA RTX PRO 6000 Blackwell", "GPU-11111111-2222-3333-4444-555555555555",
         "00000000:01:00.0", None, None, "12.0", "blackwell", None, None)]),
    "netdata-tesla-p100.xml": ("510.47.03", "11.6", [
        ("Tesla P100-PCIE-16GB", "GPU-d3da8716-eaab-75db-efc1-60e88e1cd55e",
         "00000000:00:04.0", "0x15f8", 16384, "6.0", "pascal", False, False)]),
    "telegraf-a100-sxm4-v12.xml": ("535.54.03", "12.2", [
        ("NVIDIA A100-SXM4-80GB", "GPU-513536b6-7d19-9063-b049-1e69664bb298",
         "00000000:01:00.0", "0x20b2", 81920, "8.0", "ampere", False, True)]),
    # pci_device_id anonymised upstream (000000DE): no device id
    "telegraf-a10g.xml": ("515.105.01", "11.7", [
        ("NVIDIA A10G", "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94",
         "00000000:00:1E.0", None, 23028, "8.6", "ampere", False, False)]),
    "telegraf-dual_a5000-v13.xml": ("590.44.01", "13.1", [
        ("NVIDIA RTX A5000", "GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
         "00000000:81:00.0", "0x2231", 24564, "8.6", "ampere", True, False),
        ("NVIDIA RTX A5000", "GPU-12345678-aaaa-bbbb-cccc-0123456789cd",
         "00000000:C1:00.0", "0x2231", 24564, "8.6", "ampere", True, False)]),
    # R418 predates the card: name "Graphics Device", no architecture, no mig_mode;
    # the compute capability comes from the PCI id (0x2184, TU116)
    "telegraf-gtx-1660-ti.xml": ("418.43", "10.1", [
        ("Graphics Device", "GPU-304a277d-3545-63b8-3a36-dfde3c992989",
         "00000000:43:00.0", "0x2184", 5912, "7.5", "turing", False, None)]),
    "telegraf-pro-6000-maxq-blackwell-v13.xml": ("590.44.01", "13.1", [
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
         "GPU-12345678-aaaa-bbbb-cccc-0123456789ab", "00000000:61:00.0", "0x2bb4", 97887,
         "12.0", "blackwell", True, False)]),
    "telegraf-quadro-p2000-v12.xml": ("525.125.06", "12.0", [
        ("Quadro P2000", "GPU-396caaed-39ca-3199-2e68-717cdb786ec6",
         "00000000:17:00.0", "0x1c30", 5120, "6.1", "pascal", True, False)]),
    "telegraf-rtx-3060-v12.xml": ("570.124.04", "12.8", [
        ("NVIDIA GeForce RTX 3060", "GPU-d6889ff6-2523-9142-ca3c-1ca3f396a625",
         "00000000:2D:00.0", "0x2487", 12288, "8.6", "ampere", True, False)]),
    "telegraf-rtx-3080-v12.xml": ("536.40", "12.2", [
        ("NVIDIA GeForce RTX 3080", "GPU-19d6d965-2acc-f646-00f8-4c76979aabb4",
         "00000000:04:00.0", "0x2216", 10240, "8.6", "ampere", False, False)]),
    "telegraf-rtx-3080-v13.xml": ("595.58.03", "13.2", [
        ("NVIDIA GeForce RTX 3080", "GPU-19d6d965-2acc-f646-00f8-4c76979aabb4",
         "00000000:0C:00.0", "0x2216", 10240, "8.6", "ampere", False, False)]),
    "telegraf-tesla-t4.xml": ("515.105.01", "11.7", [
        ("Tesla T4", "GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
         "00000000:00:1E.0", "0x1eb8", 15360, "7.5", "turing", False, False)]),
}
# file: per <gpu>, fb_memory_usage/reserved in MiB as the XML says it (read by hand;
# None where the driver prints none: R418, and the trimmed R580 excerpt)
RESERVED_MIB = {
    "device-h200-driver-580.xml": [616], "netdata-a100-sxm4-mig.xml": [605],
    "netdata-rtx-2080-win.xml": [182], "netdata-rtx-3060.xml": [197],
    "netdata-rtx-4090-driver-535.xml": [346], "netdata-rtx-pro-6000-driver-580.xml": [None],
    "netdata-tesla-p100.xml": [103], "telegraf-a100-sxm4-v12.xml": [869],
    "telegraf-a10g.xml": [435], "telegraf-dual_a5000-v13.xml": [450, 450],
    "telegraf-gtx-1660-ti.xml": [None], "telegraf-pro-6000-maxq-blackwell-v13.xml": [637],
    "telegraf-quadro-p2000-v12.xml": [66], "telegraf-rtx-3060-v12.xml": [368],
    "telegraf-rtx-3080-v12.xml": [173], "telegraf-rtx-3080-v13.xml": [397],
    "telegraf-tesla-t4.xml": [388],
}
DEVICE_KEYS = ("name", "uuid", "pci_bus_id", "pci_device_id", "memory_total_mib",
               "compute_capability", "architecture", "persistence_mode", "mig_mode")
FACT_KEYS = {"present", "source", "driver_version", "cuda_driver_version", "count",
             "nvlink", "devices"}


def _capture(name):
    return (CAPTURES / name).read_bytes()


# ---------------------------------------------------------------------------
# nvidia-smi XML
# ---------------------------------------------------------------------------

def test_every_capture_has_expectations_and_a_source():
    files = sorted(p.name for p in CAPTURES.glob("*.xml"))
    assert files == sorted(EXPECTED)
    sources = (CAPTURES / "SOURCES.md").read_text()
    for name in files:
        assert name in sources, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parse_capture(name):
    driver, cuda, devices = EXPECTED[name]
    facts = gpu.parse_nvidia_smi_xml(_capture(name))
    assert set(facts) == FACT_KEYS
    assert facts["source"] == "nvidia-smi"
    assert facts["present"] is True
    assert facts["driver_version"] == driver
    assert facts["cuda_driver_version"] == cuda
    assert facts["count"] == len(devices)
    assert facts["nvlink"] is None  # none of these GPUs reports an NVLink fabric
    got = [tuple(d[k] for k in DEVICE_KEYS) for d in facts["devices"]]
    assert got == devices
    assert [d["index"] for d in facts["devices"]] == list(range(len(devices)))
    json.dumps(facts)  # plain data


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reserved_memory_of_each_capture(name):
    facts = gpu.parse_nvidia_smi_xml(_capture(name))
    assert [d["memory_reserved_mib"] for d in facts["devices"]] == RESERVED_MIB[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tables_agree_with_what_the_driver_says(name):
    """Where a capture names its architecture, our compute-capability tables (by product
    name and by PCI id) must lead to the same architecture."""
    root = ET.fromstring(_capture(name))
    for element, device in zip(root.findall("gpu"),
                               gpu.parse_nvidia_smi_xml(_capture(name))["devices"]):
        said = (element.findtext("product_architecture") or "").strip().lower()
        by_name = gpu.compute_capability_for(device["name"])
        if by_name is not None and said:
            assert gpu.architecture_for(by_name) == {"ada lovelace": "ada"}.get(said, said)
        if device["pci_device_id"] is not None and by_name is not None:
            table_cc = gpu.pci_device_info(int(device["pci_device_id"], 16))[1]
            assert table_cc in (None, by_name)


def test_index_is_document_order_not_minor_number():
    root = ET.fromstring(_capture("telegraf-dual_a5000-v13.xml"))
    assert [g.findtext("minor_number") for g in root.findall("gpu")] == ["1", "0"]
    facts = gpu.parse_nvidia_smi_xml(_capture("telegraf-dual_a5000-v13.xml"))
    assert [(d["index"], d["pci_bus_id"]) for d in facts["devices"]] == [
        (0, "00000000:81:00.0"), (1, "00000000:C1:00.0")]


def test_mig_instances_memory_is_not_the_gpu_memory():
    text = _capture("netdata-a100-sxm4-mig.xml").decode()
    assert "<total>19968 MiB</total>" in text  # a MIG instance's own fb_memory_usage
    device = gpu.parse_nvidia_smi_xml(text)["devices"][0]
    assert device["memory_total_mib"] == 40960 and device["mig_mode"] is True


def test_count_is_the_gpus_in_the_document():
    # telegraf's A100 capture says attached_gpus 4 but keeps one <gpu>
    assert "<attached_gpus>4</attached_gpus>" in _capture("telegraf-a100-sxm4-v12.xml").decode()
    assert gpu.parse_nvidia_smi_xml(_capture("telegraf-a100-sxm4-v12.xml"))["count"] == 1


def _with_fabric_state(state):
    text = _capture("telegraf-dual_a5000-v13.xml").decode()
    return text.replace("<fabric>\n\t\t\t<state>N/A</state>",
                        "<fabric>\n\t\t\t<state>%s</state>" % state, 1)


def test_nvlink_fabric_state():
    assert gpu.parse_nvidia_smi_xml(_with_fabric_state("Completed"))["nvlink"] is True
    assert gpu.parse_nvidia_smi_xml(_with_fabric_state("N/A"))["nvlink"] is None


def test_compute_cap_element_wins_when_present():
    text = _capture("netdata-rtx-4090-driver-535.xml").decode().replace(
        "<product_architecture>", "<compute_cap>8.9</compute_cap><product_architecture>", 1)
    assert gpu.parse_nvidia_smi_xml(text)["devices"][0]["compute_capability"] == "8.9"


def test_no_gpu_document():
    facts = gpu.parse_nvidia_smi_xml(
        '<?xml version="1.0" ?>\n<nvidia_smi_log><driver_version>550.54.15</driver_version>'
        "<cuda_version>12.4</cuda_version><attached_gpus>0</attached_gpus></nvidia_smi_log>")
    assert facts == gpu.empty_facts("nvidia-smi", "550.54.15", "12.4")


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("   \n", "empty"),
    (_capture("netdata-tesla-p100.xml")[:4000], "malformed"),
    ("<html><body>502</body></html>", "not <nvidia_smi_log>"),
    ('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><nvidia_smi_log>&a;'
     "</nvidia_smi_log>", "entities"),
    ("<nvidia_smi_log><gpu><fb_memory_usage><total>80 GB</total></fb_memory_usage></gpu>"
     "</nvidia_smi_log>", "'N MiB'"),
])
def test_bad_xml(text, message):
    with pytest.raises(gpu.GpuFactsError, match=re.escape(message)):
        gpu.parse_nvidia_smi_xml(text)


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("cc, arch", [
    ("3.5", "kepler"), ("5.2", "maxwell"), ("6.0", "pascal"), ("6.1", "pascal"),
    ("7.0", "volta"), ("7.5", "turing"), ("8.0", "ampere"), ("8.6", "ampere"),
    ("8.7", "ampere"), ("8.9", "ada"), ("9.0", "hopper"), ("10.0", "blackwell"),
    ("10.3", "blackwell"), ("11.0", "blackwell"), ("12.0", "blackwell"), ((9, 0), "hopper"),
    ("4.0", None), (None, None),
])
def test_architecture_for(cc, arch):
    assert gpu.architecture_for(cc) == arch


def test_architecture_for_rejects_garbage():
    with pytest.raises(gpu.GpuFactsError, match="MAJOR.MINOR"):
        gpu.architecture_for("90")


# Names as NVML / nvidia-smi print them.
@pytest.mark.parametrize("name, cc", [
    ("NVIDIA H100 80GB HBM3", "9.0"), ("NVIDIA H100 PCIe", "9.0"), ("NVIDIA H100 NVL", "9.0"),
    ("NVIDIA H200", "9.0"), ("NVIDIA H200 NVL", "9.0"), ("NVIDIA GH200 480GB", "9.0"),
    ("NVIDIA H800", "9.0"), ("NVIDIA B200", "10.0"), ("NVIDIA B300 SXM6 AC", "10.3"),
    ("NVIDIA A100-SXM4-40GB", "8.0"), ("NVIDIA A100-SXM4-80GB", "8.0"),
    ("NVIDIA A100 80GB PCIe", "8.0"), ("NVIDIA A100-PCIE-40GB", "8.0"), ("NVIDIA A30", "8.0"),
    ("NVIDIA A10", "8.6"), ("NVIDIA A10G", "8.6"), ("NVIDIA A40", "8.6"),
    ("NVIDIA RTX A6000", "8.6"), ("NVIDIA GeForce RTX 3090", "8.6"),
    ("NVIDIA L4", "8.9"), ("NVIDIA L40S", "8.9"), ("NVIDIA L40", "8.9"),
    ("NVIDIA GeForce RTX 4090", "8.9"), ("NVIDIA RTX 6000 Ada Generation", "8.9"),
    ("NVIDIA RTX 5000 Ada Generation", "8.9"), ("Quadro RTX 5000", "7.5"),
    ("NVIDIA GeForce RTX 5090", "12.0"), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0"),
    ("Tesla T4", "7.5"), ("NVIDIA GeForce RTX 2080 Ti", "7.5"),
    ("Tesla V100-SXM2-32GB", "7.0"), ("Tesla V100S-PCIE-32GB", "7.0"),
    ("Tesla P100-PCIE-16GB", "6.0"), ("NVIDIA GeForce GTX 1080 Ti", "6.1"), ("Tesla P40", "6.1"),
    ("GRID P4-1Q", "6.1"), ("Tesla M40 24GB", "5.2"), ("Tesla M60", "5.2"), ("Tesla M10", "5.0"),
    ("Graphics Device", None), ("", None), (None, None),
])
def test_compute_capability_for(name, cc):
    assert gpu.compute_capability_for(name) == cc


def test_pci_table_agrees_with_name_table():
    for device_id, (name, cc) in gpu._PCI_DEVICES.items():
        assert gpu.compute_capability_for(name) == cc, (hex(device_id), name)
        assert gpu.architecture_for(cc) is not None


@pytest.mark.parametrize("device_id, name", [
    (0x1DB4, "Tesla V100 PCIe 16GB"), (0x1EB8, "Tesla T4"), (0x2236, "A10"),
    (0x20B0, "A100 SXM4 40GB"), (0x20B2, "A100 SXM4 80GB"), (0x20B1, "A100 PCIe 40GB"),
    (0x20B5, "A100 PCIe 80GB"), (0x20B7, "A30 PCIe"), (0x27B8, "L4"), (0x26B9, "L40S"),
    (0x2330, "H100 SXM5 80GB"), (0x2331, "H100 PCIe"), (0x2321, "H100L 94GB (H100 NVL)"),
    (0x2335, "H200 SXM 141GB"), (0x2901, "B200"), (0x2204, "GeForce RTX 3090"),
    (0x2684, "GeForce RTX 4090"), (0x2B85, "GeForce RTX 5090"),
    (0x1B06, "GeForce GTX 1080 Ti"), (0x15F8, "Tesla P100 PCIe 16GB"), (0x17FD, "Tesla M40"),
    (0x13F2, "Tesla M60"),
])
def test_pci_table_covers_the_common_parts(device_id, name):
    assert gpu.pci_device_info(device_id)[0] == name


@pytest.mark.parametrize("value, text", [(12020, "12.2"), (13000, "13.0"), (11080, "11.8"),
                                         (12090, "12.9"), ("12040", "12.4")])
def test_cuda_version_from_int(value, text):
    assert gpu.cuda_version_from_int(value) == text


@pytest.mark.parametrize("value", [0, -12020, "12.2", None])
def test_cuda_version_from_int_rejects(value):
    with pytest.raises(gpu.GpuFactsError, match="12020"):
        gpu.cuda_version_from_int(value)


def test_open_kernel_modules_supported():
    p100 = gpu.parse_nvidia_smi_xml(_capture("netdata-tesla-p100.xml"))
    t4 = gpu.parse_nvidia_smi_xml(_capture("telegraf-tesla-t4.xml"))
    unnamed = gpu.parse_nvidia_smi_xml(_capture("telegraf-gtx-1660-ti.xml"))
    assert gpu.open_kernel_modules_supported(p100) is False
    assert gpu.open_kernel_modules_supported(t4) is True
    assert gpu.open_kernel_modules_supported(unnamed) is True  # 7.5 from the PCI id
    mixed = dict(t4, devices=t4["devices"] + p100["devices"])
    assert gpu.open_kernel_modules_supported(mixed) is False
    assert gpu.open_kernel_modules_supported(gpu.empty_facts()) is None
    unknown = dict(t4, devices=[dict(t4["devices"][0], compute_capability=None)])
    assert gpu.open_kernel_modules_supported(unknown) is None


# ---------------------------------------------------------------------------
# PCI bus
# ---------------------------------------------------------------------------

_LSPCI = re.compile(r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) .*\[([0-9a-f]{4})\]: "
                    r".*\[([0-9a-f]{4}):([0-9a-f]{4})\]")


def sysfs_from_lspci(root, listing, nvidia_version=None):
    """A sysfs tree, laid out as the kernel does, for the devices in `lspci -nn` output."""
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    for line in listing.splitlines():
        match = _LSPCI.match(line)
        assert match, line
        domain, address, cls, vendor, device = match.groups()
        address = "%s:%s" % (domain or "0000", address)
        real = root / "devices" / ("pci%s:00" % address[:4]) / address
        real.mkdir(parents=True)
        (real / "vendor").write_text("0x%s\n" % vendor)
        (real / "device").write_text("0x%s\n" % device)
        (real / "class").write_text("0x%s00\n" % cls)
        os.symlink(os.path.relpath(real, devices), devices / address)
    if nvidia_version:
        (root / "module" / "nvidia").mkdir(parents=True)
        (root / "module" / "nvidia" / "version").write_text(nvidia_version + "\n")
    return root


def test_pci_eight_a100_with_nvswitch_bridges(tmp_path):
    root = sysfs_from_lspci(tmp_path, (SYSFS / "gpud-lspci.nn.a100").read_text())
    facts = gpu.facts_from_pci(str(root))
    assert set(facts) == FACT_KEYS
    assert (facts["present"], facts["source"], facts["count"]) == (True, "pci", 8)
    assert (facts["driver_version"], facts["cuda_driver_version"], facts["nvlink"]) == (
        None, None, None)
    # the six NVIDIA bridges (class 0680, 10de:1af1) are NVSwitches, not GPUs
    assert [d["pci_bus_id"] for d in facts["devices"]] == [
        "0000%04X:00:00.0" % n for n in (1, 2, 3, 4, 0xB, 0xC, 0xD, 0xE)]
    for index, device in enumerate(facts["devices"]):
        assert device == {
            "index": index, "name": "A100 SXM4 80GB", "uuid": None,
            "pci_bus_id": device["pci_bus_id"], "pci_device_id": "0x20b2",
            "memory_total_mib": None, "memory_reserved_mib": None,
            "compute_capability": "8.0", "architecture": "ampere",
            "persistence_mode": None, "mig_mode": None, "brand": None, "datacenter": None}
    assert gpu.open_kernel_modules_supported(facts) is True


def test_pci_vm_with_virtio_vga_and_loaded_driver(tmp_path):
    root = sysfs_from_lspci(tmp_path, (SYSFS / "gpud-lspci.nn.a10").read_text(),
                            nvidia_version="550.127.05")
    facts = gpu.facts_from_pci(str(root))
    assert facts["count"] == 1 and facts["driver_version"] == "550.127.05"
    device = facts["devices"][0]
    assert (device["pci_bus_id"], device["pci_device_id"], device["name"],
            device["compute_capability"]) == ("00000000:06:00.0", "0x2236", "A10", "8.6")


def test_pci_unknown_nvidia_part_and_pascal(tmp_path):
    root = sysfs_from_lspci(tmp_path, "\n".join([
        "0000:3b:00.0 VGA compatible controller [0300]: NVIDIA Corporation GP102 [10de:1b06]",
        "0000:3b:00.1 Audio device [0403]: NVIDIA Corporation GP102 HDMI Audio [10de:10ef]",
        "0000:5e:00.0 3D controller [0302]: NVIDIA Corporation Device [10de:ffff]",
    ]))
    facts = gpu.facts_from_pci(str(root))
    assert [(d["name"], d["compute_capability"], d["architecture"]) for d in facts["devices"]] \
        == [("GeForce GTX 1080 Ti", "6.1", "pascal"), (None, None, None)]
    assert gpu.open_kernel_modules_supported(facts) is None  # one part unknown


def test_pci_without_sysfs(tmp_path):
    assert gpu.facts_from_pci(str(tmp_path / "missing")) == gpu.empty_facts("pci")


# ---------------------------------------------------------------------------
# NVML (stand-in object with pynvml's errors and constants)
# ---------------------------------------------------------------------------

class FakeNVML(types.SimpleNamespace):
    """Answers like pynvml for a list of GPU dicts; counts init/shutdown."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS

    def __init__(self, gpus, driver="550.54.15", cuda=12040, init_error=None):
        super().__init__(gpus=gpus, driver=driver, cuda=cuda, init_error=init_error,
                         calls=[])

    def nvmlInit(self):
        self.calls.append("init")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetPciInfo(self, h):
        return types.SimpleNamespace(busId=h["bus"], pciDeviceId=h["pci_id"])

    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        if version is None:
            return types.SimpleNamespace(total=h["mib"] * 2**20, free=0, used=0)
        assert version == pynvml.nvmlMemory_v2
        if h.get("reserved") is None:  # a driver before R510: no _v2 entry point
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return types.SimpleNamespace(version=version, total=h["mib"] * 2**20,
                                     reserved=h["reserved"], free=0, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return h["cc"]

    def nvmlDeviceGetPersistenceMode(self, h):
        return h["persistence"]

    def nvmlDeviceGetBrand(self, h):
        return h["brand"]

    def nvmlDeviceGetMigMode(self, h):
        if h["mig"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [h["mig"], h["mig"]]

    def nvmlDeviceGetNvLinkState(self, h, link):
        if h["links"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(h["links"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return h["links"][link]


def h100(index):
    return {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-h100-%d" % index,
            "bus": ("00000000:%02X:00.0" % (0x18 + 0x10 * index)).encode(),
            "pci_id": 0x233010DE, "mib": 81559, "cc": (9, 0), "persistence": 1,
            "mig": 0, "links": [1] * 18, "brand": pynvml.NVML_BRAND_NVIDIA,
            "reserved": 459_276_288}


def rtx4090():
    return {"name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-4090", "bus": "00000000:01:00.0",
            "pci_id": 0x268410DE, "mib": 24564, "cc": (8, 9), "persistence": 0,
            "mig": None, "links": None, "brand": pynvml.NVML_BRAND_GEFORCE}


def test_nvml_eight_h100():
    nvml = FakeNVML([h100(i) for i in range(8)])
    facts = gpu.facts_from_nvml(nvml)
    assert nvml.calls == ["init", "shutdown"]
    assert {k: facts[k] for k in FACT_KEYS - {"devices"}} == {
        "present": True, "source": "nvml", "driver_version": "550.54.15",
        "cuda_driver_version": "12.4", "count": 8, "nvlink": True}
    assert facts["devices"][7] == {
        "index": 7, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-h100-7",
        "pci_bus_id": "00000000:88:00.0", "pci_device_id": "0x2330",
        "memory_total_mib": 81559, "memory_reserved_mib": 438,
        "compute_capability": "9.0", "architecture": "hopper",
        "persistence_mode": True, "mig_mode": False, "brand": "NVIDIA", "datacenter": True}


def test_nvml_reserved_memory_rounds_up_as_nvidia_smi_prints_it():
    # the H200 of tests/fixtures/nvidia-smi/device-h200-driver-580.*: NVML's reserved
    # 644,939,776 bytes (615.06 MiB); nvidia-smi on the same GPU printed 616 MiB
    h200 = dict(h100(0), name="NVIDIA H200", mib=143771, reserved=644_939_776)
    assert gpu.facts_from_nvml(FakeNVML([h200]))["devices"][0]["memory_reserved_mib"] == 616


def test_nvml_reserved_memory_unknown_without_memory_info_v2():
    old_driver = FakeNVML([rtx4090()])  # nvmlDeviceGetMemoryInfo_v2 missing
    assert gpu.facts_from_nvml(old_driver)["devices"][0]["memory_reserved_mib"] is None
    old_binding = FakeNVML([h100(0)])
    old_binding.nvmlMemory_v2 = None  # an nvidia-ml-py without the v2 structure
    assert gpu.facts_from_nvml(old_binding)["devices"][0]["memory_reserved_mib"] is None


def test_nvml_geforce_without_mig_or_nvlink():
    facts = gpu.facts_from_nvml(FakeNVML([rtx4090()], driver="535.129.03", cuda=12020))
    device = facts["devices"][0]
    assert (facts["nvlink"], facts["cuda_driver_version"]) == (False, "12.2")
    assert (device["mig_mode"], device["persistence_mode"], device["architecture"]) == (
        False, False, "ada")


def test_nvml_nvlink_links_down_and_unknown():
    down = dict(h100(0), links=[0] * 18)
    assert gpu.facts_from_nvml(FakeNVML([down]))["nvlink"] is False
    nvml = FakeNVML([h100(0)])
    nvml.nvmlDeviceGetNvLinkState = lambda h, link: (_ for _ in ()).throw(
        pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
    assert gpu.facts_from_nvml(nvml)["nvlink"] is None


def test_nvml_shuts_down_after_a_failure():
    nvml = FakeNVML([h100(0)])
    nvml.nvmlDeviceGetUUID = lambda h: (_ for _ in ()).throw(
        pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        gpu.facts_from_nvml(nvml)
    assert nvml.calls == ["init", "shutdown"]


def test_nvml_real_library_is_absent_here():
    """This machine has no driver: the real pynvml raises LibraryNotFound, which gather
    treats as a fallback."""
    facts, probes = gpu.gather(sources=["nvml"])
    if probes[0]["result"] == "ok":  # pragma: no cover (a machine with a GPU)
        pytest.skip("NVML is available on this machine")
    assert probes[0]["result"] == "failed" and "NVMLError" in probes[0]["detail"]
    assert facts == gpu.empty_facts()


# ---------------------------------------------------------------------------
# gather
# ---------------------------------------------------------------------------

def test_gather_falls_back_nvml_to_nvidia_smi():
    nvml = FakeNVML([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    facts, probes = gpu.gather(nvml=nvml, run_nvidia_smi=lambda: _capture(
        "netdata-rtx-4090-driver-535.xml").decode(), sysfs_root="/nonexistent")
    assert facts["source"] == "nvidia-smi" and facts["count"] == 1
    assert [p["result"] for p in probes] == ["failed", "ok"]
    assert "NVMLError_LibraryNotFound" in probes[0]["detail"]


def test_gather_falls_back_to_pci(tmp_path):
    root = sysfs_from_lspci(tmp_path, (SYSFS / "gpud-lspci.nn.a100").read_text())

    def broken_smi():
        raise RuntimeError("nvidia-smi -q -x exited 9: NVIDIA-SMI has failed")

    nvml = FakeNVML([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    facts, probes = gpu.gather(nvml=nvml, run_nvidia_smi=broken_smi, sysfs_root=str(root))
    assert (facts["source"], facts["count"]) == ("pci", 8)
    assert [(p["source"], p["result"]) for p in probes] == [
        ("nvml", "failed"), ("nvidia-smi", "failed"), ("pci", "ok")]
    assert "exited 9" in probes[1]["detail"]


def test_gather_nvml_wins_and_stops():
    calls = []
    facts, probes = gpu.gather(nvml=FakeNVML([rtx4090()]),
                               run_nvidia_smi=lambda: calls.append("smi"))
    assert facts["source"] == "nvml" and calls == [] and len(probes) == 1


def test_gather_driver_without_gpu_keeps_versions(tmp_path):
    facts, probes = gpu.gather(nvml=FakeNVML([], driver="580.95.05", cuda=13000),
                               run_nvidia_smi=None, sysfs_root=str(tmp_path))
    assert facts == gpu.empty_facts("none", "580.95.05", "13.0")
    assert [p["result"] for p in probes] == ["ok", "unavailable", "ok"]


def test_gather_respects_order_and_rejects_unknown_sources(tmp_path):
    root = sysfs_from_lspci(tmp_path, (SYSFS / "gpud-lspci.nn.a10").read_text())
    facts, _ = gpu.gather(sources=["pci", "nvml"], nvml=FakeNVML([rtx4090()]),
                          sysfs_root=str(root))
    assert facts["source"] == "pci"
    with pytest.raises(gpu.GpuFactsError, match="rocm"):
        gpu.gather(sources=["nvml", "rocm"])


# ---------------------------------------------------------------------------
# The gpu_facts module
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("check_mode", [False, True])
def test_module_parses_a_capture(monkeypatch, check_mode):
    path = CAPTURES / "telegraf-dual_a5000-v13.xml"
    result, failed = run_module(gpu_facts.main, {"nvidia_smi_xml": str(path)}, monkeypatch,
                                check_mode=check_mode)
    assert not failed and result["changed"] is False
    assert result["ansible_facts"]["gpu"] == gpu.parse_nvidia_smi_xml(path.read_bytes())
    assert result["probes"][0]["source"] == "nvidia-smi"


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "missing.xml", "cannot read nvidia_smi_xml"),
    (lambda tmp: tmp, "cannot read nvidia_smi_xml"),  # a directory
    (lambda tmp: _write(tmp / "cut.xml", _capture("netdata-tesla-p100.xml")[:3000]),
     "malformed"),
    (lambda tmp: _write(tmp / "html.xml", b"<html/>"), "not <nvidia_smi_log>"),
])
def test_module_bad_capture(monkeypatch, tmp_path, make, message):
    result, failed = run_module(gpu_facts.main, {"nvidia_smi_xml": str(make(tmp_path))},
                                monkeypatch)
    assert failed and message in result["msg"] and "nvidia-smi -q -x" in result["msg"]
    assert "ansible_facts" not in result


def _write(path, data):
    path.write_bytes(data)
    return path


def _fake_nvidia_smi(tmp_path, body):
    """A stand-in nvidia-smi: a shell script (real process, run by run_command)."""
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


def _no_nvml(monkeypatch):
    """Make `import pynvml` in the module give a library that finds no driver, whatever
    machine the tests run on."""
    monkeypatch.setitem(sys.modules, "pynvml",
                        FakeNVML([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))


def test_module_uses_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([h100(i) for i in range(8)],
                                                        driver="580.95.05", cuda=13000))
    result, failed = run_module(gpu_facts.main, {}, monkeypatch)
    facts = result["ansible_facts"]["gpu"]
    assert not failed and result["changed"] is False
    assert (facts["source"], facts["count"], facts["driver_version"],
            facts["cuda_driver_version"], facts["nvlink"]) == (
        "nvml", 8, "580.95.05", "13.0", True)
    assert result["probes"] == [{"source": "nvml", "result": "ok", "count": 8}]


def test_module_runs_nvidia_smi(monkeypatch, tmp_path):
    _no_nvml(monkeypatch)
    capture = CAPTURES / "telegraf-rtx-3060-v12.xml"
    smi = _fake_nvidia_smi(tmp_path, '[ "$1 $2" = "-q -x" ] || exit 3\ncat %s' % capture)
    result, failed = run_module(gpu_facts.main, {
        "nvidia_smi_path": smi, "sources": ["nvml", "nvidia-smi"]}, monkeypatch)
    assert not failed and result["changed"] is False
    facts = result["ansible_facts"]["gpu"]
    assert (facts["source"], facts["driver_version"], facts["cuda_driver_version"]) == (
        "nvidia-smi", "570.124.04", "12.8")


def test_module_falls_back_to_pci(monkeypatch, tmp_path):
    _no_nvml(monkeypatch)
    sysfs = sysfs_from_lspci(tmp_path / "sys", (SYSFS / "gpud-lspci.nn.a100").read_text())
    smi = _fake_nvidia_smi(tmp_path, "echo 'NVIDIA-SMI has failed because it could not "
                                     "communicate with the NVIDIA driver.'\nexit 9")
    result, failed = run_module(gpu_facts.main, {
        "nvidia_smi_path": smi, "sysfs_root": str(sysfs)}, monkeypatch, check_mode=True)
    assert not failed and result["changed"] is False
    assert (result["ansible_facts"]["gpu"]["source"],
            result["ansible_facts"]["gpu"]["count"]) == ("pci", 8)
    assert [p["result"] for p in result["probes"]] == ["failed", "failed", "ok"]
    assert "NVMLError_LibraryNotFound" in result["probes"][0]["detail"]
    assert "exited 9" in result["probes"][1]["detail"]


def test_module_nothing_found(monkeypatch, tmp_path):
    result, failed = run_module(gpu_facts.main, {
        "sources": ["pci"], "sysfs_root": str(tmp_path)}, monkeypatch)
    assert not failed and result["ansible_facts"]["gpu"] == gpu.empty_facts()


@pytest.mark.parametrize("args, message", [
    ({"nvidia_smi_path": "/nonexistent/nvidia-smi"}, "not an executable file"),
    ({"sources": ["nvml", "rocm"]}, "rocm"),
    ({"sources": []}, "sources is empty"),
])
def test_module_bad_options(monkeypatch, args, message):
    result, failed = run_module(gpu_facts.main, args, monkeypatch)
    assert failed and message in result["msg"]


def test_module_documentation_is_yaml():
    import yaml

    doc = yaml.safe_load(gpu_facts.DOCUMENTATION)
    assert doc["module"] == "gpu_facts"
    assert doc["extends_documentation_fragment"] == ["gpufleet.fleet.gpufleet.read_only"]  # check mode: full
    assert doc["attributes"]["facts"]["support"] == "full"
    assert set(doc["options"]) == {"nvidia_smi_xml", "nvidia_smi_path", "sysfs_root",
                                   "sources"}
    yaml.safe_load(gpu_facts.EXAMPLES)
    assert "gpu" in yaml.safe_load(gpu_facts.RETURN)["ansible_facts"]["contains"]


@pytest.mark.parametrize("capture,brand,datacenter", [
    ("netdata-rtx-4090-driver-535.xml", "GeForce", False),
    ("netdata-a100-sxm4-mig.xml", "NVIDIA", True),
    ("netdata-tesla-p100.xml", "Tesla", True),
    ("telegraf-tesla-t4.xml", "NVIDIA", True),
    ("telegraf-dual_a5000-v13.xml", "NVIDIA RTX", False),
    ("telegraf-quadro-p2000-v12.xml", "Quadro", False),
])
def test_brand_and_datacenter_from_xml(capture, brand, datacenter):
    facts = gpu.parse_nvidia_smi_xml((FIXTURES / "nvidia-smi" / capture).read_text())
    assert {(d["brand"], d["datacenter"]) for d in facts["devices"]} == {(brand, datacenter)}


def test_brand_from_nvml():
    facts = gpu.facts_from_nvml(FakeNVML([rtx4090()]))
    assert facts["devices"][0]["brand"] == "GeForce" and facts["devices"][0]["datacenter"] is False
