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
  - With O(routes) (the operator's allowlist), also plans what each frontend forwards,
    the paths its model's instances list in their own OpenAPI document (C(/openapi.json)
    of one serving instance, read from the host the module runs on, at most 8 MiB within
    10 s, without a key first, then with each of O(api_keys) on 401) that O(routes) also
    names. A path template (C(/v1/responses/{response_id})) is never forwarded. Each
    frontend says which served routes stay closed because O(routes) does not name them
    and which routes of O(routes) its image does not serve.
  - When no instance of a model gives a usable document (none serving yet, a first
    install, or a document that is not an OpenAPI document, over the cap or the deadline),
    or O(read_routes) is false, that frontend forwards the whole O(routes) and its
    C(routes_note) says so and why.
  - It only reads and computes, so C(changed) is always false.
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
  routes:
    description:
      - The allowlist (vllm_gateway_routes, exact paths); omitted, no route is planned.
    type: list
    elements: str
  keyless_paths:
    description: Paths answered without a key (liveness); not reported as closed routes.
    type: list
    elements: str
    default: []
  read_routes:
    description: Read each model's routes from an instance's C(/openapi.json); false forwards O(routes) as given.
    type: bool
    default: true
  api_keys:
    description:
      - "Keys to send (as C(Authorization: Bearer <key>)) when C(/openapi.json) answers 401."
      - Secret; the argument spec marks it C(no_log).
    type: list
    elements: str
    default: []
  ca_file:
    description:
      - CA certificate (PEM) on the host the module runs on that the C(https) instances'
        certificates (label C(scheme) of the instances file) are verified with; empty, the
        system's trust store.
    type: str
    default: ""
  require_tls:
    description:
      - Refuse a frontend's instance that serves plain C(http) (vllm_gateway_backend_tls).
    type: bool
    default: false
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
      routes: [/v1/chat/completions, /v1/completions, /v1/models]
      routes_source: openapi
      routes_from: lab-h200_18000
      routes_closed: [/invocations, /metrics, "/v1/responses/{response_id}"]
      routes_unserved: [/v1/embeddings]
      routes_note: "HuggingFaceTB/SmolLM2-135M-Instruct: forwards 3 routes its image serves ..."
routes_notes:
  description: One line per frontend on what it forwards (O(routes) given).
  returned: success
  type: list
  elements: str
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
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.gateway import (
    GatewayError, load_instances, plan_gateway, plan_routes, read_openapi)


def main():
    module = AnsibleModule(
        argument_spec={
            "instances": {"type": "raw", "required": True},
            "frontends": {"type": "list", "elements": "dict", "required": True},
            "metrics_port": {"type": "int", "required": True},
            "routes": {"type": "list", "elements": "str"},
            "keyless_paths": {"type": "list", "elements": "str", "default": [], "no_log": False},
            "read_routes": {"type": "bool", "default": True},
            "api_keys": {"type": "list", "elements": "str", "default": [], "no_log": True},
            "ca_file": {"type": "str", "default": ""},
            "require_tls": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec)
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    try:
        instances = load_instances(module.params["instances"])
        plan = plan_gateway(instances, module.params["frontends"], module.params["metrics_port"],
                            module.params["require_tls"])
        params = module.params
        if params["routes"] is not None:
            def read(server):
                return read_openapi(server, params["api_keys"], params["ca_file"])
            plan["frontends"] = plan_routes(plan["frontends"], params["routes"],
                                            params["keyless_paths"],
                                            read if params["read_routes"] else None)
            plan["routes_notes"] = [f["routes_note"] for f in plan["frontends"]]
    except GatewayError as exc:
        module.fail_json(msg=f"{exc}. Nothing was changed.", changed=False)
    module.exit_json(changed=False, instances=len(instances), **plan)


if __name__ == "__main__":
    main()
