#!/usr/bin/python
"""Ansible module nvidia_driver_plan: decide the NVIDIA driver packages for a host."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_plan
short_description: Plan the NVIDIA driver install for a host (repository, flavour, packages, version)
description:
  - Decides, without changing anything, what the C(nvidia_driver) role installs - the
    CUDA repository (NVIDIA's or a mirror) for the distribution, open or proprietary
    kernel modules from the GPUs' compute capabilities, the branch's packages with an
    exact version, the packages of other branches to remove and the packages to hold.
  - Reads the repository's C(Packages) index (apt) or C(repomd.xml) (dnf) first, so an
    unreachable mirror, an unknown branch, a branch that dropped the GPU or a version the
    repository lacks fail here, before any change.
  - Unless O(trusted), downloads the repository's signing key and accepts it only with
    the pinned fingerprint (O(key_fingerprint), default NVIDIA's), before any change.
  - Never plans a newer version than the installed one unless O(version) or O(upgrade)
    asks for it.
  - Logic lives in plugins/module_utils/gpufleet/hoststack.py.
options:
  branch:
    description: Driver branch, for example C(580).
    type: str
    required: true
  version:
    description:
      - Exact driver version of the branch (C(580.65.06)). Empty keeps the installed
        version of the branch, or takes the newest the repository has when none is.
    type: str
    default: ""
  upgrade:
    description: Move to the newest version of the branch the repository has.
    type: bool
    default: false
  kernel_module:
    description: C(auto) chooses open modules for Turing and newer, proprietary for older GPUs.
    type: str
    choices: [auto, open, proprietary]
    default: auto
  devices:
    description: C(ansible_facts.gpu.devices) (each with C(compute_capability)).
    type: list
    elements: dict
    default: []
  fabricmanager:
    description:
      - Install fabric manager of the same version. C(auto) does so when the PCI bus
        shows NVSwitch chips (NVIDIA bridges, class 0x0680).
    type: str
    choices: [auto, enabled, disabled]
    default: auto
  sysfs_root:
    description: Root of the sysfs tree scanned for NVSwitch chips.
    type: path
    default: /sys
  installed:
    description: C(ansible_facts.packages) from M(ansible.builtin.package_facts).
    type: dict
    default: {}
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.nvidia_repository
  - gpufleet.fleet.gpufleet.read_only
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Plan the driver from the PCI facts
  gpufleet.fleet.nvidia_driver_plan:
    branch: "580"
    devices: "{{ ansible_facts.gpu.devices }}"
    distribution: "{{ ansible_facts.distribution }}"
    distribution_version: "{{ ansible_facts.distribution_version }}"
    architecture: "{{ ansible_facts.architecture }}"
    installed: "{{ ansible_facts.packages }}"
    repo_url: http://mirror.example.internal/cuda/ubuntu2404/x86_64/
  register: plan
"""

RETURN = r"""
repo:
  description: >-
    The repository (name, manager apt/dnf, url, key_url, key_fingerprint, key, probe_url); key is
    the verified ASCII-armored signing key, null when trusted.
  type: dict
  returned: always
  sample: {"name": "debian12", "manager": "apt", "url": "http://127.0.0.1:8081/cuda/debian12/x86_64/"}
plan:
  description: What to do.
  type: dict
  returned: always
  contains:
    flavor: {description: open or proprietary kernel modules., type: str, sample: open}
    meta: {description: The branch's meta package., type: str, sample: nvidia-open-580}
    install: {description: Package specs to install (apt with =version)., type: list, elements: str,
              sample: ["nvidia-open-580=580.95.05-1"]}
    remove: {description: Installed driver metas of another branch or flavour., type: list, elements: str}
    hold: {description: Packages to hold (apt-mark hold / dnf versionlock)., type: list, elements: str}
    version: {description: Package version to install; null when the package manager decides (dnf)., type: str}
    driver_version: {description: The driver version that will be installed., type: str, sample: 580.95.05}
    installed_version: {description: "The meta's installed version, null when absent.", type: str}
    stream: {description: DNF module stream (dnf only)., type: str, sample: 580-open}
    changes: {description: Whether the driver packages will change., type: bool}
    fabricmanager: {description: Whether fabric manager is part of the plan., type: bool}
    nvswitches: {description: NVSwitch chips found on the PCI bus., type: int}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.hoststack import (
    REPOSITORY_ARGUMENT_SPEC, HostStackError, gpg_show_keys, kernel_module_flavor,
    nvswitch_count, plan_driver, repository, repository_fetch, wants_fabricmanager)
from ansible.module_utils.urls import open_url


def read_pci(sysfs_root):
    """(vendor, class) of every PCI device in sysfs; empty when there is no PCI bus."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    found = []
    for entry in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        try:
            with open(os.path.join(base, entry, "vendor"), encoding="ascii") as fh:
                vendor = int(fh.read().strip(), 16)
            with open(os.path.join(base, entry, "class"), encoding="ascii") as fh:
                cls = int(fh.read().strip(), 16)
        except (OSError, ValueError):
            continue
        found.append((vendor, cls))
    return found


def main():
    module = AnsibleModule(
        argument_spec=dict(
            branch=dict(type="str", required=True),
            version=dict(type="str", default=""),
            upgrade=dict(type="bool", default=False),
            kernel_module=dict(type="str", default="auto", choices=["auto", "open", "proprietary"]),
            devices=dict(type="list", elements="dict", default=[]),
            fabricmanager=dict(type="str", default="auto", choices=["auto", "enabled", "disabled"]),
            sysfs_root=dict(type="path", default="/sys"),
            installed=dict(type="dict", default={}),
            **REPOSITORY_ARGUMENT_SPEC,
        ),
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            "timeout": options.whole(1, options.HOUR, "seconds"),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    p = module.params

    fetch = repository_fetch(open_url, p["timeout"])

    def show_keys(data):
        return gpg_show_keys(lambda argv, stdin: module.run_command(argv, data=stdin, binary_data=True),
                             module.get_bin_path("gpg"), data)

    try:
        flavor = kernel_module_flavor(p["branch"], p["devices"], p["kernel_module"])
        repo, available = repository("cuda", p, "nvidia_driver_repo_url", fetch, show_keys)
        nvswitches = nvswitch_count(read_pci(p["sysfs_root"]))
        fabricmanager = wants_fabricmanager(p["fabricmanager"], nvswitches)
        plan = plan_driver(repo["manager"], p["branch"], p["version"], p["upgrade"], flavor,
                           fabricmanager, p["installed"], available, p["distribution"])
        plan.update(fabricmanager=fabricmanager, nvswitches=nvswitches)
    except HostStackError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, repo=repo, plan=plan)


if __name__ == "__main__":
    main()
