#!/usr/bin/python
"""Ansible module hf_mirror_index: publish verified model folders as a static HF mirror tree."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_mirror_index
short_description: Publish model folders fetched by hf_model as a static Hugging Face mirror tree
description:
  - Reads each folder's verified manifest (C(.gpufleet/manifest.json), written by
    M(gpufleet.fleet.hf_model)), checks every file still has its recorded size and mtime, and writes
    under O(root) the API answers a hub client needs (repo info with siblings, recursive
    tree listing with sha256/git blob sha1) and C(resolve) symlinks into the folders.
  - Also writes nginx map files (C(root/nginx/etags.map), C(commits.map),
    C(revisions.map)) so the web server answers with ETag, X-Repo-Commit and
    X-Error-Code, and serves only the files the manifests list. No byte is copied.
  - Used by the hf_site_mirror role; the web server configuration is the role's.
options:
  root:
    description: Folder of the static site (C(www/) and C(nginx/) are created in it).
    type: path
    required: true
  models:
    description:
      - Folders to publish. Each item has C(path) and optionally C(repo_id) (default
        the manifest's repo id) and C(lock), the model's lock (a dict as
        M(gpufleet.fleet.hf_model_lock) writes it).
      - A folder with a lock is published only when it holds the lock's commit and every
        file's sha256 is the lock's (recorded in the manifest for LFS files and locked
        fetches, hashed otherwise); otherwise nothing is published and the task fails
        naming each file and both values.
    type: list
    elements: dict
    required: true
  torrents:
    description:
      - Folder where a private BitTorrent torrent of each published folder is written
        (C(org--name.torrent) and C(org--name.json) with its commit and infohash), for
        model_fetch's p2p transport (docs/model-fetch.md, "Peer-to-peer fan-out"). Made
        only from the verified manifest, deterministic (rewritten only when the folder's
        commit or files change). Needs libtorrent in the host's Python
        (Debian C(python3-libtorrent)). Unset, no torrent is made.
    type: path
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Reports the paths that would change; writes nothing.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
requirements:
  - requests (the Python library, on the host the module runs on)
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Publish the fetched models
  gpufleet.fleet.hf_mirror_index:
    root: /srv/hf-mirror
    models:
      - path: /srv/models/Qwen2.5-7B-Instruct
      - path: /srv/models/tiny
        repo_id: lab/tiny
        lock: "{{ lookup('ansible.builtin.file', 'locks/lab--tiny.lock.yml') | from_yaml }}"
"""

RETURN = r"""
changed:
  description: True when a file or link of the site was written or removed.
  returned: always
  type: bool
repos:
  description:
    - Published repos (repo_id, commit, revision, folder, files, bytes, locked, lock_missing).
    - C(locked) says the folder was checked against its lock; C(lock_missing) lists the
      files the lock pins that the folder does not hold (a folder fetched with allow
      patterns).
  returned: success
  type: list
  elements: dict
torrents:
  description: With O(torrents), one item per repo (repo_id, commit, infohash, infohash_v2,
    torrent, changed).
  returned: with torrents
  type: list
  elements: dict
changed_paths:
  description: Paths under root that were (or in check mode would be) written or removed.
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.hub import HubError
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import p2p_torrent
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.hub_mirror import build_site, read_model_folder


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", required=True),
            models=dict(type="list", elements="dict", required=True),
            torrents=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec)
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    try:
        for item in module.params["models"]:
            if not isinstance(item.get("path"), str) or not item["path"]:
                raise HubError(f"models item {item!r} has no path: give "
                               "{'path': FOLDER, 'repo_id': 'org/name'}.")
        result = build_site(module.params["root"], module.params["models"],
                            check_mode=module.check_mode)
        if module.params["torrents"]:
            result["torrents"], paths = p2p_torrent.write_torrents(
                module.params["torrents"],
                [read_model_folder(m["path"], m.get("repo_id")) for m in module.params["models"]],
                check_mode=module.check_mode)
            result["changed_paths"] = result["changed_paths"] + paths
            result["changed"] = bool(result["changed"] or paths)
    except HubError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:  # root cannot be made or written: a path, a permission, a full disk
        module.fail_json(msg=f"cannot publish under root {module.params['root']}: "
                             f"{exc.strerror or exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
