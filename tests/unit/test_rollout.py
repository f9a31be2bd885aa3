"""plugins/module_utils/gpufleet/rollout.py and its modules (plugins/modules/rollout_state.py,
rollout_lock.py), and site.yml's refusal of a host a rollout left mid-change (#31)."""
import json
import multiprocessing
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from gpufleet import rollout
from helpers import run_module

ROOT = pathlib.Path(__file__).resolve().parents[2]
import rollout_lock  # noqa: E402
import rollout_state  # noqa: E402


def test_a_state_is_held_until_the_change_ends(tmp_path):
    path = str(tmp_path / "s.json")
    assert rollout.read_state(path) == {}
    state = None
    for step in rollout.STEPS:
        state = rollout.write_state(path, "r-1", step, now=0, before=state)
        rollout.save_state(path, state)
        assert rollout.read_state(path)["held"] == (step not in ("recorded", "rolled_back")), step
    assert [s for _, s, _ in state["history"]] == list(rollout.STEPS)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def test_the_history_is_capped(tmp_path):
    state = None
    for i in range(rollout.HISTORY_LIMIT + 20):
        state = rollout.write_state("x", f"r-{i}", "draining", before=state)
    assert len(state["history"]) == rollout.HISTORY_LIMIT
    assert state["history"][-1][0] == f"r-{rollout.HISTORY_LIMIT + 19}"


@pytest.mark.parametrize("rollout_id", ["", "a b", "x\nbackend evil", "-r", "a" * 129, None, 7])
def test_bad_rollout_ids_are_refused(tmp_path, rollout_id):
    with pytest.raises(rollout.RolloutError, match="rollout id"):
        rollout.write_state(str(tmp_path / "s"), rollout_id, "draining")
    with pytest.raises(rollout.RolloutError, match="rollout id"):
        rollout.take_lock(str(tmp_path / "l"), rollout_id, "me@here", [])


def test_an_unknown_step_on_disk_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"rollout": "r", "step": "halfway"}))
    with pytest.raises(rollout.RolloutError, match="unknown step 'halfway'.*move it aside"):
        rollout.read_state(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read"):
        rollout.read_state(str(path))


def test_the_lock_refuses_a_second_rollout_and_is_broken_only_by_its_id(tmp_path):
    path = str(tmp_path / "lock")
    first = rollout.take_lock(path, "r-1", "alice@ctl", ["h1", "h2"], now=0)
    assert first["changed"] and oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert rollout.take_lock(path, "r-1", "alice@ctl", ["h1"])["changed"] is False
    with pytest.raises(rollout.RolloutError) as exc:
        rollout.take_lock(path, "r-2", "bob@ctl", ["h3"])
    assert ("another rollout holds the fleet: rollout r-1 by alice@ctl, started "
            "1970-01-01T00:00:00Z, on h1, h2") in str(exc.value)
    assert "-e fleet_upgrade_break_lock=r-1" in str(exc.value)
    with pytest.raises(rollout.RolloutError, match="name that id"):
        rollout.take_lock(path, "r-2", "bob@ctl", ["h3"], break_lock="r-9")
    taken = rollout.take_lock(path, "r-2", "bob@ctl", ["h3"], break_lock="r-1")
    assert taken["broken"]["rollout"] == "r-1" and rollout.read_lock(path)["holder"] == "bob@ctl"
    # another rollout's lock is left alone by a release
    assert rollout.release_lock(path, "r-1")["changed"] is False and os.path.exists(path)
    assert rollout.release_lock(path, "r-2")["changed"] and not os.path.exists(path)
    assert rollout.release_lock(path, "r-2")["changed"] is False


def _take(args):
    path, rid = args
    try:
        rollout.take_lock(path, rid, "racer@ctl", [])
        return rid
    except rollout.RolloutError:
        return None


def test_of_many_runs_taking_the_lock_at_once_exactly_one_gets_it(tmp_path):
    path = str(tmp_path / "lock")
    with multiprocessing.Pool(8) as pool:
        winners = [w for w in pool.map(_take, [(path, f"r-{i}") for i in range(32)]) if w]
    assert len(winners) == 1 and rollout.read_lock(path)["rollout"] == winners[0]


def test_the_long_scope_is_shortened_in_the_message():
    msg = rollout.lock_message({"rollout": "r", "holder": "h", "started": "t",
                                "scope": [f"gpu-{i:03d}" for i in range(250)]})
    assert "gpu-009 and 240 more" in msg


def test_held_hosts_come_from_the_reads_in_host_order():
    reads = [{"held": False, "rollout_state": {}},
             {"held": True, "rollout_state": {"rollout": "r", "step": "applied", "at": "t"}},
             {"skipped": True}]
    held = rollout.held_hosts(["a", "b", "c"], reads)
    assert held == {"b": {"rollout": "r", "step": "applied", "at": "t"}}
    assert rollout.held_messages(held) == [
        rollout.held_message("b", held["b"])]
    assert "b is held by rollout r: it was left at step 'applied' at t" in rollout.held_messages(held)[0]


def test_rollout_state_module_check_mode_and_diff(tmp_path, monkeypatch):
    path = str(tmp_path / "s.json")
    args = {"path": path, "rollout": "r-1", "step": "draining", "_ansible_diff": True}
    result, failed = run_module(rollout_state.main, args, monkeypatch, check_mode=True)
    assert not failed and result["changed"] and not os.path.exists(path)
    assert result["diff"] == {"before": "- -\n", "after": "r-1 draining\n"}
    result, _ = run_module(rollout_state.main, args, monkeypatch)
    assert result["changed"] and result["held"] and os.path.exists(path)
    result, _ = run_module(rollout_state.main, args, monkeypatch)
    assert not result["changed"]
    result, _ = run_module(rollout_state.main, {"path": path, "state": "read"}, monkeypatch)
    assert result["held"] and result["rollout_state"]["step"] == "draining"
    result, failed = run_module(rollout_state.main, {"path": path, "rollout": "r-1"}, monkeypatch)
    assert failed and "needs rollout and step" in result["msg"]


def test_rollout_lock_module(tmp_path, monkeypatch):
    path = str(tmp_path / "lock")
    take = {"path": path, "rollout": "r-1", "holder": "alice@ctl", "scope": ["h1"]}
    result, failed = run_module(rollout_lock.main, take, monkeypatch, check_mode=True)
    assert not failed and result["changed"] and not os.path.exists(path)
    result, failed = run_module(rollout_lock.main, take, monkeypatch)
    assert not failed and result["msg"] == "rollout r-1 holds the lock"
    result, failed = run_module(rollout_lock.main, dict(take, rollout="r-2"), monkeypatch)
    assert failed and "another rollout holds the fleet: rollout r-1 by alice@ctl" in result["msg"]
    result, _ = run_module(rollout_lock.main, {"path": path, "state": "read"}, monkeypatch)
    assert result["lock"]["rollout"] == "r-1" and "r-1" in result["msg"]
    result, _ = run_module(rollout_lock.main, {"path": path, "state": "absent", "rollout": "r-1"},
                           monkeypatch)
    assert result["changed"] and not os.path.exists(path)


# --- site.yml refuses a host a rollout holds --------------------------------------------------
def _site_state_play(tmp_path, state):
    """The real playbooks/tasks/refuse-held.yml, as site.yml's state play runs it when the
    state check did not run, on a local host whose rollout state is `state`."""
    path = tmp_path / "rollout-state.json"
    if state:
        path.write_text(json.dumps(state))
    play = [{"hosts": "all", "gather_facts": False,
             "vars": {"fleet_upgrade_state_path": str(path), "__gpufleet_state": {"skipped": True}},
             "tasks": [{"ansible.builtin.import_tasks": str(ROOT / "playbooks/tasks/refuse-held.yml")},
                       {"name": "Later play | would touch the host", "ansible.builtin.debug": {"msg": "TOUCHED"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", "gpu-7,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_site_refuses_a_host_a_rollout_left_mid_change(tmp_path):
    rc, out = _site_state_play(tmp_path, {"version": 1, "rollout": "r-9", "step": "applied",
                                          "at": "2026-12-06T01:00:00Z", "history": []})
    assert rc == 2 and "TOUCHED" not in out, out
    assert ("gpu-7 is held by rollout r-9: it was left at step 'applied' at 2026-12-06T01:00:00Z"
            in out), out
    assert "Run playbooks/upgrade.yml again" in out


@pytest.mark.parametrize("state", [None, {"version": 1, "rollout": "r-9", "step": "recorded",
                                          "at": "t", "history": []}], ids=["never", "finished"])
def test_control_site_touches_a_host_no_rollout_holds(tmp_path, state):
    rc, out = _site_state_play(tmp_path, state)
    assert rc == 0 and "TOUCHED" in out, out


def test_a_lost_host_is_named_with_the_last_step_written_on_it():
    def wrote(step, n):
        return {"changed": True, "rollout_state": {"step": step, "history": [["r", "x", "t"]] * n}}
    hostvars = {
        "a": {},
        # lost at the write of 'applied': its unreachable result hides nothing
        "b": {"__fleet_upgrade_step_draining": wrote("draining", 1),
              "__fleet_upgrade_step_out_of_service": wrote("out_of_service", 2),
              "__fleet_upgrade_step_applied": {"unreachable": True, "msg": "ssh: connect refused"}},
        "c": {"__fleet_upgrade_left_out": True},  # left out on purpose, not lost
        "d": {},  # lost before its drain
    }
    report = rollout.lost_report([["x"], ["a", "b", "c", "d"]], "a", ["a"], hostvars, "r-1")
    assert len(report) == 2
    assert "b became unreachable mid-change in rollout r-1; the last step this run wrote on it: out_of_service" in report[0]
    assert "d became unreachable" in report[1] and "none yet (it was not drained)" in report[1]
    assert rollout.lost_report([["a", "b"]], "a", ["a", "b"], hostvars, "r-1") == []


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602], ids=oct)
def test_state_and_lock_files_others_may_write_are_refused(tmp_path, mode):
    """#32 item 6: another user could hold or free a host, or take the lock."""
    for name, read in (("s.json", rollout.read_state), ("lock", rollout.read_lock)):
        path = tmp_path / name
        path.write_text(json.dumps({"version": 1, "rollout": "r", "step": "recorded", "at": "t",
                                    "history": []}))
        path.chmod(mode)
        with pytest.raises(ValueError, match="writable|write"):
            read(str(path))
        path.chmod(0o600)  # control: the same file, private
        assert read(str(path))["rollout"] == "r"


def test_host_keys_are_checked_except_in_the_lab():
    """#32 item 7: ansible.cfg checks SSH host keys; only the lab's inventory opts out, and
    no other inventory or group_vars file turns it off."""
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert cfg.getboolean("defaults", "host_key_checking") is True
    lab = ROOT / "inventories" / "lab" / "group_vars" / "lab_hosts" / "connection.yml"
    assert yaml.safe_load(lab.read_text())["ansible_host_key_checking"] is False
    offenders = []
    for path in (ROOT / "inventories").rglob("*.yml"):
        if path.resolve() == lab.resolve():
            continue
        text = path.read_text()
        if "StrictHostKeyChecking=no" in text or "host_key_checking: false" in text.lower():
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
