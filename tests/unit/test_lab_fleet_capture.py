"""Tests of lab/fleet_capture.py: multi-GPU `nvidia-smi -q -x` documents derived from a
real single-GPU capture for the simulated lab (tests/fixtures/nvidia-smi, SOURCES.md)."""
import importlib.util
import xml.etree.ElementTree as ET

import pytest

from conftest import FIXTURES, ROOT
from gpufleet import gpu

_spec = importlib.util.spec_from_file_location("fleet_capture", ROOT / "lab" / "fleet_capture.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
fleet_capture = _module.fleet_capture

CAPTURES = FIXTURES / "nvidia-smi"


def _capture(name):
    return (CAPTURES / name).read_bytes()


def test_fleet_capture_lives_in_the_lab_not_in_module_utils():
    assert not hasattr(gpu, "fleet_capture")
    assert "fleet_capture" not in (ROOT / "plugins/module_utils/gpufleet/gpu.py").read_text()


def test_fleet_capture_two_a100_on_r550():
    base = _capture("netdata-a100-sxm4-mig.xml").decode()
    text = fleet_capture(base, 2, driver_version="550.127.05", cuda_version="12.4",
                             mig_mode=False)
    assert "derived by gpufleet fleet_capture" in text and "nvsmi_device_v11.dtd" in text
    assert text == fleet_capture(base, 2, driver_version="550.127.05",
                                     cuda_version="12.4", mig_mode=False)
    facts = gpu.parse_nvidia_smi_xml(text)
    assert (facts["driver_version"], facts["cuda_driver_version"], facts["count"]) == (
        "550.127.05", "12.4", 2)
    root = ET.fromstring(text)
    assert root.findtext("attached_gpus") == "2"
    assert [g.findtext("minor_number") for g in root.findall("gpu")] == ["0", "1"]
    assert root.find("gpu/mig_devices/mig_device") is None
    original = gpu.parse_nvidia_smi_xml(base)["devices"][0]
    for device in facts["devices"]:
        assert device["mig_mode"] is False
        for key in ("name", "pci_device_id", "memory_total_mib", "compute_capability",
                    "architecture", "persistence_mode"):
            assert device[key] == original[key]
    assert len({d["uuid"] for d in facts["devices"]} | {original["uuid"]}) == 3
    assert [d["pci_bus_id"] for d in facts["devices"]] == [
        "00000000:00:04.0", "00000000:10:04.0"]


def test_fleet_capture_eight_and_one():
    base = _capture("telegraf-a100-sxm4-v12.xml").decode()
    facts = gpu.parse_nvidia_smi_xml(fleet_capture(base, 8))
    assert facts["count"] == 8 and facts["driver_version"] == "535.54.03"
    assert len({d["pci_bus_id"] for d in facts["devices"]}) == 8
    assert all(d["mig_mode"] for d in facts["devices"])  # mig_mode None keeps the capture's
    one = gpu.parse_nvidia_smi_xml(fleet_capture(
        _capture("netdata-rtx-4090-driver-535.xml"), 1, driver_version="535.129.03"))
    assert (one["driver_version"], one["cuda_driver_version"], one["count"]) == (
        "535.129.03", "12.2", 1)


@pytest.mark.parametrize("count", [0, 17, "2", True, None])
def test_fleet_capture_rejects_count(count):
    with pytest.raises(gpu.GpuFactsError, match="count"):
        fleet_capture(_capture("telegraf-tesla-t4.xml"), count)


def test_fleet_capture_rejects_bad_xml():
    with pytest.raises(gpu.GpuFactsError, match="malformed"):
        fleet_capture("<nvidia_smi_log>", 2)
    with pytest.raises(gpu.GpuFactsError, match="no <gpu>"):
        fleet_capture("<nvidia_smi_log><driver_version>1</driver_version></nvidia_smi_log>", 2)
