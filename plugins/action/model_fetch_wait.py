"""Action model_fetch_wait: follow an async job (hf_model's in roles/model_fetch) to its end in
one task, on the controller, printing progress reports; documented in
plugins/modules/model_fetch_wait.py.

A loop here instead of a task file that includes itself once per report: such a file nests
one include deeper each time and dies with RecursionError after a few hundred reports,
while a fetch may run for a day. Options and the report's text are plain Python
(plugins/module_utils/gpufleet/fetch_wait.py, tests/unit/test_fetch_wait.py).
"""
from __future__ import annotations

import base64
import time

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import fetch_wait

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True  # it only reads the job's status and the progress file
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        try:
            opts = fetch_wait.wait_options(self._task.args)
        except fetch_wait.WaitOptionError as exc:
            result.update(failed=True, msg=f"model_fetch_wait: {exc}", polls=0, reports=0)
            return result
        host = (task_vars or {}).get("inventory_hostname", "?")
        jid = opts["jid"]

        # The async_status action, as `poll: N` runs it (TaskExecutor._poll_async_result):
        # its result is exactly what a task `ansible.builtin.async_status: jid=...` registers.
        status_task = self._task.copy()
        status_task.args = {"jid": jid}
        status = self._shared_loader_obj.action_loader.get(
            "ansible.builtin.async_status", task=status_task, connection=self._connection,
            play_context=self._play_context, loader=self._loader, templar=self._templar,
            shared_loader_obj=self._shared_loader_obj)

        start = time.monotonic()
        deadline = start + opts["timeout"]
        next_report = start + opts["progress_interval"]
        polls = reports = 0
        last = None  # the last status read, or the connection error of the last look
        while True:
            try:
                last = status.run(task_vars=task_vars)
            except AnsibleConnectionFailure as exc:
                # a network bounce or a reboot must not end a day-long wait: look again
                # until the timeout (as `poll: N` does)
                last = exc
                display.vvvv(f"model_fetch_wait: [{host}] job {jid}: could not look ({exc}); "
                             "looking again")
                try:
                    self._connection.reset()
                except AttributeError:
                    pass
            polls += 1
            if isinstance(last, dict) and self._ended(last):
                result.update(last)
                result.update(polls=polls, reports=reports)
                return result
            display.vv(f"model_fetch_wait: [{host}] job {jid} still running (poll {polls})")
            now = time.monotonic()
            if opts["progress_path"] and now >= next_report:
                line = self._report(opts, task_vars)
                if line is not None:
                    display.display(f"[{host}] {line}")
                    reports += 1
                now = time.monotonic()
                next_report = now + opts["progress_interval"]
            if now >= deadline:
                why = (f"the last look failed: {last}" if isinstance(last, Exception)
                       else "it is still running")
                result.update(
                    failed=True, finished=False, ansible_job_id=jid, polls=polls,
                    reports=reports,
                    msg=f"model_fetch_wait: job {jid} did not end within the timeout of "
                        f"{opts['timeout']:g} s ({polls} looks every {opts['delay']:g} s); "
                        f"{why}. Raise the timeout, or see why the job takes this long.")
                return result
            time.sleep(min(opts["delay"], deadline - now))

    @staticmethod
    def _ended(status):
        """When `poll: N` stops looking: the job finished, or the status could not be had
        (a parsed failure: no such job), or the look was skipped."""
        return bool(status.get("finished") or status.get("skipped")
                    or (status.get("failed") and status.get("_ansible_parsed")))

    def _report(self, opts, task_vars):
        """The progress line from the progress file on the host, or None when it cannot be
        read (not written yet, or not a progress file)."""
        try:
            read = self._execute_module(module_name="ansible.legacy.slurp",
                                        module_args={"src": opts["progress_path"]},
                                        task_vars=task_vars)
        except AnsibleConnectionFailure as exc:
            display.vvvv(f"model_fetch_wait: could not read {opts['progress_path']} ({exc})")
            return None
        if read.get("failed") or "content" not in read:
            display.vvv(f"model_fetch_wait: no progress in {opts['progress_path']}: "
                        f"{read.get('msg', 'no content')}")
            return None
        try:
            raw = base64.b64decode(read["content"])
        except (TypeError, ValueError):
            return None
        progress = fetch_wait.read_progress(raw)
        if progress is None:
            display.vvv(f"model_fetch_wait: {opts['progress_path']} holds no progress counts")
            return None
        return fetch_wait.progress_line(opts["label"], progress)
