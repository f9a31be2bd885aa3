#!/usr/bin/python
"""Ansible module host_state: skip a GPU host whose inputs and state have not changed."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_state
short_description: Decide in one round trip whether a GPU host needs site.yml's full run
description:
  - C(check) reads the host's state record (written by C(record) at the end of the last
    full run), observes the host now (the package database, every file under the
    configuration trees the roles write, the services, the vLLM containers, the model
    folders, the GPUs, the kernel and the boot) and compares both with the record and
    O(inputs_digest) with the record's. C(unchanged) is true only when everything matches;
    otherwise C(reasons) says what differs (the first twelve) and site.yml runs every role
    on the host, which repairs any drift.
  - C(record) observes the host and writes the record (mode 0600, owned by root) with
    O(inputs_digest) and O(published), atomically. It changes nothing when the record
    would stay the same except for its time.
  - The observation itself is C(gpufleet.hoststate) (module_utils), which also lists the
    trees and files read.
version_added: "0.3.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  state:
    description: C(check) (read-only) or C(record).
    type: str
    choices: [check, record]
    default: check
  path:
    description: The record's file on the host.
    type: path
    default: /var/lib/gpufleet/host-state.json
  inputs_digest:
    description:
      - The sha256 of the host's inputs (every role variable and the playbook's code), as
        site.yml's state play computes it with the C(gpufleet_state_digest) filter. An
        empty value means the inputs could not be read before the run; C(check) then
        answers C(unchanged=false).
    type: str
    default: ""
  published:
    description:
      - With C(record), what later plays read from a skipped host (the serving instances
        and the chosen settings, as C(gpufleet.hoststate.published_facts) keeps them).
        C(check) returns it when the host is unchanged.
    type: dict
    default: {}
  nvidia_smi_xml:
    description: Read the GPUs from this C(nvidia-smi -q -x) capture instead of the host.
    type: path
  rollout_state_path:
    description:
      - With C(check), the host's rollout state (plugins/modules/rollout_state.py) is read in the same
        round trip; a host a rollout left mid-change is returned as C(held) (and not
        unchanged), so site.yml can refuse it.
    type: path
    default: /var/lib/gpufleet/rollout-state.json
attributes:
  check_mode:
    support: full
    description: C(check) changes nothing; C(record) reports whether the record would change.
  diff_mode:
    support: full
    description: With C(record), what differs from the record on the host.
"""

EXAMPLES = r"""
- name: State | Compare the host with its last full run
  gpufleet.fleet.host_state:
    state: check
    inputs_digest: "{{ __gpufleet_state_digest }}"
  register: __gpufleet_state

- name: State | Record the host after a full run
  gpufleet.fleet.host_state:
    state: record
    inputs_digest: "{{ __gpufleet_state_digest }}"
    published: "{{ vllm_server_plan | gpufleet_state_published(vllm_server_tunes) }}"
"""

RETURN = r"""
unchanged:
  description: (check) true when the inputs and everything observed match the record.
  returned: state=check
  type: bool
reasons:
  description: What differs from the record (empty when unchanged or when recorded anew).
  returned: always
  type: list
  elements: str
published:
  description: (check) the record's published facts when unchanged, else an empty dict.
  returned: state=check
  type: dict
recorded_at:
  description: When the record in force was written (UTC, ISO 8601), empty when none.
  returned: always
  type: str
rollout_state:
  description: (check) the host's rollout state, as rollout_state reads it (empty when none).
  returned: state=check
  type: dict
held:
  description: (check) true when a rollout left the host mid-change.
  returned: state=check
  type: bool
ansible_facts:
  description: C(gpu), the GPU facts read now (as gpu_facts returns them).
  returned: always
  type: dict
"""

import datetime
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.gpu import (
    GpuFactsError, gather, nvidia_smi_runner, parse_nvidia_smi_xml)
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.hoststate import (
    RECORD_PATH, HostStateError, build_record, compare, observe, spec_for)
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.jsonfile import read_json, write_json
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import rollout


def _gpu_facts(module):
    xml = module.params["nvidia_smi_xml"]
    try:
        if xml:
            with open(xml, "rb") as handle:
                return parse_nvidia_smi_xml(handle.read())
        return gather(run_nvidia_smi=nvidia_smi_runner(module))[0]
    except (OSError, GpuFactsError) as exc:
        module.fail_json(msg=f"cannot read the GPUs ({exc}); fix what gpu_facts reports "
                             "for this host, then run again")


def _run(module):
    def run(argv):
        path = module.get_bin_path(argv[0])
        if path is None:
            return 127, ""
        rc, out, _err = module.run_command([path] + argv[1:])
        return rc, out
    return run


def run(module, params, check_mode, gpus):
    path = params["path"]
    # trusted only when it is the module's user's (root's) and no one else may write it:
    # its published facts (instance URLs) feed later plays (issue #32 item 6)
    before = read_json(path, {}, "remove it: the next site.yml run writes it again",
                       owner=os.geteuid())
    result = {"changed": False, "reasons": [], "recorded_at": before.get("recorded_at", "")}
    if params["state"] == "check":
        if not before:
            reasons = [f"no state record at {path} (first run, or a run that stopped early)"]
        elif not params["inputs_digest"]:
            reasons = ["the inputs could not be read before the run"]
        else:
            observed = observe(spec_for(before.get("published")), _run(module), gpus)
            reasons = compare(before.get("observed", {}), observed)
            if before.get("inputs_digest") != params["inputs_digest"]:
                reasons.insert(0, "the inputs changed (a role variable, the inventory or "
                                  "the playbook's code)")
        held = rollout.read_state(params["rollout_state_path"])
        if held.get("held"):
            reasons.insert(0, f"a rollout left it mid-change (rollout {held.get('rollout')}, "
                              f"step {held.get('step')})")
        result.update(unchanged=not reasons, reasons=reasons,
                      published=before.get("published", {}) if not reasons else {},
                      rollout_state=held, held=bool(held.get("held")))
        return result
    observed = observe(spec_for(params["published"]), _run(module), gpus)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    after = build_record(params["inputs_digest"], observed, params["published"], now)
    same = {k: v for k, v in before.items() if k != "recorded_at"} == \
        {k: v for k, v in after.items() if k != "recorded_at"}
    if same:
        return result
    result["reasons"] = (compare(before.get("observed", {}), observed) if before
                         else ["no record yet"])
    if before.get("inputs_digest") not in (None, params["inputs_digest"]):
        result["reasons"].insert(0, "the inputs changed")
    result.update(changed=True, recorded_at=now if not check_mode else result["recorded_at"])
    if not check_mode:
        write_json(path, after, mode=0o600)
    result["diff"] = {"before": "\n".join(result["reasons"]) + "\n" if before else "",
                      "after": json.dumps({"inputs_digest": after["inputs_digest"],
                                           "published": after["published"]},
                                          indent=2, sort_keys=True) + "\n"}
    return result


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["check", "record"], "default": "check"},
            "path": {"type": "path", "default": RECORD_PATH},
            "inputs_digest": {"type": "str", "default": ""},
            "published": {"type": "dict", "default": {}},
            "nvidia_smi_xml": {"type": "path"},
            "rollout_state_path": {"type": "path", "default": rollout.STATE_PATH},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec)
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    gpus = _gpu_facts(module)
    try:
        result = run(module, module.params, module.check_mode, gpus)
    except (HostStateError, ValueError) as exc:  # rollout.RolloutError is a ValueError
        module.fail_json(msg=str(exc), changed=False)
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(ansible_facts={"gpu": gpus}, **result)


if __name__ == "__main__":
    main()
