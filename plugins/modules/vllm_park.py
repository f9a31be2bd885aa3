#!/usr/bin/python
"""Ansible module vllm_park: set a running vLLM container aside while its replacement starts."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_park
short_description: Set a vLLM container aside during a replacement, and bring it back if the new one fails
description:
  - C(parked) stops the container O(name) and renames it C(NAME-previous), so a new
    container can take its name, GPUs and port. Its configuration, image and logs stay.
  - C(restored) removes whatever now runs as O(name) (the failed replacement) and
    renames C(NAME-previous) back and starts it.
  - C(dropped) removes C(NAME-previous) once the replacement passed its readiness gate.
  - A running GPU server holds its GPUs' memory, so the replacement cannot start beside
    it; parking gives a way back when the new one fails at load time (CUDA out of
    memory, a kernel missing for the GPU) instead of leaving the host serving nothing.
version_added: "0.1.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  name:
    description: The container's name.
    type: str
    required: true
  state:
    description: C(parked), C(restored) or C(dropped).
    type: str
    choices: [parked, restored, dropped]
    required: true
  stop_timeout:
    description:
      - Seconds vLLM gets to stop before it is killed.
      - From 0 to 86400 (a day).
    type: int
    default: 60
attributes:
  check_mode:
    support: full
    description: Reports what it would do and does nothing.
  diff_mode:
    support: full
    description: Shows the containers before and after.
requirements:
  - docker (Python SDK)
"""

EXAMPLES = r"""
- name: Set the running server aside
  gpufleet.fleet.vllm_park:
    name: vllm-qwen
    state: parked

- name: Bring it back after a failed replacement
  gpufleet.fleet.vllm_park:
    name: vllm-qwen
    state: restored
"""

RETURN = r"""
previous:
  description: Name of the parked container (C(NAME-previous)).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.serve import previous_name, remove_container

try:
    import docker
    from docker import errors as docker_errors
    HAS_DOCKER = True
except ImportError:
    docker = docker_errors = None
    HAS_DOCKER = False


def _get(client, name):
    try:
        return client.containers.get(name)
    except docker_errors.NotFound:
        return None


def _state(client, name):
    """{name: status} of the container and its parked copy, for the diff."""
    return {n: (c.status if c else "absent")
            for n, c in ((n, _get(client, n)) for n in (name, previous_name(name)))}


def run(params, client, check_mode):
    """Apply `state`; return changed."""
    name, state = params["name"], params["state"]
    current, parked = _get(client, name), _get(client, previous_name(name))
    if state == "parked":
        if current is None:
            return False
        if not check_mode:
            if parked is not None:
                remove_container(parked, docker_errors.NotFound)
            current.stop(timeout=params["stop_timeout"])
            current.rename(previous_name(name))
        return True
    if state == "restored":
        if parked is None:
            return False
        if not check_mode:
            if current is not None:
                remove_container(current, docker_errors.NotFound)
            parked.rename(name)
            parked.start()
        return True
    if parked is None:
        return False
    if not check_mode:
        remove_container(parked, docker_errors.NotFound)
    return True


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "state": {"type": "str", "required": True,
                      "choices": ["parked", "restored", "dropped"]},
            "stop_timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            "name": options.text(empty=False),
            "stop_timeout": options.whole(0, options.DAY, "seconds"),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    if not HAS_DOCKER:
        module.fail_json(msg=missing_required_lib("docker") + " (Debian/Ubuntu: python3-docker)")
    try:
        client = docker.from_env()
        before = _state(client, module.params["name"])
        changed = run(module.params, client, module.check_mode)
        after = before if module.check_mode else _state(client, module.params["name"])
    except docker_errors.DockerException as exc:
        verb = {"parked": "park", "restored": "restore", "dropped": "drop"}
        module.fail_json(msg=f"cannot {verb[module.params['state']]} container "
                             f"{module.params['name']}: {exc}")
    module.exit_json(changed=changed, previous=previous_name(module.params["name"]),
                     diff={"before": before, "after": after})


if __name__ == "__main__":
    main()
