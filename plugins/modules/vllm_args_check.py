#!/usr/bin/python
"""Ansible module vllm_args_check: does this vLLM image accept these `vllm serve` arguments?"""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_args_check
short_description: Check that a vLLM image accepts the arguments, before replacing a running server
description:
  - Starts a throwaway container of O(image) (its own C(vllm serve) entrypoint) with
    O(command) in which the model is replaced by a path that cannot exist, with no
    network and no GPU. vLLM parses every flag, then stops at the missing model, so
    the check takes only vLLM's import time and needs neither the GPUs nor the model.
  - An unknown flag (argparse C(unrecognized arguments), exit status 2), a refused value
    (C(error - argument ...)) or a flag combination vLLM refuses before loading fails the
    module with vLLM's own message and what to do; nothing else is touched, so a server
    already running keeps serving.
  - The container is removed whatever happens. C(changed) is always false.
version_added: "0.1.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  image:
    description: The vLLM image (present locally) whose C(vllm serve) must accept the arguments.
    type: str
    required: true
  command:
    description:
      - The container command as it will run, C([MODEL, ARG, ...]); the first item (the
        model) is replaced.
      - Each item at most 1 MiB (1048576 characters).
    type: list
    elements: str
    required: true
  env:
    description: Environment of the real container (never the API key).
    type: dict
    default: {}
  name:
    description: Name of the throwaway container.
    type: str
    required: true
  timeout:
    description:
      - Seconds to wait for vLLM to parse its arguments and stop.
      - From 1 to 86400 (a day).
    type: int
    default: 300
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
requirements:
  - docker (Python SDK)
"""

EXAMPLES = r"""
- name: Check the arguments with the exact image before replacing the server
  gpufleet.fleet.vllm_args_check:
    image: vllm/vllm-openai:v0.32.0
    command: [/models/qwen, --max-model-len, "32768", --enforce-eager]
    name: vllm-qwen-args-check
"""

RETURN = r"""
accepted:
  description: True when vLLM accepted every argument.
  returned: always
  type: bool
exit_code:
  description: Exit status of the throwaway C(vllm serve) (null when it was stopped at the timeout).
  returned: always
  type: int
seconds:
  description: How long the check took.
  returned: always
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.serve import (
    LABEL_PREFIX, args_check_command, args_check_verdict, remove_container, remove_leftover)

try:
    import docker
    from docker import errors as docker_errors
    HAS_DOCKER = True
except ImportError:
    docker = docker_errors = None
    HAS_DOCKER = False


def run(params, client):
    """Run the throwaway container; return (accepted, exit_code, logs, seconds)."""
    start = time.monotonic()
    remove_leftover(client, params["name"], docker_errors.NotFound)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **params["env"]}
    container = client.containers.run(
        params["image"], command=args_check_command(params["command"]), name=params["name"],
        environment={str(k): str(v) for k, v in env.items()}, network_mode="none",
        detach=True, labels={LABEL_PREFIX + "role": "vllm-args-check"})
    try:
        try:
            exit_code = container.wait(timeout=params["timeout"]).get("StatusCode")
        except Exception:  # requests' ReadTimeout: vLLM still running at the timeout
            exit_code = None
        logs = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        remove_container(container, docker_errors.NotFound)
    accepted, message = args_check_verdict(exit_code, logs)
    return accepted, exit_code, message, round(time.monotonic() - start, 1)


def main():
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str", "required": True},
            "command": {"type": "list", "elements": "str", "required": True},
            "env": {"type": "dict", "default": {}},
            "name": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 300},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            "image": options.text(empty=False),
            "name": options.text(empty=False),
            # a vLLM argument may be an inline chat template or JSON: up to a MiB each
            "command": options.items(options.text(2 ** 20)),
            "timeout": options.whole(1, options.DAY, "seconds"),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    if not HAS_DOCKER:
        module.fail_json(msg=missing_required_lib("docker") + " (Debian/Ubuntu: python3-docker)")
    if not module.params["command"]:
        module.fail_json(msg="command must start with the model path")
    try:
        accepted, exit_code, message, seconds = run(module.params, docker.from_env())
    except docker_errors.DockerException as exc:
        module.fail_json(msg=f"cannot run {module.params['image']} to check the arguments: {exc}",
                         accepted=False)
    result = {"accepted": accepted, "exit_code": exit_code, "seconds": seconds}
    if not accepted:
        module.fail_json(msg=f"{module.params['image']}: {message}", changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
