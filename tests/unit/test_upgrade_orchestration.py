"""playbooks/upgrade.yml's batch mechanics with real Ansible (issue #31 item 4).

The REAL playbook (its play keywords: serial from the plan, max_fail_percentage), the
REAL fleet_upgrade role (batches, gates, change, rollback, the kept stop message) and the
REAL filters run on local hosts. Only the role's collaborators are STAND-INS, written by
this test into a temporary folder: the preflight, model_fetch, vllm_server and
vllm_gateway roles and the vllm_record, vllm_probe and vllm_gateway_stats modules. Each
stand-in says one line per call (a debug task: "STANDIN-EVENT HOST EVENT", read back from
the run's output, so it costs the control node no module run), and fails where the
inventory tells it to (a compatibility refusal, a failing probe gate). The lab tests run
the same playbook against real vLLM and HAProxy; this file proves the control flow for
batches of several hosts, which the lab's one-host batches never reach.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]

# About 20 ansible-playbook runs, 3-4 minutes on this 2-core machine: scripts/test.sh runs
# them beside Molecule (they need no docker).
pytestmark = pytest.mark.slow

# --- stand-ins ------------------------------------------------------------------------------
def _log(event, name=None):
    return {"name": name or f"Stand-in | {event}",
            "ansible.builtin.debug": {"msg": f"STANDIN-EVENT {{{{ inventory_hostname }}}} {event}"}}


_EVENT = re.compile(r'"msg": "STANDIN-EVENT (\S+) ([^"]+)"')


STANDIN_ROLES = {
    "preflight/tasks/main.yml": [
        _log("compat"),
        {"name": "Stand-in | GPU facts (driver 580, the branch asked for: no driver change)",
         "standin_gpu_facts": {}},
        {"name": "Stand-in | Refuse where told",
         "ansible.builtin.fail": {"msg": "driver 535 supports CUDA 12.2 only"},
         "when": "inventory_hostname in standin_compat_refuse"},
    ],
    "model_fetch/tasks/main.yml": [_log("fetch")],
    "vllm_server/tasks/plan.yml": [
        {"name": "Stand-in | Plan",
         "ansible.builtin.set_fact": {"vllm_server_plan": {
             "instances": "{{ [] if inventory_hostname in standin_serves_nothing else "
                          "[{'name': 'chat', 'action': 'keep' if inventory_hostname in standin_keep "
                          "or (standin_applied ~ '/' ~ inventory_hostname) is exists else 'replace', 'url': 'http://' ~ inventory_hostname ~ '.invalid:8000/', "
                          "'served_model_name': 'chat', 'runner': 'generate'}] }}",
             "remove": []}}},
    ],
    # what apply changed stays changed: the next plan of the host says keep
    "vllm_server/tasks/apply.yml": [
        _log("apply"),
        {"name": "Stand-in | Remember the host runs the new containers",
         "ansible.builtin.shell": "touch {{ standin_applied }}/{{ inventory_hostname }}",
         "changed_when": False},
        {"name": "Stand-in | Kill the controller",
         "ansible.builtin.shell": "kill -KILL $(cat {{ standin_kill_pidfile }})",
         "changed_when": False,
         "when": "inventory_hostname ~ ' apply' == standin_kill_at"},
        # the host becomes unreachable (SSH to a port nothing listens on) from the next task
        {"name": "Stand-in | Lose the host",
         "ansible.builtin.set_fact": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1",
                                      "ansible_port": 9, "ansible_ssh_common_args": "-o ConnectTimeout=2"},
         "when": "inventory_hostname ~ ' apply' == standin_lose_at"},
    ],
    "vllm_server/tasks/record.yml": [_log("record")],
    "vllm_server/tasks/main.yml": [_log("rollback-deploy")],
    "vllm_gateway/tasks/server_state.yml": [
        _log("{{ vllm_gateway_server_state }}"),
        # the controller dies (SIGKILL) right after this host's drain, where the test says
        {"name": "Stand-in | Kill the controller",
         "ansible.builtin.shell": "kill -KILL $(cat {{ standin_kill_pidfile }})",
         "changed_when": False,
         "when": "inventory_hostname ~ ' ' ~ vllm_gateway_server_state == standin_kill_at"},
    ],
    "vllm_gateway/tasks/main.yml": [_log("gateway-config")],
    # the keys play before the first batch (a key rotation: docs/security.md)
    "vllm_gateway/tasks/keys.yml": [_log("gateway-keys-{{ vllm_gateway_keys_kept_only }}")],
}

# The stand-in modules read the test's settings from a JSON file; the probe knows its host
# by the URL the stand-in plan gives each host's instance.
STANDIN_MODULE = """#!/usr/bin/python
import json
from ansible.module_utils.basic import AnsibleModule

OPTIONS = %(options)r
CONFIG = json.load(open(%(config)r))


def main():
    module = AnsibleModule(argument_spec={k: {"type": "raw"} for k in OPTIONS},
                           supports_check_mode=True)
    p = module.params
%(body)s


main()
"""

MODULES = {
    # every server of the fleet UP, so the capacity gate lets each host go
    "vllm_gateway_stats": (["socket", "server_host", "watch_seconds"], """
    module.exit_json(changed=False, servers=[
        {"backend": "chat", "server": h + "_8000", "host": h, "status": "UP"}
        for h in CONFIG["hosts"]], host_servers=[], deltas=[], bad_statuses=[])
"""),
    "standin_gpu_facts": ([], """
    module.exit_json(changed=False, ansible_facts={"gpu": {"driver_version": "580.95.05"}})
"""),
    # the record's image is gone on the hosts the test names (its path ends in HOST.json)
    "vllm_record": (["path", "state", "record", "check_image"], """
    host = p["path"].rsplit("/", 1)[-1].split(".")[0]
    gone = host in CONFIG["image_gone"]
    module.exit_json(changed=False, image_present=not gone,
                     problem="its last-good record names the image vllm:old, which is no longer on the host" if gone else "",
                     record={
        "version": 1, "image_ref": "vllm:old", "image_id": "sha256:01d", "driver_version": "",
        "inputs": {"vllm_server_image": "sha256:01d", "vllm_server_vllm_version": "0.32.0",
                   "vllm_server_models": [], "vllm_server_port": 8000},
        "models": [], "instances": []})
"""),
    # the probe gate (after the change: no wait_idle) fails on the hosts the test names
    "vllm_probe": (["url", "api_key", "served_model_name", "runner", "wait_idle", "idle_timeout",
                    "requests", "max_tokens", "baseline", "max_latency_ratio",
                    "max_latency_increase_ms", "max_error_rate", "attempts"], """
    host = p["url"].split("//")[1].split(".")[0]
    if not p["wait_idle"] and host in CONFIG["probe_fail"]:
        module.fail_json(msg="p95 latency 900 ms against 100 ms before (9.0x, limit 2.0x)")
    module.exit_json(changed=False, probe={"p95_ms": 100})
"""),
}


def _fleet(tmp_path, hosts, serves_nothing=(), compat_refuse=(), probe_fail=(), keep=(),
           fraction=0.5, play_keywords=None, kill_at="", image_gone=(), lose_at=""):
    """Write the stand-ins, the fleet's instance list and the inventory; return a
    function that runs upgrade.yml (extra arguments are ansible-playbook's) and returns
    (rc, output, events). The rollout state and lock are real (library/rollout_state.py,
    rollout_lock.py) under tmp_path: state/<host>.json and rollout.lock."""
    roles = tmp_path / "roles"
    for rel, tasks in STANDIN_ROLES.items():
        path = roles / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(tasks, sort_keys=False))
    library = tmp_path / "library"
    library.mkdir()
    config = tmp_path / "standin.json"
    config.write_text(json.dumps({"hosts": list(hosts), "probe_fail": list(probe_fail),
                                  "image_gone": list(image_gone)}))
    for name, (options, body) in MODULES.items():
        (library / f"{name}.py").write_text(STANDIN_MODULE % {
            "options": options, "config": str(config), "body": body.strip("\n")})
    instances = [{"targets": [f"{h}:8000"], "labels": {"host": h, "served_model_name": "chat"}}
                 for h in hosts if h not in serves_nothing]
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    events = []  # every run's stand-in events, in the order the runs finished
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "applied").mkdir()
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "ansible_become": False}
    inventory = {"all": {
        "vars": {"standin_serves_nothing": list(serves_nothing),
                 "standin_compat_refuse": list(compat_refuse), "standin_keep": list(keep),
                 "standin_kill_at": kill_at, "standin_lose_at": lose_at, "standin_applied": str(tmp_path / "applied"), "standin_kill_pidfile": str(tmp_path / "controller.pid"),
                 "vllm_server_file_sd_path": str(tmp_path / "instances.json"),
                 "vllm_server_api_key": "stand-in-key", "vllm_server_record_path": str(tmp_path / "{{ inventory_hostname }}.json"),
                 "vllm_server_image": "sha256:01d", "vllm_server_vllm_version": "0.32.0",
                 "vllm_server_models": [], "vllm_server_port": 8000,
                 "fleet_upgrade_soak_seconds": 0, "fleet_upgrade_capacity_wait": 0,
                 "fleet_upgrade_max_unavailable_fraction": fraction,
                 "fleet_upgrade_state_path": str(tmp_path / "state" / "{{ inventory_hostname }}.json"),
                 "fleet_upgrade_lock_path": str(tmp_path / "rollout.lock")},
        "children": {"gpu_hosts": {"hosts": {h: dict(local) for h in hosts}},
                     "gateways": {"hosts": {"gw": dict(local)}}}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    playbook = ROOT / "playbooks" / "upgrade.yml"
    playbook_text = None
    if play_keywords:  # a control: the same playbook with other keywords on the batch play
        plays = yaml.safe_load(playbook.read_text())
        batch_play, = [p for p in plays if p["name"] == "Upgrade | Roll each batch"]
        batch_play.update(play_keywords)
        # in this test's folder, never the checkout's playbooks/: a file there changes the
        # code digest of site.yml's state check for a lab run beside this test (CI stop 38)
        playbook = tmp_path / "upgrade-control.yml"
        playbook_text = yaml.safe_dump(plays, sort_keys=False)
    env = dict(os.environ, ANSIBLE_ROLES_PATH=f"{roles}:{ROOT / 'roles'}",
               ANSIBLE_LIBRARY=f"{library}:{ROOT / 'library'}",
               ANSIBLE_MODULE_UTILS=str(ROOT / "module_utils"),
               ANSIBLE_FILTER_PLUGINS=str(ROOT / "plugins" / "filter"),
               ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOWS="1",
               ANSIBLE_FORKS="10", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               # the stand-ins read no fact but the GPU's: the play's fact gathering stays minimal
               ANSIBLE_GATHER_SUBSET="!all,!min",
               # a killed run's output up to the kill holds its events
               PYTHONUNBUFFERED="1")

    def start(*args):
        """Start upgrade.yml; returns the process (its pid is where the kill hook looks)."""
        if playbook_text is not None:
            playbook.write_text(playbook_text)
        proc = subprocess.Popen([str(ROOT / ".venv/bin/ansible-playbook"), "-i",
                                 str(tmp_path / "inventory.yml"), str(playbook), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        (tmp_path / "controller.pid").write_text(str(proc.pid))
        return proc

    def finish(proc):
        out, _ = proc.communicate(timeout=300)
        events.extend(_EVENT.findall(out))
        return proc.returncode, out, events_so_far()

    def events_so_far():
        return list(events)

    def run(*args):
        return finish(start(*args))
    run.start, run.finish, run.events = start, finish, events_so_far
    return run


def _state(tmp_path, host):
    path = tmp_path / "state" / f"{host}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _recap(output):
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"^(\S+)\s+:\s+ok=\d+.*?failed=(\d+)", output, re.M)}


def _of(events, host):
    return [e for h, e in events if h == host]


HOSTS = ["h1", "h2", "h3", "h4", "h5"]


def _check_gate_failure_in_a_two_host_batch(rc, out, events):
    """h2's probe gate fails in the batch [h2, h3]: h2 rolled back and back in service,
    h3 finished and back in service, the later batch untouched, the stop message printed,
    exit 2 and a recap that says which host failed."""
    assert "1. h1 (canary); 2. h2, h3; 3. h4, h5" in out, out
    assert _of(events, "h1") == ["compat", "disabled", "apply", "enabled", "record"], events
    assert _of(events, "h2") == ["compat", "disabled", "apply", "rollback-deploy", "enabled"], events
    assert _of(events, "h3") == ["compat", "disabled", "apply", "enabled", "record"], events
    assert _of(events, "h4") == [] and _of(events, "h5") == [], events
    assert 'UPGRADE STOPPED at h2: the gate "Probe gate (after, compared with before)" failed' in out, out
    assert "p95 latency 900 ms" in out
    assert "rolled back to its last good state" in out
    assert rc == 2, out
    # h4 and h5 only planned (the first play); the gateway play at the end did not run
    # (gw ran only the keys play before the first batch: its recap says ok, not failed)
    assert _recap(out) == {"h1": 0, "h2": 1, "h3": 0, "h4": 0, "h5": 0, "gw": 0}, out
    assert _of(events, "gw") == ["gateway-keys-True"], events


def test_a_gate_failure_in_a_two_host_batch_rolls_back_that_host_and_finishes_the_other(tmp_path):
    run = _fleet(tmp_path, HOSTS, probe_fail=["h2"])
    _check_gate_failure_in_a_two_host_batch(*run())


def test_control_the_old_play_keywords_strand_the_batch(tmp_path):
    """Control: upgrade.yml's former any_errors_fatal fails the check above (h2's rollback
    is cut short and h3 is failed into its own rescue or out of the play)."""
    run = _fleet(tmp_path, HOSTS, probe_fail=["h2"], play_keywords={"any_errors_fatal": True})
    rc, out, events = run()
    with pytest.raises(AssertionError):
        _check_gate_failure_in_a_two_host_batch(rc, out, events)
    # what the old shape did: h2 was never re-enabled, or h3 was never recorded
    assert "enabled" not in _of(events, "h2") or "record" not in _of(events, "h3"), events


def _check_refused_idle_host_shares_a_batch(rc, out, events):
    """h4 serves nothing and the compatibility gate refuses it, in a batch with serving
    hosts: it is left out, said so, and the others of its batch roll on; exit 0."""
    batch = re.search(r"\d+\. ([^;]*h4[^;]*)", out)
    assert batch and len(batch.group(1).split(", ")) >= 2, out
    assert "h4 serves nothing and the compatibility gate refused it" in out, out
    assert _of(events, "h4") == ["compat"], events
    for host in ("h1", "h2", "h3"):
        assert _of(events, host)[-2:] == ["enabled", "record"], (host, events)
    assert "UPGRADE STOPPED" not in out, out
    assert rc == 0, out


def test_a_refused_host_serving_nothing_shares_a_batch_with_serving_ones(tmp_path):
    run = _fleet(tmp_path, HOSTS[:4], serves_nothing=["h4"], compat_refuse=["h4"], fraction=1.0)
    _check_refused_idle_host_shares_a_batch(*run())


def test_control_the_old_play_keywords_stop_the_compatible_hosts(tmp_path):
    """Control: with any_errors_fatal the compatible hosts of h4's batch were stopped with
    the compatibility message and an empty reason (the README run of issue #31)."""
    run = _fleet(tmp_path, HOSTS[:4], serves_nothing=["h4"], compat_refuse=["h4"], fraction=1.0,
                 play_keywords={"any_errors_fatal": True})
    rc, out, events = run()
    with pytest.raises(AssertionError):
        _check_refused_idle_host_shares_a_batch(rc, out, events)
    assert rc != 0


# --- one rollout at a time (#31 item 3; a held lock and its take-over: the kill test below) -----
def test_a_limited_run_releases_its_lock(tmp_path):
    """As the lab and the README's --limit runs do: the lock is released at the end."""
    run = _fleet(tmp_path, HOSTS[:3])
    rc, out, events = run("--limit", "h1,h2")
    assert rc == 0, out
    assert _of(events, "h3") == [] and _of(events, "h2")[-1] == "record", events
    assert not (tmp_path / "rollout.lock").exists(), out


def test_the_gateway_keeps_only_the_kept_keys_before_the_first_drain(tmp_path):
    """A key rotation (#31 item 5, docs/security.md): in a run that holds the lock, the
    gateway's keys are narrowed before the first drain and written in full at the end."""
    run = _fleet(tmp_path, HOSTS[:2])
    rc, out, events = run()
    assert rc == 0, out
    assert _of(events, "gw") == ["gateway-keys-True", "gateway-config"], events
    assert events.index(("gw", "gateway-keys-True")) < events.index(("h1", "disabled")), events


def test_two_runs_started_at_once_one_runs_and_the_other_is_refused(tmp_path):
    run = _fleet(tmp_path, HOSTS[:3])
    first, second = run.start(), run.start()
    results = [run.finish(first), run.finish(second)]
    codes = sorted(rc for rc, _, _ in results)
    assert codes[0] == 0 and codes[1] != 0, [out for _, out, _ in results]
    refused = next(out for rc, out, _ in results if rc != 0)
    assert "another rollout holds the fleet" in refused, refused
    events = run.events()
    # each host was drained once, by the run that held the lock
    assert all(_of(events, h).count("disabled") == 1 for h in HOSTS[:3]), events
    # the refused run did not touch the gateway's keys: only the lock holder did
    assert _of(events, "gw").count("gateway-keys-True") == 1, events
    assert not (tmp_path / "rollout.lock").exists()


# --- a controller that dies mid-change (#31 items 1 and 2) ------------------------------------
@pytest.mark.parametrize("kill_at, left_at", [("h2 disabled", "draining"), ("h2 apply", "out_of_service")],
                         ids=["after-drain", "during-apply"])
def test_a_controller_killed_mid_change_is_resumed_by_the_next_run(tmp_path, kill_at, left_at):
    run = _fleet(tmp_path, HOSTS, kill_at=kill_at)
    rc, out, events = run()
    assert rc == -9, out  # SIGKILL
    assert _state(tmp_path, "h1")["step"] == "recorded"
    left = _state(tmp_path, "h2")
    assert left["step"] == left_at, left
    mode = (tmp_path / "state" / "h2.json").stat().st_mode & 0o777
    assert mode == 0o600, oct(mode)
    dead = json.loads((tmp_path / "rollout.lock").read_text())
    assert dead["rollout"] == left["rollout"]
    assert dead["holder"] and dead["scope"] == HOSTS and dead["started"]
    if kill_at == "h2 disabled":
        # the next run is refused by the dead run's lock, says who held it and how to take it
        # over, and a wrong id does not break it (nothing is drained meanwhile)
        rc, out, refused = run("-e", "standin_kill_at=")
        assert rc != 0 and (f"another rollout holds the fleet: rollout {dead['rollout']} by "
                            f"{dead['holder']}, started {dead['started']}, on h1, h2, h3, h4, h5") in out, out
        assert f"-e fleet_upgrade_break_lock={dead['rollout']}" in out, out
        rc, out, refused = run("-e", "standin_kill_at=", "-e", "fleet_upgrade_break_lock=19700101T000000Z-1")
        assert rc != 0 and "name that id to break it" in out, out
        assert refused == events, "a refused run drains nothing"
        assert json.loads((tmp_path / "rollout.lock").read_text()) == dead
    rc, out, _ = run("-e", "standin_kill_at=", "-e", f"fleet_upgrade_break_lock={dead['rollout']}")
    assert rc == 0, out
    assert f"taken over from rollout {dead['rollout']} of {dead['holder']}" in out, out
    assert f"h2 is held by rollout {dead['rollout']}: it was left at step '{left_at}'" in out, out
    plan = re.search(r"\d+ batches: 1\. (\S+) \(canary\)", out)
    assert plan and plan.group(1) in ("h2", "h3"), out  # a held host first
    assert f"resume rollout {dead['rollout']} (left at {left_at}" in out, out
    for host in HOSTS:
        assert _state(tmp_path, host).get("step") == "recorded", (host, _state(tmp_path, host))
    after_kill = run.events()[len(events):]
    assert _of(after_kill, "h2")[-2:] == ["enabled", "record"], after_kill
    assert not (tmp_path / "rollout.lock").exists()


def test_a_host_lost_mid_change_is_named_and_ends_the_rollout_after_its_batch(tmp_path):
    """SSH to h2 is lost during its apply, in the batch [h2, h3]: h3 finishes, the run names
    h2 with the last step written on it, the later batch [h4, h5] is untouched, the lock is
    released; the next run (h2 reachable again) resumes h2 first."""
    run = _fleet(tmp_path, HOSTS, lose_at="h2 apply")
    rc, out, events = run()
    assert rc != 0, out
    assert ("UPGRADE STOPPED after this batch: h2 became unreachable mid-change in rollout "
            in out and "the last step this run wrote on it: out_of_service" in out), out
    assert _of(events, "h3")[-2:] == ["enabled", "record"], events
    assert _of(events, "h4") == [] and _of(events, "h5") == [], events
    assert _state(tmp_path, "h2")["step"] == "out_of_service"
    assert not (tmp_path / "rollout.lock").exists(), out
    rc, out, _ = run("-e", "standin_lose_at=")
    assert rc == 0, out
    assert "resume rollout" in out and re.search(r"1\. h2 \(canary\)", out), out
    assert all(_state(tmp_path, h)["step"] == "recorded" for h in HOSTS)


def test_control_without_the_state_a_rerun_leaves_the_applied_host_drained(tmp_path):
    """Control: the same kill during h2's apply, then a rerun that cannot see the state
    (the state file removed, as before this change): h2's plan says keep, so the rerun
    never re-enables it (the issue's report)."""
    run = _fleet(tmp_path, HOSTS, kill_at="h2 apply")
    rc, _, events = run()
    assert rc == -9
    (tmp_path / "state" / "h2.json").unlink()
    (tmp_path / "state" / "h3.json").unlink()
    dead = json.loads((tmp_path / "rollout.lock").read_text())
    rc, out, _ = run("-e", "standin_kill_at=", "-e", f"fleet_upgrade_break_lock={dead['rollout']}")
    after_kill = run.events()[len(events):]
    assert "enabled" not in _of(after_kill, "h2"), after_kill
    assert "h2 (batch" in out and "nothing to change" in out


# --- the way back is checked before the drain (#31 item 7) ------------------------------------
def test_a_host_whose_record_names_an_image_gone_is_refused_before_the_drain(tmp_path):
    run = _fleet(tmp_path, HOSTS[:3], image_gone=["h1"])
    rc, out, events = run()
    assert rc == 2, out
    assert _of(events, "h1") == ["compat"], events  # never drained
    assert ("UPGRADE STOPPED at h1, nothing was changed (it still serves): its last-good record "
            "names the image vllm:old, which is no longer on the host") in out, out
    assert _of(events, "h2") == [] and _state(tmp_path, "h1") == {}
    assert not (tmp_path / "rollout.lock").exists(), "a stopped rollout releases the lock"


def test_control_with_downtime_allowed_the_same_host_is_changed(tmp_path):
    run = _fleet(tmp_path, HOSTS[:3], image_gone=["h1"])
    rc, out, events = run("-e", "fleet_upgrade_allow_downtime=true")
    assert rc == 0, out
    assert "no way back (its last-good record names the image vllm:old" in out
    assert _of(events, "h1") == ["compat", "disabled", "apply", "enabled", "record"], events
