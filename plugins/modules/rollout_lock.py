#!/usr/bin/python
"""Ansible module rollout_lock: one rollout at a time, for the whole fleet."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rollout_lock
short_description: Take or release the fleet-wide lock that lets one rollout run at a time
description:
  - C(present) takes the lock for O(rollout), a JSON file, mode 0600, naming the rollout,
    its O(holder), its start time and its O(scope) (the hosts of the run). It is linked
    into place whole (link() refuses an existing name), so of two runs that start at once
    exactly one gets it, and no run ever reads it half written. A lock held by another
    rollout is refused with what it holds, unless O(break_lock) names that
    rollout's id (a stale lock is never broken silently). Taking a lock this rollout
    already holds changes nothing.
  - C(absent) releases the lock when O(rollout) holds it; another rollout's lock is left
    alone (and said).
  - C(read) returns the lock (empty when none) and changes nothing.
  - playbooks/upgrade.yml keeps it on the first host of the inventory group gateways (where every
    run of the fleet looks), or on the first GPU host of the inventory without a gateway.
version_added: "0.3.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  path:
    description: File of the lock.
    type: path
    default: /var/lib/gpufleet/rollout.lock
  state:
    description: C(present) (take), C(absent) (release) or C(read).
    type: str
    choices: [present, absent, read]
    default: present
  rollout:
    description: The rollout's id (with O(state=present) and O(state=absent)).
    type: str
  holder:
    description: Who runs it (user@control-node), shown to a second run.
    type: str
  scope:
    description: The hosts of the run.
    type: list
    elements: str
    default: []
  break_lock:
    description: The id of a stale lock's rollout, to take the lock over from it.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Says whether the lock would be taken, refused or released, and writes nothing.
  diff_mode:
    support: full
    description: Shows the holder before and after.
"""

EXAMPLES = r"""
- name: Take the rollout lock
  gpufleet.fleet.rollout_lock:
    rollout: "20261206T014500Z-4821"
    holder: "ops@controller"
    scope: "{{ ansible_play_hosts_all }}"
  delegate_to: "{{ groups['gateways'][0] }}"
  run_once: true
"""

RETURN = r"""
lock:
  description: The lock now held (empty when none).
  returned: always
  type: dict
broken:
  description: The stale lock that O(break_lock) took over, if any.
  returned: with O(state=present)
  type: dict
msg:
  description: What was done.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import rollout as rollout_lib


def run(params, check_mode):
    path = params["path"]
    if params["state"] == "read":
        lock = rollout_lib.read_lock(path)
        return {"changed": False, "lock": lock,
                "msg": rollout_lib.lock_message(lock, path) if lock else "no rollout holds the fleet"}
    if not params["rollout"]:
        raise rollout_lib.RolloutError(f"state={params['state']} needs rollout")
    before = rollout_lib.read_lock(path)
    if params["state"] == "absent":
        result = rollout_lib.release_lock(path, params["rollout"], check_mode)
    else:
        if not params["holder"]:
            raise rollout_lib.RolloutError("state=present needs holder")
        result = rollout_lib.take_lock(path, params["rollout"], params["holder"], params["scope"],
                                       params["break_lock"], check_mode=check_mode)
        broke = result["broken"]
        result["msg"] = (f"rollout {params['rollout']} holds the lock"
                         + (f" (taken over from rollout {broke.get('rollout')} of {broke.get('holder')})"
                            if broke else ""))
    result["diff"] = {"before": f"{before.get('rollout', '-')} {before.get('holder', '')}\n",
                      "after": f"{result['lock'].get('rollout', '-')} {result['lock'].get('holder', '')}\n"}
    return result


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": rollout_lib.LOCK_PATH},
            "state": {"type": "str", "choices": ["present", "absent", "read"], "default": "present"},
            "rollout": {"type": "str"},
            "holder": {"type": "str"},
            "scope": {"type": "list", "elements": "str", "default": []},
            "break_lock": {"type": "str", "default": "", "no_log": False},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec)
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    try:
        result = run(module.params, module.check_mode)
    except (rollout_lib.RolloutError, ValueError, OSError) as exc:
        module.fail_json(msg=str(exc), changed=False)
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
