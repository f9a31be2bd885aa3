#!/usr/bin/python
"""Ansible module hf_model_lock: write a model's lock on the control node."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_model_lock
short_description: Write a model's lock (commit and every file's sha256) from a source you trust
description:
  - Writes the lock that M(gpufleet.fleet.hf_model) (option O(gpufleet.fleet.hf_model#module:lock)) and the C(model_fetch)
    role (C(model_fetch_locks), an entry's C(lock)) check every host's fetch against, so that
    neither a hostile mirror nor a swapped file can change weights or code
    (C(plugins/module_utils/gpufleet/model_lock.py), docs/security.md).
  - Run it on the control node (C(playbooks/model_lock.yml)), once per model and revision,
    against an endpoint you trust (the public hub by default), or from a copy hf_model
    verified (O(src)); keep the file in the inventory or beside it, under version control.
  - From an endpoint, the revision is resolved to its commit and every file of the
    repository is pinned. LFS files (the weights) by the sha256 of the hub's listing, without
    downloading them; the others by the sha256 of their bytes, downloaded into a temporary
    folder and checked against the listing's git blob sha1 first.
  - The file is YAML, mode 0644 (it holds no secret). One that already pins the same commit
    and files is left alone (C(changed=false)); one that pins others is replaced only with
    O(force), since a lock is written once.
options:
  repo_id:
    description: Repo id on the hub, C(org/name). Not used with O(src) (the manifest names it).
    type: str
  revision:
    description: Branch, tag or commit sha to pin; the lock records the commit it resolves to.
    type: str
    default: main
  endpoint:
    description:
      - The endpoint you trust. Defaults to E(HF_ENDPOINT) on the node, else
        U(https://huggingface.co).
    type: str
  token:
    description: Hub token for gated or private repos (from a vault, or E(HF_TOKEN)); never
      logged nor written.
    type: str
  src:
    description:
      - A folder hf_model fetched and verified (its C(.gpufleet/manifest.json) complete).
        Every file it lists is hashed again and pinned, instead of asking an endpoint. The
        lock pins what that fetch selected; fetch it without patterns to pin the whole
        repository.
    type: path
  path:
    description: The lock file to write (its folder must exist).
    type: path
    required: true
  force:
    description: Replace a lock at O(path) that pins another commit or other files.
    type: bool
    default: false
  max_workers:
    description:
      - Small files downloaded in parallel.
      - From 1 to 256.
    type: int
    default: 8
  timeout:
    description:
      - Seconds to wait to connect and between bytes.
      - Above 0 and at most 3600 (an hour).
    type: float
    default: 30
  retries:
    description:
      - Failed attempts per request before giving up.
      - From 0 to 100.
    type: int
    default: 5
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Reads the endpoint (or O(src)) and returns the lock; writes nothing.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
requirements:
  - requests (the Python library, on the host the module runs on)
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Pin Qwen2.5-7B-Instruct from the public hub, beside the inventory
  gpufleet.fleet.hf_model_lock:
    repo_id: Qwen/Qwen2.5-7B-Instruct
    revision: main
    path: "{{ inventory_dir }}/locks/Qwen2.5-7B-Instruct.lock.yml"
  delegate_to: localhost
  run_once: true

- name: Pin a copy fetched and verified on the control node
  gpufleet.fleet.hf_model_lock:
    src: /srv/models/Qwen/Qwen2.5-7B-Instruct
    path: "{{ inventory_dir }}/locks/Qwen2.5-7B-Instruct.lock.yml"
    force: true
  delegate_to: localhost
"""

RETURN = r"""
changed:
  description: True when the lock file was written (or, in check mode, would be).
  returned: always
  type: bool
path:
  description: The lock file.
  returned: success
  type: str
lock:
  description: The lock, C({format, repo_id, commit, files, source, written_at}).
  returned: success
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import hub
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import model_lock
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.hub import HubError
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.hub_client import PUBLIC_ENDPOINT, HubClient


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo_id=dict(type="str"),
            revision=dict(type="str", default="main"),
            endpoint=dict(type="str"),
            token=dict(type="str", no_log=True),
            src=dict(type="path"),
            path=dict(type="path", required=True),
            force=dict(type="bool", default=False),
            max_workers=dict(type="int", default=8),
            timeout=dict(type="float", default=30),
            retries=dict(type="int", default=5),
        ),
        required_one_of=[("repo_id", "src")],
        mutually_exclusive=[("src", "repo_id"), ("src", "endpoint"), ("src", "token")],
        supports_check_mode=True,
    )
    try:
        options.check(module.params, module.argument_spec, {
            "max_workers": options.whole(1, 256),
            "timeout": options.number(above=0, high=options.HOUR, unit="seconds"),
            "retries": options.whole(0, 100),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    p = module.params
    path = p["path"]
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        module.fail_json(msg=f"the folder of path {path!r:.200} does not exist; create it "
                         "first.")
    token = p["token"] or os.environ.get("HF_TOKEN") or None
    if token:
        module.no_log_values.add(token)
    try:
        if p["src"]:
            lock = hub.lock_from_folder(p["src"])
        else:
            endpoint = p["endpoint"] or os.environ.get("HF_ENDPOINT") or PUBLIC_ENDPOINT
            client = HubClient(endpoint, token=token, timeout=p["timeout"],
                               retries=p["retries"])
            lock = hub.lock_from_hub(client, p["repo_id"], p["revision"], p["max_workers"])
        comment = (f"gpufleet model lock of {lock.repo_id}, written by hf_model_lock from "
                   f"{lock.source}.\nEvery host's fetch must resolve to this commit and hash "
                   "to these sha256s (docs/security.md).")
        changed = model_lock.write_lock_file(path, lock, force=p["force"], comment=comment,
                                             dry_run=module.check_mode)
    except (HubError, model_lock.LockError) as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"cannot write the lock {path}: {exc.strerror or exc}")
    module.exit_json(changed=changed, path=path, lock=lock.as_dict())


if __name__ == "__main__":
    main()
