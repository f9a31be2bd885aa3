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
  - Unless O(trusted), downloads the repository's signing key and accepts it only when
    it holds exactly one primary key with the pinned fingerprint (O(key_fingerprint),
    default NVIDIA's published one), checked with C(gpg --show-keys --with-colons).
  - Fails, changing nothing, when a URL is not a clean URL, the repository cannot be
    read, lacks one of O(packages) or its key has another fingerprint, with a message
    naming the variable to fix.
  - Logic lives in plugins/module_utils/gpufleet/hoststack.py.
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
  - gpufleet.fleet.gpufleet.nvidia_repository
  - gpufleet.fleet.gpufleet.read_only
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check the CUDA mirror carries the toolkit
  gpufleet.fleet.nvidia_repo_info:
    component: cuda
    distribution: "{{ ansible_facts.distribution }}"
    distribution_version: "{{ ansible_facts.distribution_version }}"
    architecture: "{{ ansible_facts.architecture }}"
    repo_url: http://mirror.example.internal/cuda/debian12/x86_64/
    packages: [cuda-toolkit-12-8]
    setting: cuda_toolkit_repo_url

- name: Check a mirror signed with the site's own key
  gpufleet.fleet.nvidia_repo_info:
    component: container_toolkit
    distribution: "{{ ansible_facts.distribution }}"
    distribution_version: "{{ ansible_facts.distribution_version }}"
    architecture: "{{ ansible_facts.architecture }}"
    repo_url: http://mirror.example.internal/libnvidia-container/stable/deb/amd64/
    key_url: http://mirror.example.internal/keys/site-mirror.asc
    key_fingerprint: 0123456789ABCDEF0123456789ABCDEF01234567
    setting: container_toolkit_repo_url
"""

RETURN = r"""
repo:
  description: name, manager (apt or dnf), url, key_url, key_fingerprint, probe_url, and key (the verified ASCII-armored signing key; null when trusted).
  type: dict
  returned: always
available:
  description: Versions of each of O(packages) in the repository; null for dnf.
  type: dict
  returned: always
  sample: {"cuda-toolkit-12-8": ["12.8.1-1"]}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.hoststack import (
    REPOSITORY_ARGUMENT_SPEC, HostStackError, gpg_show_keys, repository, repository_fetch)
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
        repo, index = repository(p["component"], p, p["setting"], fetch, show_keys)
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
