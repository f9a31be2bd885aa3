#!/usr/bin/python
"""Ansible module vllm_instances: the fleet's one list of serving vLLM instances."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_instances
short_description: Keep the fleet's list of serving vLLM instances (a Prometheus file_sd file)
description:
  - The one list of serving instances that Prometheus scrapes (file_sd), the gateway
    (vllm_gateway) builds its backends from, and the summary and playbooks/upgrade.yml
    read. One entry per instance, C(targets) (the address others reach it at) and
    C(labels) C(host), C(container), C(model), C(served_model_name), C(runner), C(port).
  - Merges the plans of the hosts of this run into the file at O(path) (on the node it
    runs on, the control node), so a C(--limit) run keeps the other hosts' entries. A
    host without a plan (it failed before planning) keeps its entries; a host planned
    with no instance loses them.
  - Writes atomically (mode 0644) and only when the list changed.
version_added: "0.2.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  path:
    description: The file (JSON list).
    type: path
    required: true
  plans:
    description:
      - The C(vllm_serve_plan) results of the hosts of this run that planned (each with
        C(host) and C(instances), each instance with C(file_sd)).
    type: list
    elements: dict
    required: true
attributes:
  check_mode:
    support: full
    description: Reports whether the list would change and writes nothing.
  diff_mode:
    support: full
    description: Shows the list before and after.
"""

EXAMPLES = r"""
- name: Write the fleet's serving instances
  gpufleet.fleet.vllm_instances:
    path: /srv/gpufleet/vllm-instances.json
    plans: "{{ ansible_play_hosts_all | map('extract', hostvars) | selectattr('vllm_server_plan', 'defined')
               | map(attribute='vllm_server_plan') | list }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
instances:
  description: The whole list after the merge.
  returned: always
  type: list
  elements: dict
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.jsonfile import read_json, write_json
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.serve import merge_registry


def run(params, check_mode):
    # the gateway and Prometheus are built from it: trusted only when it is this user's and
    # no one else may write it (issue #32 item 6)
    before = read_json(params["path"], [], "fix or remove it (site.yml writes it again)",
                       owner=os.geteuid())
    updates = {}
    for plan in params["plans"]:
        if not plan.get("host") or "instances" not in plan:
            raise ValueError("every plan needs `host` and `instances` (vllm_serve_plan's result)")
        updates[plan["host"]] = [inst["file_sd"] for inst in plan["instances"]]
    after = merge_registry(before, updates)
    changed = after != before
    if changed and not check_mode:
        write_json(params["path"], after)
    return {"changed": changed, "instances": after,
            "diff": {"before": json.dumps(before, indent=2) + "\n",
                     "after": json.dumps(after, indent=2) + "\n"}}


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "plans": {"type": "list", "elements": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec)
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    try:
        result = run(module.params, module.check_mode)
    except (ValueError, KeyError, TypeError) as exc:
        module.fail_json(msg=f"cannot update the instance list: {exc}", changed=False)
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
