#!/usr/bin/python
"""Ansible module vllm_record: the last-good record of a host's vLLM deploy."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_record
short_description: Keep the last-good state of a host's vLLM deploy on the host
description:
  - C(present) writes O(record) (built by C(gpufleet.upgrade.build_record) - the deploy's
    inputs with the image by id, each model folder's commit, the driver version, the
    instances' settings hashes) as JSON to O(path), atomically, mode 0644 (it holds no
    secret). Written when a deploy passed its gates; playbooks/upgrade.yml rolls a host
    back to it when a later change fails.
  - C(read) returns the record (C(record) is empty when there is none) and changes nothing.
version_added: "0.2.0"
author: gpufleet
options:
  path:
    description: File of the record on the host.
    type: path
    default: /var/lib/gpufleet/vllm-last-good.json
  state:
    description: C(present) (write O(record)) or C(read).
    type: str
    choices: [present, read]
    default: present
  record:
    description: The record to write (with O(state=present)).
    type: dict
attributes:
  check_mode:
    support: full
    description: Reports whether the record would change and writes nothing.
  diff_mode:
    support: full
    description: Shows the record before and after.
"""

EXAMPLES = r"""
- name: Read the last good state
  vllm_record:
    state: read
  register: last_good
"""

RETURN = r"""
record:
  description: The record now on the host (empty dict when none).
  returned: always
  type: dict
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpufleet.jsonfile import read_json, write_json


def run(params, check_mode):
    path = params["path"]
    before = read_json(path, {}, "move it aside and run site.yml to record the current "
                       "state again")
    if params["state"] == "read":
        return {"changed": False, "record": before}
    if not params["record"]:
        raise ValueError("state=present needs a record")
    after = params["record"]
    changed = before != after
    if changed and not check_mode:
        write_json(path, after)
    return {"changed": changed, "record": after,
            "diff": {"before": json.dumps(before, indent=2, sort_keys=True) + "\n",
                     "after": json.dumps(after, indent=2, sort_keys=True) + "\n"}}


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/gpufleet/vllm-last-good.json"},
            "state": {"type": "str", "choices": ["present", "read"], "default": "present"},
            "record": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    try:
        result = run(module.params, module.check_mode)
    except ValueError as exc:
        module.fail_json(msg=str(exc), changed=False)
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
