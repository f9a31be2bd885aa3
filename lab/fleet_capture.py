#!/usr/bin/env python3
"""Derived `nvidia-smi -q -x` documents for the simulated lab (lab/render_profiles.py).

Lab-only: it builds test inputs, so it lives beside the lab and not in module_utils
(which holds only what the modules and filters run). It reuses gpufleet.gpu's parser, so
a derived document is checked by the same code that reads real captures.
"""
from __future__ import annotations

import copy
import pathlib
import re
import uuid as uuidlib
import xml.etree.ElementTree as ET
from gpufleet.gpu import GpuFactsError, _bus_id, _value, parse_nvidia_smi_xml  # noqa: E402


def fleet_capture(xml_text, count, driver_version=None, cuda_version=None,
                  mig_mode=None):
    """A `count`-GPU `nvidia-smi -q -x` document derived from a real capture.

    The first <gpu> of `xml_text` is replicated `count` times with distinct
    minor_number (0..count-1), uuid (a UUIDv5 of the original uuid and the index,
    so the result is deterministic), serial, and PCI bus (the capture's bus, then
    +0x10 per GPU; device and function kept). driver_version / cuda_version replace
    the document's (and the GSP firmware version when it equalled the driver version). mig_mode=False turns
    MIG off (current/pending "Disabled", no MIG devices), True on. The result
    starts with an XML comment saying it is derived, so it is never mistaken for a
    capture.
    """
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 16:
        raise GpuFactsError("count must be an integer from 1 to 16, got %r" % (count,))
    parse_nvidia_smi_xml(xml_text)  # validates, with the same messages
    if isinstance(xml_text, bytes):
        xml_text = xml_text.decode("utf-8")
    root = ET.fromstring(xml_text)
    template = root.find("gpu")
    if template is None:
        raise GpuFactsError("the capture has no <gpu> element to replicate")
    old_driver = _value(root, "driver_version")
    for key, value in (("driver_version", driver_version), ("cuda_version", cuda_version)):
        if value is not None:
            _set_child(root, key, str(value), before="attached_gpus")
    for gpu in root.findall("gpu"):
        root.remove(gpu)
    _set_child(root, "attached_gpus", str(count))

    bus_id = _bus_id(_value(template, "pci/pci_bus_id") or template.get("id")
                     or "00000000:01:00.0")
    domain, bus, slot = bus_id.split(":")
    bus = int(bus, 16)
    base_uuid = _value(template, "uuid") or "GPU-00000000-0000-0000-0000-000000000000"
    serial = _value(template, "serial")
    for index in range(count):
        gpu = copy.deepcopy(template)
        this_bus = (bus + 0x10 * index) % 0x100
        this_id = "%s:%02X:%s" % (domain, this_bus, slot)
        gpu.set("id", this_id)
        _set_existing(gpu, "pci/pci_bus_id", this_id)
        _set_existing(gpu, "pci/pci_bus", "%02X" % this_bus)
        _set_existing(gpu, "minor_number", str(index))
        _set_existing(gpu, "uuid", "GPU-%s" % uuidlib.uuid5(
            uuidlib.NAMESPACE_URL, "gpufleet:%s:%d" % (base_uuid, index)))
        if serial and serial.isdigit():
            _set_existing(gpu, "serial", str(int(serial) + index))
        if driver_version is not None and _value(gpu, "gsp_firmware_version") == old_driver:
            _set_existing(gpu, "gsp_firmware_version", str(driver_version))
        if mig_mode is not None:
            state = "Enabled" if mig_mode else "Disabled"
            _set_existing(gpu, "mig_mode/current_mig", state)
            _set_existing(gpu, "mig_mode/pending_mig", state)
            migs = gpu.find("mig_devices")
            if migs is not None and not mig_mode:
                for child in list(migs):
                    migs.remove(child)
                migs.text = "\n\t\t\tNone\n\t\t"
        root.append(gpu)

    prolog = xml_text[:xml_text.find("<nvidia_smi_log")]
    prolog = re.sub(r"<\?xml[^>]*\?>\s*", "", prolog)
    note = ("<!-- derived by gpufleet fleet_capture(count=%d, driver_version=%s, "
            "cuda_version=%s, mig_mode=%s) from a real single-GPU capture; "
            "not itself a capture -->\n" % (count, driver_version, cuda_version,
                                            mig_mode))
    return ('<?xml version="1.0" ?>\n' + prolog.strip() + ("\n" if prolog.strip() else "")
            + note + ET.tostring(root, encoding="unicode") + "\n")


def _set_existing(element, path, text):
    target = element.find(path)
    if target is not None:
        target.text = text


def _set_child(root, tag, text, before=None):
    child = root.find(tag)
    if child is None:
        child = ET.Element(tag)
        position = len(root)
        if before is not None:
            anchor = root.find(before)
            if anchor is not None:
                position = list(root).index(anchor)
        root.insert(position, child)
    child.text = text
