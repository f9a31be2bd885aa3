#!/usr/bin/python
"""Ansible module nvidia_repo_info: NVIDIA's repository for a host, proven reachable."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_repo_info
short_description: Resolve NVIDIA's CUDA or container-toolkit repository for a host and check it answers
description:
  - Returns the repository URL (NVIDIA's for the distribution, or the mirror given), its
    signing key URL, and, for apt repositories, the versions it carries of O(packages).
  - Fails, changing nothing, when the repository cannot be read or lacks one of
    O(packages), with a message naming the variable to fix.
  - Logic lives in module_utils/gpufleet/hoststack.py.
options:
  component:
    description: C(cuda) (CUDA repository, drivers and toolkits) or C(container_toolkit) (libnvidia-container).
    type: str
    choices: [cuda, container_toolkit]
    required: true
  packages:
    description: Packages the repository must carry (apt only; dnf repositories are only probed).
    type: list
    elements: str
    default: []
  setting:
    description: The variable the user sets to change the repository, named in error messages.
    type: str
    default: repo_url
extends_documentation_fragment:
  - gpufleet.nvidia_repository
  - gpufleet.read_only
author:
  - gpufleet
"""

EXAMPLES = r"""
- name: Check the CUDA mirror carries the toolkit
  nvidia_repo_info:
    component: cuda
    distribution: "{{ ansible_facts.distribution }}"
    distribution_version: "{{ ansible_facts.distribution_version }}"
    architecture: "{{ ansible_facts.architecture }}"
    repo_url: http://mirror.example.internal/cuda/debian12/x86_64/
    packages: [cuda-toolkit-12-8]
    setting: cuda_toolkit_repo_url
"""

RETURN = r"""
repo:
  description: name, manager (apt or dnf), url, key_url, probe_url.
  type: dict
  returned: always
available:
  description: Versions of each of O(packages) in the repository; null for dnf.
  type: dict
  returned: always
  sample: {"cuda-toolkit-12-8": ["12.8.1-1"]}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.gpufleet.hoststack import (
    REPOSITORY_ARGUMENT_SPEC, HostStackError, container_toolkit_repo, cuda_repo, read_repository)
from ansible.module_utils.urls import open_url


def main():
    module = AnsibleModule(
        argument_spec=dict(
            component=dict(type="str", required=True, choices=["cuda", "container_toolkit"]),
            packages=dict(type="list", elements="str", default=[]),
            setting=dict(type="str", default="repo_url"),
            **REPOSITORY_ARGUMENT_SPEC,
        ),
        supports_check_mode=True,
    )
    p = module.params
    resolve = cuda_repo if p["component"] == "cuda" else container_toolkit_repo

    def fetch(url):
        return to_text(open_url(url, timeout=p["timeout"]).read())

    try:
        repo = resolve(p["distribution"], p["distribution_version"], p["architecture"], p["repo_url"])
        index = read_repository(repo, fetch, p["setting"])
    except HostStackError as exc:
        module.fail_json(msg=str(exc))
    available = None
    if index is not None:
        available = {name: index.get(name, []) for name in p["packages"]}
        missing = [name for name, versions in available.items() if not versions]
        if missing:
            module.fail_json(
                msg=f"the repository {repo['url']} has no package {', '.join(missing)}. Nothing "
                    f"was changed. Choose a version it carries, or set {p['setting']} to a "
                    "mirror that has it", repo=repo, available=available)
    module.exit_json(changed=False, repo=repo, available=available)


if __name__ == "__main__":
    main()
