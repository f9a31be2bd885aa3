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
    instances' settings hashes) as JSON to O(path), atomically, mode 0600, owned by the
    user the module runs as (root, as the roles run it with become). Written when a deploy
    passed its gates; playbooks/upgrade.yml rolls a host back to it when a later change
    fails.
  - The record holds no secret - every value of each model's C(env), the value of each
    C(extra_args) option whose name says it is a secret (C(--hf-token), C(--api-key)...)
    and any entry key so named are kept as C(sha256) digests (C(gpufleet.redact),
    the one rule; a rollback takes the values back from the inventory), and
    C(vllm_server_api_key) is not in it. A record of another format (not built by this
    version's C(build_record)) is refused.
  - A record already there with another mode or owner (0644, as records were written
    before) is replaced, and the task reports a change, even when its content is the same.
  - C(read) returns the record (C(record) is empty when there is none) and changes nothing.
    It refuses a record that is not owned by the user the module runs as (root with
    become) or that group or others may write, naming its owner and mode and what to do
    (whoever can write the record could choose what a rollback runs). A record written
    before secrets were redacted (version 1, values verbatim, mode 0644) is still read; the
    next C(present) replaces it.
version_added: "0.2.0"
author: gpufleet maintainers (!UNKNOWN)
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
    description: The record to write (with O(state=present)), as C(gpufleet_build_record) makes it.
    type: dict
  check_image:
    description:
      - With O(state=read), also ask the host's Docker engine whether the record's image (by id)
        is still there, and return the verdict in C(problem) - what playbooks/upgrade.yml checks
        before it drains a host, since a rollback runs that image and never pulls it.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reports whether the record would change and writes nothing.
  diff_mode:
    support: full
    description: Shows the record before and after, and the file's mode and owner.
"""

EXAMPLES = r"""
- name: Read the last good state
  gpufleet.fleet.vllm_record:
    state: read
  register: last_good
"""

RETURN = r"""
record:
  description: The record now on the host (empty dict when none).
  returned: always
  type: dict
image_present:
  description: Whether the record's image is on the host (O(check_image)).
  returned: with O(state=read) and O(check_image)
  type: bool
problem:
  description: Why a rollback to the record could not run (no record, or its image gone); empty when it could.
  returned: with O(state=read) and O(check_image)
  type: str
"""

import json
import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.jsonfile import read_json, write_json
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.upgrade import record_problem
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.redact import redact_models
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.upgrade import RECORD_VERSION

MODE = 0o600
FIX = "move it aside and run site.yml to record the current state again"


def _file_state(path):
    """(mode, uid) of the file at `path` itself (a link is not followed), None when none."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    mode = stat.S_IMODE(info.st_mode) if stat.S_ISREG(info.st_mode) else None
    return mode, info.st_uid


def _shown(record):
    """A record as the diff shows it: a version-1 record (values verbatim) with its models
    redacted as version 2 keeps them, so replacing one with --diff prints no secret."""
    inputs = record.get("inputs")
    if record.get("version") == 1 and isinstance(inputs, dict):
        models = redact_models(inputs.get("vllm_server_models"))
        return dict(record, inputs=dict(inputs, vllm_server_models=models))
    return record


def run(params, check_mode, euid=None, image_present=None):
    """image_present(image_id) -> bool asks the Docker engine (main() passes docker image inspect)."""
    path = params["path"]
    euid = os.geteuid() if euid is None else euid
    if params["state"] == "read":
        record = read_json(path, {}, FIX, owner=euid)
        result = {"changed": False, "record": record}
        if params.get("check_image"):
            present = bool(record.get("image_id")) and image_present(record["image_id"])
            result.update(image_present=present, problem=record_problem(record, present, path))
        return result
    before = read_json(path, {}, FIX)
    if not params["record"]:
        raise ValueError("state=present needs a record")
    after = params["record"]
    if after.get("version") != RECORD_VERSION:
        raise ValueError(f"the record is not of version {RECORD_VERSION} (got "
                         f"{after.get('version')!r}): build it with gpufleet_build_record, "
                         "which keeps no secret")
    found = _file_state(path)
    loose = found is not None and found != (MODE, euid)
    changed = before != after or loose
    if changed and not check_mode:
        write_json(path, after, mode=MODE)
    diff = {"before": json.dumps(_shown(before), indent=2, sort_keys=True) + "\n",
            "after": json.dumps(after, indent=2, sort_keys=True) + "\n"}
    if found is not None:
        mode = "not a file" if found[0] is None else f"mode {found[0]:04o}"
        diff.update(before_header=f"{path} ({mode}, uid {found[1]})",
                    after_header=f"{path} (mode {MODE:04o}, uid {euid})")
    return {"changed": changed, "record": after, "diff": diff}


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/gpufleet/vllm-last-good.json"},
            "state": {"type": "str", "choices": ["present", "read"], "default": "present"},
            "record": {"type": "dict"},
            "check_image": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec)
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))

    def image_present(image_id):
        """Ask the Docker engine (DOCKER_HOST, as vllm_server's tasks set it) by id: the
        Python SDK the community.docker modules use, or the CLI where it is missing."""
        try:
            import docker  # pylint: disable=import-outside-toplevel
        except ImportError:
            docker = None
        if docker is not None:
            try:
                docker.from_env(timeout=30).images.get(image_id)
                return True
            except docker.errors.ImageNotFound:
                return False
            except docker.errors.DockerException as exc:
                raise ValueError(f"cannot ask the Docker engine for {image_id}: {exc}") from None
        cli = module.get_bin_path("docker")
        if cli is None:
            raise ValueError("neither the Python docker SDK nor the docker command is on the host: "
                             "cannot tell whether the record's image is there")
        rc, _out, err = module.run_command([cli, "image", "inspect", "--format", "{{.Id}}", image_id])
        if rc != 0 and "No such image" not in err:
            raise ValueError(f"cannot ask the Docker engine for {image_id}: {err.strip()[:500]}")
        return rc == 0

    try:
        result = run(module.params, module.check_mode, image_present=image_present)
    except ValueError as exc:
        module.fail_json(msg=str(exc), changed=False)
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
