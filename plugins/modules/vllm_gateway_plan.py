#!/usr/bin/python
"""Ansible module vllm_gateway_plan: the HAProxy frontends and backends of the gateway."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_gateway_plan
short_description: Plan the gateway's frontends and backend servers from the fleet's instances
description:
  - Reads the fleet's serving instances from the Prometheus file_sd list the C(vllm_server)
    role writes (one entry per instance, C(targets[0]) its address and port, labels
    C(host), C(served_model_name), C(port)...) and groups them by C(served_model_name)
    into one backend per entry of O(frontends), with server names C(<host>_<port>).
  - Refuses, before anything changes, a frontend for a model no instance serves, two
    frontends for one model, a port used twice (frontends and O(metrics_port)), and a
    malformed instance entry; each message says what to change.
  - It only computes, so C(changed) is always false.
version_added: "0.1.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  instances:
    description:
      - The file_sd list, as its JSON text (C(lookup('file', ...))) or already parsed.
    type: raw
    required: true
  frontends:
    description: One C({served_model_name, port}) per model the gateway serves.
    type: list
    elements: dict
    required: true
  metrics_port:
    description: Port of the stats/Prometheus frontend; no model frontend may use it.
    type: int
    required: true
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
"""

EXAMPLES = r"""
- name: Plan the gateway
  gpufleet.fleet.vllm_gateway_plan:
    instances: "{{ lookup('file', '/srv/gpufleet/vllm-file-sd.json') }}"
    frontends:
      - {served_model_name: HuggingFaceTB/SmolLM2-135M-Instruct, port: 9000}
    metrics_port: 8405
  register: plan
"""

RETURN = r"""
frontends:
  description: Per frontend its HAProxy name (also the backend's), model, port and servers.
  returned: success
  type: list
  elements: dict
  sample:
    - name: vllm_HuggingFaceTB_SmolLM2-135M-Instruct
      served_model_name: HuggingFaceTB/SmolLM2-135M-Instruct
      port: 9000
      servers: [{name: lab-h200_18000, address: 127.0.0.1, port: 18000, host: lab-h200, endpoint: "127.0.0.1:18000"}]
unserved:
  description: Served model names of instances that no frontend takes.
  returned: success
  type: list
  elements: str
instances:
  description: Number of instances in the list.
  returned: success
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.gateway import GatewayError, load_instances, plan_gateway


def main():
    module = AnsibleModule(
        argument_spec={
            "instances": {"type": "raw", "required": True},
            "frontends": {"type": "list", "elements": "dict", "required": True},
            "metrics_port": {"type": "int", "required": True},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec)
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    try:
        instances = load_instances(module.params["instances"])
        plan = plan_gateway(instances, module.params["frontends"], module.params["metrics_port"])
    except GatewayError as exc:
        module.fail_json(msg=f"{exc}. Nothing was changed.", changed=False)
    module.exit_json(changed=False, instances=len(instances), **plan)


if __name__ == "__main__":
    main()
