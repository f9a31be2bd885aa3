#!/usr/bin/env python3
"""Render each lab profile's nvidia-smi XML into OUTDIR/<profile>/nvidia-smi.xml.

Reads lab/profiles.yml; the GPUs come from the named real capture, replicated to the
profile's GPU count by lab/fleet_capture.py. Writes a file only when its content
changed, and prints a JSON line {"changed": [...]} for Ansible's changed_when.
"""
import json
import pathlib
import re
import sys
import xml.etree.ElementTree as ET

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
from fleet_capture import fleet_capture  # noqa: E402


def relabel(xml, values):
    """Replace a derived capture's GPU identity with values read off the real part.

    For what a capture cannot give (see lab/profiles.yml): every <gpu> gets the given
    product name, architecture, PCI device id, memory total, power limit and (per GPU,
    in order) PCI bus id, each only when given.
    """
    head, body = xml.split("<nvidia_smi_log", 1)
    root = ET.fromstring("<nvidia_smi_log" + body)
    for i, gpu in enumerate(root.findall("gpu")):
        for path, key in (("product_name", "product_name"), ("product_architecture", "product_architecture"),
                          ("pci/pci_device_id", "pci_device_id")):
            if key in values and gpu.find(path) is not None:
                gpu.find(path).text = values[key]
        if "memory_total_mib" in values:
            gpu.find("fb_memory_usage/total").text = "%d MiB" % values["memory_total_mib"]
        if "power_limit_w" in values:
            for el in gpu.iter():
                if re.fullmatch(r"(default_|enforced_|max_|current_)?power_limit", el.tag):
                    el.text = "%.2f W" % values["power_limit_w"]
        if "pci_bus_ids" in values:
            bus = values["pci_bus_ids"][i]
            gpu.set("id", bus)
            gpu.find("pci/pci_bus_id").text = bus
            gpu.find("pci/pci_bus").text = bus.split(":")[1]
    return head + ET.tostring(root, encoding="unicode") + "\n"


def main(outdir):
    profiles = yaml.safe_load((ROOT / "lab" / "profiles.yml").read_text())
    changed = []
    for name, p in profiles.items():
        capture = (ROOT / p["capture"]).read_text(encoding="utf-8")
        xml = fleet_capture(capture, p["gpu_count"], driver_version=p["driver_version"],
                            cuda_version=p["cuda_version"], mig_mode=p.get("mig_mode"))
        if p.get("relabel"):
            xml = relabel(xml, p["relabel"])
        target = pathlib.Path(outdir) / name / "nvidia-smi.xml"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text(encoding="utf-8") != xml:
            target.write_text(xml, encoding="utf-8")
            changed.append(name)
    print(json.dumps({"changed": changed}))


if __name__ == "__main__":
    main(sys.argv[1])
