#!/usr/bin/python
"""Ansible module rollout_state: where a host is in a rollout, kept on the host."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rollout_state
short_description: Keep a host's place in a rollout on the host, so a later run resumes it
description:
  - C(present) records that the host enters O(step) of rollout O(rollout), before the step
    begins (or, for C(recorded) and C(rolled_back), once the change is done). The file is
    JSON, written atomically, mode 0600, with the last 50 steps as history.
  - C(read) returns the state and whether a rollout left the host mid-change (C(held));
    playbooks/upgrade.yml resumes such a host first, and site.yml refuses to touch it.
  - The steps, in order, and what each means are in C(gpufleet.rollout.STEPS) and
    docs/upgrades.md.
version_added: "0.3.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  path:
    description: File of the state on the host.
    type: path
    default: /var/lib/gpufleet/rollout-state.json
  state:
    description: C(present) (record O(step)) or C(read).
    type: str
    choices: [present, read]
    default: present
  rollout:
    description: The rollout's id (with O(state=present)).
    type: str
  step:
    description: The step the host enters (with O(state=present)).
    type: str
    choices: [draining, out_of_service, applied, gated, in_service, recorded, rolling_back, rolled_back, failed]
attributes:
  check_mode:
    support: full
    description: Reports whether the state would change and writes nothing.
  diff_mode:
    support: full
    description: Shows the rollout and step before and after.
"""

EXAMPLES = r"""
- name: Say the host is being drained by this rollout
  gpufleet.fleet.rollout_state:
    rollout: "20261206T014500Z-4821"
    step: draining

- name: Is the host held by a rollout that did not finish?
  gpufleet.fleet.rollout_state:
    state: read
  register: rollout
"""

RETURN = r"""
rollout_state:
  description: The state now on the host (empty when no rollout ever touched it).
  returned: always
  type: dict
  contains:
    rollout: {description: The rollout's id., type: str}
    step: {description: The last step entered., type: str}
    at: {description: When (UTC)., type: str}
    held: {description: True when the step is not one that ends a change., type: bool}
    history: {description: "[rollout, step, at] of the last 50 steps, oldest first.", type: list}
held:
  description: True when a rollout left the host mid-change.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import rollout as rollout_lib

_STEPS = list(rollout_lib.STEPS)


def run(params, check_mode):
    before = rollout_lib.read_state(params["path"])
    if params["state"] == "read":
        return {"changed": False, "rollout_state": before, "held": bool(before.get("held"))}
    if not params["rollout"] or not params["step"]:
        raise rollout_lib.RolloutError("state=present needs rollout and step")
    after = rollout_lib.write_state(params["path"], params["rollout"], params["step"], before=before)
    changed = (before.get("rollout"), before.get("step")) != (after["rollout"], after["step"])
    if changed:
        rollout_lib.save_state(params["path"], after, check_mode)
    else:
        after = before
    after = dict(after, held=after["step"] in rollout_lib.HELD_STEPS)
    return {"changed": changed, "rollout_state": after, "held": after["held"],
            "diff": {"before": f"{before.get('rollout', '-')} {before.get('step', '-')}\n",
                     "after": f"{after['rollout']} {after['step']}\n"}}


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": rollout_lib.STATE_PATH},
            "state": {"type": "str", "choices": ["present", "read"], "default": "present"},
            "rollout": {"type": "str"},
            "step": {"type": "str", "choices": _STEPS},
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
