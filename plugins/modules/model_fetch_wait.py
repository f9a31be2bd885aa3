#!/usr/bin/python
"""Documentation of the action model_fetch_wait (plugins/action/model_fetch_wait.py); the
action runs on the controller, this file never runs as a module on a host."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_fetch_wait
short_description: Follow an async job to its end in one task, printing progress reports
description:
  - >-
    Looks at the async job O(jid) every O(delay) seconds (the C(ansible.builtin.async_status)
    action, as C(poll) does) until it has finished, then returns the job's own result: a
    failed job fails this task with its C(msg), and the job's return values (for
    M(gpufleet.fleet.hf_model) C(commit), C(files), C(bytes_downloaded), C(changed)) are exactly what
    C(async_status) returned.
  - >-
    Every O(progress_interval) seconds while the job runs, reads O(progress_path) on the
    host (M(gpufleet.fleet.hf_model)'s C(DEST/.gpufleet/progress.json); not there yet is fine) and prints
    one line, for example
    C([gpu1] Qwen/Qwen2.5-7B-Instruct: 3/10 files, 1.20/14.50 GiB verified (1.30 GiB downloaded)).
  - >-
    One task however long the job runs. The loop is in the action on the controller, not in
    a task file that includes itself once per report (that nests one level deeper each time
    and fails with a RecursionError after a few hundred reports).
  - A look that fails to connect (a network bounce, a reboot) is retried until O(timeout).
  - An action plugin; this module file holds its documentation and never runs on a host.
options:
  jid:
    description: C(ansible_job_id) of the async task (started with C(async) and C(poll=0)).
    type: str
    required: true
  progress_path:
    description:
      - Progress file on the host, JSON with C(files_done), C(files_total),
        C(bytes_verified), C(bytes_total) and C(bytes_downloaded).
      - Unset, nothing is read or printed while the job runs.
    type: path
  label:
    description: What each progress line names (the repo id); defaults to O(progress_path).
    type: str
  delay:
    description: Seconds between two looks at the job; more than 0, at most a year.
    type: float
    default: 5
  progress_interval:
    description: Seconds between two progress reports; at least O(delay), at most a year.
    type: float
    default: 60
  timeout:
    description:
      - Seconds after which the task fails if the job still runs (more than 0, at most a
        year). The job itself is not stopped; give the job's own C(async) limit plus a
        margin, so the job's own timeout message comes first.
    type: float
    default: 86400
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.flow
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: >-
      Only reads the job's status and the progress file, the same in check mode; an async
      job is normally not started in check mode, so there is nothing to follow there.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
notes:
  - The options are checked before anything is looked at; a wrong type, a number that is
    0, negative, NaN, infinite or above a year, or O(progress_interval) below O(delay)
    fails the task with a message naming the option.
  - The job's status file is left in the async folder, as a task C(async_status) leaves it.
seealso:
  - module: ansible.builtin.async_status
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Start the fetch
  gpufleet.fleet.hf_model:
    repo_id: Qwen/Qwen2.5-7B-Instruct
    dest: /srv/models/Qwen/Qwen2.5-7B-Instruct
  async: 86400
  poll: 0
  register: fetch_job

- name: Follow it, a progress line every minute
  gpufleet.fleet.model_fetch_wait:
    jid: "{{ fetch_job.ansible_job_id }}"
    progress_path: /srv/models/Qwen/Qwen2.5-7B-Instruct/.gpufleet/progress.json
    label: Qwen/Qwen2.5-7B-Instruct
    delay: 5
    progress_interval: 60
    timeout: 86700
  register: fetched
"""

RETURN = r"""
finished:
  description: The job has finished (false only when the task failed on O(timeout)).
  returned: when the options were valid
  type: bool
ansible_job_id:
  description: The job followed.
  returned: when the options were valid
  type: str
polls:
  description: How many times the job's status was looked at (0 when an option was refused).
  returned: always
  type: int
  sample: 1440
reports:
  description: How many progress lines were printed.
  returned: always
  type: int
  sample: 120
changed:
  description: The job's own C(changed).
  returned: when the job finished
  type: bool
msg:
  description: >-
    The job's own message when it failed, or why the wait failed (bad option, timeout).
  returned: on failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.fetch_wait import ARGUMENT_SPEC


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="model_fetch_wait runs only as an action on the controller "
                         "(plugins/action/model_fetch_wait.py, ansible.cfg action_plugins); "
                         "it was run as a module on the host.")


if __name__ == "__main__":
    main()
