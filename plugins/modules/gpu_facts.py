#!/usr/bin/python
"""Ansible module gpu_facts: NVIDIA GPU facts from NVML, nvidia-smi or the PCI bus."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts into ansible_facts.gpu
description:
  - Finds the host's NVIDIA GPUs and driver and returns them as C(ansible_facts.gpu)
    (the vocabulary of docs/conventions.md).
  - Tries its sources in order, by default NVML (the C(pynvml) module of
    nvidia-ml-py, when the library loads), then C(nvidia-smi -q -x), then the PCI bus
    in sysfs. The first source that finds a GPU wins. The PCI source works before any
    driver is installed, so a driver role can choose open or proprietary kernel modules.
  - With O(nvidia_smi_xml) it parses a captured C(nvidia-smi -q -x) file instead of
    probing the host (planning from recorded facts).
  - The compute capability comes from NVML, or, for nvidia-smi XML (which does not carry
    it) and the PCI bus, from product-name and PCI device-id tables.
  - Changes nothing on the host; C(changed) is always false.
options:
  nvidia_smi_xml:
    description:
      - Path of a file holding the output of C(nvidia-smi -q -x). When set, the module
        parses it and probes nothing.
    type: path
  nvidia_smi_path:
    description:
      - The nvidia-smi executable. Default is C(nvidia-smi) found on the PATH (and in
        C(/usr/bin), C(/usr/local/nvidia/bin)).
    type: path
  sysfs_root:
    description: Root of the sysfs tree the PCI source scans (C(<root>/bus/pci/devices)).
    type: path
    default: /sys
  sources:
    description: The sources to try, in order.
    type: list
    elements: str
    choices: [nvml, nvidia-smi, pci]
    default: [nvml, nvidia-smi, pci]
notes:
  - C(nvlink) is true or false from NVML's per-link state; nvidia-smi XML only tells it
    when a GPU reports an NVLink fabric (NVSwitch systems), otherwise it is null.
  - Index is nvidia-smi's GPU index (PCI bus order), not the C(/dev/nvidiaN) minor number.
  - Tables and parsers live in plugins/module_utils/gpufleet/gpu.py with their sources.
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
attributes:
  facts:
    support: full
    description: Returns C(ansible_facts.gpu).
requirements:
  - nvidia-ml-py (optional; without it the module uses nvidia-smi or the PCI bus)
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpufleet.fleet.gpu_facts:

- name: Plan from a recorded capture instead of probing
  gpufleet.fleet.gpu_facts:
    nvidia_smi_xml: /var/lib/gpufleet/captures/node17-nvidia-smi.xml

- name: Before the driver is installed, look only at the PCI bus
  gpufleet.fleet.gpu_facts:
    sources: [pci]

- name: Choose the kernel module flavour
  ansible.builtin.debug:
    msg: >-
      {{ 'open' if ansible_facts.gpu.devices
         | map(attribute='compute_capability') | map('float') | min >= 7.5
         else 'proprietary' }}
"""

RETURN = r"""
ansible_facts:
  description: The facts, under the key C(gpu).
  returned: always
  type: dict
  contains:
    gpu:
      description: GPU facts.
      type: dict
      contains:
        present:
          description: At least one NVIDIA GPU was found.
          type: bool
        source:
          description: Where the facts came from, C(nvml), C(nvidia-smi), C(pci) or C(none).
          type: str
        driver_version:
          description: Driver version, null when no driver is loaded.
          type: str
        cuda_driver_version:
          description: Newest CUDA version the driver supports.
          type: str
        count:
          description: Number of GPUs.
          type: int
        nvlink:
          description: Whether NVLink is up; null when the source cannot tell.
          type: bool
        devices:
          description:
            - One dict per GPU with index, name, uuid, pci_bus_id (C(00000000:84:00.0)),
              pci_device_id (C(0x2684)), memory_total_mib, memory_reserved_mib (what the
              driver keeps for itself, outside CUDA's total, nvidia-smi's FB Memory
              Reserved, NVML's memory info v2; null before driver R510 and from the PCI
              bus), compute_capability (C(8.9)),
              architecture (C(ada)), persistence_mode and mig_mode (bool; null when the
              source cannot tell, e.g. the PCI bus), brand (nvidia-smi's Product Brand,
              C(GeForce), C(NVIDIA), C(Tesla)...; the container toolkit's C(brand=)
              conditions compare it) and datacenter (true for Tesla/NVIDIA-brand parts,
              which CUDA forward compatibility needs; null when the brand is unknown).
          type: list
          elements: dict
  sample:
    gpu:
      present: true
      source: nvidia-smi
      driver_version: 535.86.05
      cuda_driver_version: "12.2"
      count: 1
      nvlink: null
      devices:
        - index: 0
          name: NVIDIA GeForce RTX 4090
          uuid: GPU-71d1acc2-662d-2166-bf9f-65272d2fc437
          pci_bus_id: "00000000:84:00.0"
          pci_device_id: "0x2684"
          memory_total_mib: 24564
          memory_reserved_mib: 346
          compute_capability: "8.9"
          architecture: ada
          persistence_mode: true
          mig_mode: false
          brand: GeForce
          datacenter: false
probes:
  description: What each source did (ok with its GPU count, unavailable, or failed with why).
  returned: always
  type: list
  elements: dict
  sample:
    - source: nvml
      result: failed
      detail: "NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    - {source: nvidia-smi, result: unavailable}
    - {source: pci, result: ok, count: 8}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.gpu import (
    SOURCES, GpuFactsError, gather, nvidia_smi_runner, parse_nvidia_smi_xml)


def _read_capture(module, path):
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        module.fail_json(
            msg="cannot read nvidia_smi_xml %s: %s. Give the path of a file holding the "
                "output of `nvidia-smi -q -x`." % (path, exc.strerror or exc))
    try:
        return parse_nvidia_smi_xml(data)
    except GpuFactsError as exc:
        module.fail_json(msg="nvidia_smi_xml %s: %s" % (path, exc))


def _nvidia_smi_runner(module):
    path = module.params["nvidia_smi_path"]
    if path is not None and not (os.path.isfile(path) and os.access(path, os.X_OK)):
        module.fail_json(msg="nvidia_smi_path %s is not an executable file: give the "
                             "path of nvidia-smi, or leave it unset to search the PATH"
                             % path)
    return nvidia_smi_runner(module, path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi_xml=dict(type="path"),
            nvidia_smi_path=dict(type="path"),
            sysfs_root=dict(type="path", default="/sys"),
            sources=dict(type="list", elements="str", choices=list(SOURCES),
                         default=list(SOURCES)),
        ),
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec)
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    if module.params["nvidia_smi_xml"]:
        facts = _read_capture(module, module.params["nvidia_smi_xml"])
        probes = [{"source": "nvidia-smi", "result": "ok", "count": facts["count"],
                   "detail": "parsed %s" % module.params["nvidia_smi_xml"]}]
    else:
        if not module.params["sources"]:
            module.fail_json(msg="sources is empty: name at least one of %s"
                                 % ", ".join(SOURCES))
        try:
            facts, probes = gather(
                sources=module.params["sources"],
                run_nvidia_smi=_nvidia_smi_runner(module),
                sysfs_root=module.params["sysfs_root"],
            )
        except GpuFactsError as exc:
            module.fail_json(msg=str(exc))
    module.exit_json(changed=False, ansible_facts={"gpu": facts}, probes=probes)


if __name__ == "__main__":
    main()
