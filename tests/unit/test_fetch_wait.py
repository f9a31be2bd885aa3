"""Following an async job in one task (plugins/action/model_fetch_wait.py): its options and
progress line (plugins/module_utils/gpufleet/fetch_wait.py), and real ansible-playbook runs
(connection local) that look at a job hundreds of times, against the task file that
included itself once per report (roles/model_fetch/tasks/wait.yml until it was replaced)."""
import json
import math
import os
import pathlib
import re
import subprocess
import threading
import time

import pytest

from gpufleet import fetch_wait as fw

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------
# The progress line
# ---------------------------------------------------------------------------

def test_progress_line_is_the_text_the_role_printed():
    p = {"files_done": 3, "files_total": 10, "bytes_verified": 1288490189,
         "bytes_total": 15569256448, "bytes_downloaded": 1395864371, "updated": "x"}
    assert fw.progress_line("Qwen/Qwen2.5-7B-Instruct", p) == (
        "Qwen/Qwen2.5-7B-Instruct: 3/10 files, 1.20/14.50 GiB verified "
        "(1.30 GiB downloaded)")
    zero = dict.fromkeys(fw.PROGRESS_FIELDS, 0)
    assert fw.progress_line("org/x", zero) == \
        "org/x: 0/0 files, 0.00/0.00 GiB verified (0.00 GiB downloaded)"


def test_read_progress_takes_hf_models_file_and_nothing_else(tmp_path):
    from gpufleet import hub_fetch, hub_manifest, hub_names

    (tmp_path / hub_names.STATE_DIR).mkdir()  # hf_model makes it before it fetches
    stats = hub_fetch.Stats(str(tmp_path), 2, 3 << 30, write_progress=True)
    stats.add(downloaded=1 << 29, verified=1 << 30, file_done=True)
    raw = (tmp_path / hub_names.STATE_DIR / hub_manifest.PROGRESS_NAME).read_bytes()
    assert fw.progress_line("org/tiny", fw.read_progress(raw)) == \
        "org/tiny: 1/2 files, 1.00/3.00 GiB verified (0.50 GiB downloaded)"
    good = dict.fromkeys(fw.PROGRESS_FIELDS, 1)
    assert fw.read_progress(json.dumps(good)) == good
    for bad in (b"", b"{", b"[]", b"null", b"\xff\xfe", None,
                json.dumps(dict(good, files_done=-1)), json.dumps(dict(good, bytes_total="3")),
                json.dumps(dict(good, files_total=True)), json.dumps(dict(good, bytes_total=1.5)),
                json.dumps({k: v for k, v in good.items() if k != "bytes_downloaded"})):
        assert fw.read_progress(bad) is None, bad


# ---------------------------------------------------------------------------
# Options: a clear error for each wrong value, never a traceback
# ---------------------------------------------------------------------------

def test_options_defaults_and_numbers_as_strings():
    assert fw.wait_options({"jid": "j1.2"}) == {
        "jid": "j1.2", "progress_path": None, "label": None, "delay": 5.0,
        "progress_interval": 60.0, "timeout": 86400.0}
    opts = fw.wait_options({"jid": "j1", "progress_path": "/m/.gpufleet/progress.json",
                            "delay": "0.01", "progress_interval": 1, "timeout": " 86700 "})
    assert (opts["delay"], opts["progress_interval"], opts["timeout"]) == (0.01, 1.0, 86700.0)
    assert opts["label"] == "/m/.gpufleet/progress.json"  # no label: the file names it
    assert fw.wait_options({"jid": "j", "label": "org/x"})["label"] == "org/x"
    assert fw.wait_options({"jid": "j", "delay": 7, "progress_interval": 7})["delay"] == 7.0
    assert fw.wait_options({"jid": "j", "timeout": fw.MAX_SECONDS})["timeout"] == fw.MAX_SECONDS


@pytest.mark.parametrize("args,expected", [
    ({}, "jid is required"),
    ({"jid": None}, "jid is required"),
    ({"jid": ""}, "jid must be a non-empty string"),
    ({"jid": 123}, "jid must be a non-empty string"),
    ({"jid": "j", "progress_path": ""}, "progress_path must be a non-empty string"),
    ({"jid": "j", "progress_path": ["/a"]}, "progress_path must be a non-empty string"),
    ({"jid": "j", "label": 5}, "label must be a non-empty string"),
    ({"jid": "j", "dealy": 5}, "unsupported option(s) dealy; supported: jid,"),
    ({"jid": "j", "delay": "soon"}, "delay must be a number of seconds, not 'soon'"),
    ({"jid": "j", "delay": ""}, "delay must be a number of seconds, not ''"),
    ({"jid": "j", "delay": [5]}, "delay must be a number of seconds, not list"),
    ({"jid": "j", "delay": {"s": 5}}, "delay must be a number of seconds, not dict"),
    ({"jid": "j", "delay": True}, "delay must be a number of seconds, not bool"),
    ({"jid": "j", "delay": 0}, "delay must be > 0 seconds, not 0"),
    ({"jid": "j", "delay": 0.0}, "delay must be > 0 seconds, not 0.0"),
    ({"jid": "j", "delay": -5}, "delay must be > 0 seconds, not -5"),
    ({"jid": "j", "delay": "-0.5"}, "delay must be > 0 seconds, not '-0.5'"),
    ({"jid": "j", "delay": math.nan}, "delay must be a number of seconds, not NaN"),
    ({"jid": "j", "delay": "nan"}, "delay must be a number of seconds, not NaN"),
    ({"jid": "j", "progress_interval": math.inf}, "progress_interval must be at most 31622400 seconds (a year), not infinity"),
    ({"jid": "j", "timeout": "inf"}, "timeout must be at most 31622400 seconds (a year), not infinity"),
    ({"jid": "j", "timeout": -math.inf}, "timeout must be > 0 seconds"),
    ({"jid": "j", "timeout": 1e300}, "timeout must be at most 31622400 seconds (a year), not 1e+300"),
    ({"jid": "j", "timeout": 10 ** 400}, "timeout must be at most 31622400 seconds (a year), not infinity"),
    ({"jid": "j", "timeout": fw.MAX_SECONDS + 1}, "timeout must be at most 31622400 seconds"),
    ({"jid": "j", "timeout": 0}, "timeout must be > 0 seconds"),
    ({"jid": "j", "progress_interval": -60}, "progress_interval must be > 0 seconds"),
    ({"jid": "j", "delay": 10, "progress_interval": 5},
     "progress_interval (5 s) must be >= delay (10 s)"),
])
def test_bad_options_say_which_and_why(args, expected):
    with pytest.raises(fw.WaitOptionError) as exc:
        fw.wait_options(args)
    assert expected in str(exc.value), str(exc.value)


def test_bad_options_not_a_mapping():
    with pytest.raises(fw.WaitOptionError, match="must be a mapping, not list"):
        fw.wait_options(["jid"])


def test_the_documented_options_are_the_ones_checked():
    """plugins/modules/model_fetch_wait.py's argument_spec is ARGUMENT_SPEC (test_conventions.py
    compares it with DOCUMENTATION); wait_options answers for exactly those names."""
    assert set(fw.wait_options({"jid": "j"})) == set(fw.ARGUMENT_SPEC)
    text = (ROOT / "plugins" / "modules" / "model_fetch_wait.py").read_text()
    assert "AnsibleModule(argument_spec=ARGUMENT_SPEC" in text


# ---------------------------------------------------------------------------
# Real runs: ansible-playbook on localhost (connection local)
# ---------------------------------------------------------------------------

POLLS = 500  # looks at the job the long wait must survive (issue #31 item 9: at least 500)

# A job that writes progress.json now and then (as hf_model does), then waits until the
# test says it was looked at often enough, and ends with a line of its own.
JOB = r"""
import json, os, sys, time
progress, stop = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(progress), exist_ok=True)
n = 0
while not os.path.exists(stop):
    n += 1
    tmp = progress + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"files_done": min(n, 9), "files_total": 10, "bytes_verified": n << 20,
                   "bytes_total": 10 << 30, "bytes_downloaded": n << 21}, f)
    os.replace(tmp, progress)
    time.sleep(0.2)
print("job done after", n, "progress writes")
"""


def _play(tmp_path, playbook, *extra, on_line=None, callbacks=None, timeout=900):
    """Run `playbook` with the json callback (and the callback plugins of folder
    tmp_path/callbacks named in `callbacks`); call on_line(line) for each line printed
    before the report. Return (rc, the play's task results by name, the lines)."""
    pb = tmp_path / "play.yml"
    pb.write_text(playbook)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_CALLBACK_PLUGINS=str(tmp_path / "callbacks"),
               ANSIBLE_ASYNC_DIR=str(tmp_path / "async"), PYTHONUNBUFFERED="1")
    if callbacks:
        env["ANSIBLE_CALLBACKS_ENABLED"] = callbacks
    proc = subprocess.Popen(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={ROOT / '.venv/bin/python'}", str(pb), *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    lines, report = [], []
    try:
        for line in proc.stdout:
            if report or line.startswith("{"):
                report.append(line)
                continue
            lines.append(line.rstrip("\n"))
            if on_line:
                on_line(lines[-1])
        rc = proc.wait()
    finally:
        killer.cancel()
    assert report, "ansible-playbook printed no report:\n" + "\n".join(lines[-50:])
    data, _ = json.JSONDecoder().raw_decode("".join(report))
    results = {t["task"]["name"]: t["hosts"]["localhost"]
               for p in data["plays"] for t in p["tasks"]}
    return rc, results, lines


@pytest.mark.slow
def test_one_task_follows_a_job_through_hundreds_of_looks(tmp_path):
    """delay 0.01 s: the job ends only after the action has looked at it POLLS times (the
    action's -vv line per look tells the test, which then lets the job end); the action
    returns the job's own result, with polls >= POLLS and progress lines printed.
    Also: a failed job fails the task with the job's message; a job that outlives
    `timeout` fails it saying so; bad options fail with a message, no traceback."""
    dest = tmp_path / "model"
    stop = tmp_path / "stop"
    (tmp_path / "job.py").write_text(JOB)
    progress = dest / ".gpufleet" / "progress.json"
    seen = {}  # job id: the last look the action said it made

    def on_line(line):
        found = re.search(r"model_fetch_wait: \[localhost\] job (\S+) still running \(poll (\d+)\)", line)
        if found:
            seen[found.group(1)] = int(found.group(2))
            if seen[found.group(1)] >= POLLS + 20:
                stop.touch()  # only the long job waits for it

    rc, results, lines = _play(tmp_path, f"""
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Start the long job
      ansible.builtin.command:
        argv: ["{ROOT / '.venv/bin/python'}", "{tmp_path / 'job.py'}", "{progress}", "{stop}"]
      async: 900
      poll: 0
      register: long_job
    - name: Follow the long job
      gpufleet.fleet.model_fetch_wait:
        jid: "{{{{ long_job.ansible_job_id }}}}"
        progress_path: "{progress}"
        label: org/tiny
        delay: 0.01
        progress_interval: 2
        timeout: 800
      register: long_wait
    - name: Start a job that fails
      ansible.builtin.command: sh -c 'sleep 1; echo broken >&2; exit 3'
      async: 60
      poll: 0
      register: bad_job
    - name: Follow the job that fails
      gpufleet.fleet.model_fetch_wait:
        jid: "{{{{ bad_job.ansible_job_id }}}}"
        delay: 0.05
      ignore_errors: true
    - name: Start a job that outlives the wait
      ansible.builtin.command: sleep 8
      async: 15
      poll: 0
      register: slow_job
    - name: Follow the job that outlives the wait
      gpufleet.fleet.model_fetch_wait:
        jid: "{{{{ slow_job.ansible_job_id }}}}"
        delay: 0.2
        timeout: 1
      ignore_errors: true
    - name: Follow a job with a delay that is not a number
      gpufleet.fleet.model_fetch_wait:
        jid: "{{{{ slow_job.ansible_job_id }}}}"
        delay: soon
      ignore_errors: true
    - name: Follow a job with a NaN timeout
      gpufleet.fleet.model_fetch_wait:
        jid: "{{{{ slow_job.ansible_job_id }}}}"
        timeout: "{{{{ 'nan' | float }}}}"
      ignore_errors: true
""", "-vv", on_line=on_line)
    out = "\n".join(lines)
    assert rc == 0, out[-3000:]  # the failures below are ignored (and asserted on)

    long = results["Follow the long job"]
    assert not long.get("failed"), long
    assert long["polls"] >= POLLS, long["polls"]
    assert long["polls"] > seen[long["ansible_job_id"]] >= POLLS + 20
    assert long["finished"] is True and long["rc"] == 0 and long["changed"] is True
    assert re.fullmatch(r"job done after \d+ progress writes", long["stdout"]), long["stdout"]
    assert long["ansible_job_id"] == results["Start the long job"]["ansible_job_id"]
    reports = [ln for ln in lines if re.fullmatch(
        r"\[localhost\] org/tiny: [1-9]/10 files, \d+\.\d\d/10\.00 GiB verified "
        r"\(\d+\.\d\d GiB downloaded\)", ln)]
    assert long["reports"] == len(reports) >= 2, (long["reports"], len(reports))
    print(f"long wait: {long['polls']} polls, {long['reports']} progress reports")

    bad = results["Follow the job that fails"]
    assert bad["failed"] is True and bad["finished"] is True and bad["rc"] == 3
    assert bad["msg"] == "non-zero return code" and bad["stderr"] == "broken"
    assert bad["polls"] >= 2 and bad["reports"] == 0

    slow = results["Follow the job that outlives the wait"]
    assert slow["failed"] is True and slow["finished"] is False
    assert slow["msg"].startswith(f"model_fetch_wait: job {slow['ansible_job_id']} did not "
                                  "end within the timeout of 1 s"), slow["msg"]
    assert 2 <= slow["polls"] <= 10

    for name, expected in (("Follow a job with a delay that is not a number",
                            "model_fetch_wait: delay must be a number of seconds, not 'soon'."),
                           ("Follow a job with a NaN timeout",
                            "model_fetch_wait: timeout must be a number of seconds, not NaN.")):
        res = results[name]
        assert res["failed"] is True and res["msg"] == expected, res
        # ansible-core 2.19 gives every failed result this placeholder (ansible.builtin.fail's
        # too); a raised exception would carry its traceback here instead
        assert res.get("exception", "(traceback unavailable)") == "(traceback unavailable)", res
        assert res["polls"] == 0 and res["reports"] == 0
    assert "Traceback" not in out


# The task file the role used until model_fetch_wait replaced it (roles/model_fetch/tasks/
# wait.yml), kept here as it was: look at the job for model_fetch_progress_interval seconds,
# report, and include itself again while the job runs.
OLD_WAIT_YML = """\
---
- name: Model_fetch | Wait for the fetch of {{ __model_fetch_item.repo_id }}
  ansible.builtin.async_status:
    jid: "{{ __model_fetch_job.ansible_job_id }}"
  register: __model_fetch_status
  until: __model_fetch_status.finished or __model_fetch_status.attempts >= __model_fetch_looks
  retries: "{{ __model_fetch_looks }}"
  delay: "{{ _model_fetch_poll_delay }}"
  vars:
    __model_fetch_looks: "{{ (model_fetch_progress_interval | int / _model_fetch_poll_delay) | round(0, 'ceil') | int }}"

- name: Model_fetch | Read the progress of {{ __model_fetch_item.repo_id }}
  ansible.builtin.slurp:
    src: "{{ __model_fetch_item.dest }}/.gpufleet/progress.json"
  register: __model_fetch_progress
  failed_when: false
  when: not __model_fetch_status.finished

- name: Model_fetch | Report the progress of {{ __model_fetch_item.repo_id }}
  ansible.builtin.debug:
    msg: >-
      {{ __model_fetch_item.repo_id }}: {{ __p.files_done }}/{{ __p.files_total }} files,
      {{ '%.2f' | format(__p.bytes_verified / 2**30) }}/{{ '%.2f' | format(__p.bytes_total / 2**30) }} GiB
      verified ({{ '%.2f' | format(__p.bytes_downloaded / 2**30) }} GiB downloaded)
  vars:
    __p: "{{ __model_fetch_progress.content | b64decode | from_json }}"
  when: not __model_fetch_status.finished and 'content' in __model_fetch_progress

- name: Model_fetch | Keep following the fetch of {{ __model_fetch_item.repo_id }}
  ansible.builtin.include_tasks: wait.yml
  when: not __model_fetch_status.finished
"""

# A callback (main process) that measures, each time the old file's first task starts, how
# many include_tasks it sits in and how deep Python recurses to copy it (what ansible does
# to the tasks of every include: PlayIterator.add_tasks -> Block.copy -> parent.copy ...;
# the traceback of the old file's RecursionError is in these copies).
NESTING_CALLBACK = """
import sys

from ansible.playbook.task_include import TaskInclude
from ansible.plugins.callback import CallbackBase


def copy_frames(task):
    depth = [0, 0]

    def profile(frame, event, arg):
        if event == "call":
            depth[0] += 1
            depth[1] = max(depth[1], depth[0])
        elif event == "return":
            depth[0] -= 1

    sys.setprofile(profile)
    try:
        task.copy()
    finally:
        sys.setprofile(None)
    return depth[1]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "nesting"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_task_start(self, task, is_conditional):
        if not task.get_name().startswith("Model_fetch | Wait"):
            return
        includes, node = 0, task._parent
        while node is not None:
            includes += isinstance(node, TaskInclude)
            node = node._parent
        self._display.display(f"nesting: includes={includes} copy_frames={copy_frames(task)} "
                              f"limit={sys.getrecursionlimit()}")
"""

INTERVALS = 25  # intervals the old file is followed for: enough to see how it grows


@pytest.mark.slow
def test_control_the_old_self_including_file_nests_once_per_interval(tmp_path):
    """Control: the old wait.yml, followed for INTERVALS intervals (one look each, as with
    a fetch that outlasts model_fetch_progress_interval), is one include deeper at every
    interval, and the Python stack ansible needs to copy its tasks grows by the same number
    of frames each time, so it runs out of the default recursion limit after a few hundred
    intervals (a full run on this machine: RecursionError at the 246th, after 3 min 12 s),
    long before the POLLS looks model_fetch_wait survives (the test above) and the day a
    fetch may take (model_fetch_async_timeout)."""
    dest = tmp_path / "model"
    stop = tmp_path / "stop"
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "wait.yml").write_text(OLD_WAIT_YML)
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "callbacks" / "nesting.py").write_text(NESTING_CALLBACK)
    seen = []

    def on_line(line):
        found = re.fullmatch(r"nesting: includes=(\d+) copy_frames=(\d+) limit=(\d+)", line)
        if found:
            seen.append(tuple(map(int, found.groups())))
            if len(seen) >= INTERVALS:
                stop.touch()

    rc, results, lines = _play(tmp_path, f"""
- hosts: localhost
  gather_facts: false
  vars:
    __model_fetch_item: {{repo_id: org/tiny, dest: "{dest}"}}
    model_fetch_progress_interval: 1
    _model_fetch_poll_delay: 1
  tasks:
    - name: Start the job
      ansible.builtin.command:
        argv: ["{ROOT / '.venv/bin/python'}", "{tmp_path / 'job.py'}", "{dest / '.gpufleet/progress.json'}", "{stop}"]
      async: 600
      poll: 0
      register: __model_fetch_job
    - name: Follow the job with the old task file
      ansible.builtin.include_tasks: wait.yml
""", on_line=on_line, callbacks="nesting")
    out = "\n".join(lines)
    assert rc == 0, out[-3000:]
    assert len(seen) >= INTERVALS, out[-3000:]
    includes = [s[0] for s in seen]
    frames = [s[1] for s in seen]
    limit = seen[0][2]
    # one include deeper per interval
    assert includes == list(range(1, len(seen) + 1)), includes
    # the same number of frames more per interval
    steps = {b - a for a, b in zip(frames, frames[1:])}
    assert len(steps) == 1 and steps.pop() > 0, frames
    step = frames[1] - frames[0]
    # the interval whose copy alone needs more frames than the recursion limit allows
    dies_by = 1 + math.ceil((limit - frames[0]) / step)
    assert dies_by < POLLS, (dies_by, frames)
    print(f"old file: {step} more frames per interval ({frames[0]} at the first); the copy "
          f"alone passes the recursion limit of {limit} at interval {dies_by}")
