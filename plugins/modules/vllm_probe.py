#!/usr/bin/python
"""Ansible module vllm_probe: wait until a vLLM instance is idle, and probe its latency."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_probe
short_description: Wait until a vLLM instance is idle, then measure a short probe
description:
  - With O(wait_idle), polls the instance's C(/metrics) until vLLM's
    C(vllm:num_requests_running) and C(vllm:num_requests_waiting) are both 0 (a drained
    server finished what it had), for at most O(idle_timeout) seconds.
  - With O(requests) above 0, sends that many identical real requests one after another
    (a fixed completion, or an embedding for the pooling runner) and returns their
    latency and errors.
  - With O(baseline) (the figures of an earlier probe) it compares the two
    (thresholds O(max_latency_ratio), O(max_latency_increase_ms), O(max_error_rate)) and
    fails when the new figures are worse; playbooks/upgrade.yml uses it as its probe gate.
  - Logic in C(plugins/module_utils/gpufleet/upgrade.py). It only reads, so C(changed) is false.
version_added: "0.2.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  url:
    description: Base URL of the instance (C(http://127.0.0.1:8000)).
    type: str
    required: true
  api_key:
    description: The API key of C(/v1); never logged.
    type: str
    default: ""
  served_model_name:
    description: The model name the instance serves.
    type: str
    default: ""
  runner:
    description: C(generate) (completions) or C(pooling) (embeddings).
    type: str
    choices: [generate, pooling]
    default: generate
  wait_idle:
    description: First wait until no request is running or waiting.
    type: bool
    default: false
  idle_timeout:
    description:
      - Seconds to wait for idle. One C(/metrics) poll takes at most 10 s in all and
        16 MiB, so an instance that drips its answer holds the wait at most 10 s longer.
      - From 1 to 86400 (a day).
    type: int
    default: 120
  requests:
    description:
      - Requests of the probe (0 = no probe).
      - From 0 to 10000.
    type: int
    default: 0
  max_tokens:
    description:
      - Tokens each probe completion generates.
      - From 1 to 10000000.
    type: int
    default: 16
  request_timeout:
    description:
      - Seconds one probe request may take in all, its whole answer read (up to 16 MiB);
        a slower one counts as an error.
      - From 1 to 86400 (a day).
    type: int
    default: 120
  baseline:
    description: Figures of an earlier probe (this module's C(probe)) to compare with.
    type: dict
  max_latency_ratio:
    description:
      - The p95 latency may grow by this factor at most (together with O(max_latency_increase_ms)).
      - From 1 to 1000000.
    type: float
    default: 2.0
  max_latency_increase_ms:
    description:
      - The p95 latency may grow by this many milliseconds at most (together with O(max_latency_ratio)).
      - From 0 to 86400000 (a day).
    type: float
    default: 500
  max_error_rate:
    description:
      - Share of probe requests that may fail.
      - From 0 to 1.
    type: float
    default: 0.0
  attempts:
    description:
      - Probes at most, with O(baseline), when a probe is only too slow (see above).
      - 1 fails the gate on the first slow probe.
      - From 1 to 100.
    type: int
    default: 2
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
  - gpufleet.fleet.gpufleet.tls_client
requirements:
  - requests
  - prometheus-client, for O(wait_idle) (Debian/Ubuntu python3-prometheus-client; the
    vllm_server role installs it on the host)
"""

EXAMPLES = r"""
- name: Wait until the drained instance is idle, then probe it
  gpufleet.fleet.vllm_probe:
    url: http://127.0.0.1:8000
    api_key: "{{ vllm_server_api_key | gpufleet_probe_key(vllm_server_api_keys_retiring | default([])) }}"
    served_model_name: HuggingFaceTB/SmolLM2-135M-Instruct
    wait_idle: true
    requests: 5
  register: before

- name: Probe again after the change and compare
  gpufleet.fleet.vllm_probe:
    url: http://127.0.0.1:8000
    api_key: "{{ vllm_server_api_key | gpufleet_probe_key(vllm_server_api_keys_retiring | default([])) }}"
    served_model_name: HuggingFaceTB/SmolLM2-135M-Instruct
    requests: 5
    baseline: "{{ before.probe }}"
"""

RETURN = r"""
idle:
  description: C(elapsed) seconds and C(polls) until idle (with O(wait_idle)).
  returned: when wait_idle
  type: dict
probe:
  description:
    - C(count), C(errors), C(error_rate), C(p50_ms), C(p95_ms), C(max_ms), C(error_samples).
    - With O(baseline), the figures of the last probe (the one that decided).
  returned: when requests > 0
  type: dict
attempts:
  description: Every probe's figures and verdict, in order (with O(baseline)).
  returned: when baseline is given
  type: list
  elements: dict
verdict:
  description: C(ok) and C(reasons) of the comparison with O(baseline) (the last probe's).
  returned: when baseline is given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options, prometheus_text, tls
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.upgrade import (
    UpgradeError, probe_gate, run_probe, wait_idle)

try:
    import requests
    HAS_REQUESTS = True
except ImportError:
    requests = None
    HAS_REQUESTS = False


def run(params, session):
    """(failed, result); `session` is a requests.Session or a test double."""
    url = params["url"].rstrip("/")
    result = {"changed": False}
    if params["wait_idle"]:
        try:
            result["idle"] = wait_idle(session, url, timeout=params["idle_timeout"])
        except UpgradeError as exc:
            return True, dict(result, msg=str(exc))
    if params["requests"] > 0:
        if not params["served_model_name"]:
            return True, dict(result, msg="served_model_name is needed for a probe")

        def probe():
            return run_probe(session, url, params["api_key"], params["served_model_name"],
                             params["runner"], params["requests"], params["max_tokens"],
                             params["request_timeout"])

        if params["baseline"] is None:
            result["probe"] = probe()
            return False, result
        gate = probe_gate(probe, params["baseline"], params["attempts"],
                          params["max_latency_ratio"], params["max_latency_increase_ms"],
                          params["max_error_rate"])
        result.update(probe=gate["attempts"][-1]["probe"], verdict=gate["verdict"],
                      attempts=gate["attempts"])
        if not gate["verdict"]["ok"]:
            return True, dict(result, msg=f"probe gate failed for {url}: {gate['summary']}")
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
            "served_model_name": {"type": "str", "default": ""},
            "runner": {"type": "str", "choices": ["generate", "pooling"],
                       "default": "generate"},
            "wait_idle": {"type": "bool", "default": False},
            "idle_timeout": {"type": "int", "default": 120},
            "requests": {"type": "int", "default": 0},
            "max_tokens": {"type": "int", "default": 16, "no_log": False},  # a count, not a secret
            "request_timeout": {"type": "int", "default": 120},
            "baseline": {"type": "dict"},
            "max_latency_ratio": {"type": "float", "default": 2.0},
            "max_latency_increase_ms": {"type": "float", "default": 500},
            "max_error_rate": {"type": "float", "default": 0.0},
            "attempts": {"type": "int", "default": 2},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            "url": options.text(empty=False),
            "idle_timeout": options.whole(1, options.DAY, "seconds"),
            "requests": options.whole(0, 10000),
            "max_tokens": options.whole(1, 10 ** 7),
            "request_timeout": options.whole(1, options.DAY, "seconds"),
            "max_latency_ratio": options.number(1, 10 ** 6),
            "max_latency_increase_ms": options.number(0, 1000 * options.DAY,
                                                      unit="milliseconds"),
            "max_error_rate": options.number(0, 1),
            "attempts": options.whole(1, 100),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    if not HAS_REQUESTS:
        module.fail_json(msg=missing_required_lib("requests"))
    p = module.params
    # The idle wait reads /metrics with prometheus-client; checked before the first poll.
    missing = prometheus_text.import_error() if p["wait_idle"] else None
    if missing:
        module.fail_json(msg=f"{missing_required_lib(prometheus_text.LIBRARY)} "
                             f"{prometheus_text.LIBRARY_HINT}", exception=missing)
    failed, result = run(p, _session(module))
    if failed:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
