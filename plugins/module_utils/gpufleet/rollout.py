"""A rollout's durable state (issue #31): where each host is in a rollout, kept on the
host, and the fleet-wide lock that lets one rollout run at a time. Plain Python, no
Ansible imports; plugins/modules/rollout_state.py and plugins/modules/rollout_lock.py are its shells.

Anchors: Kubernetes keeps a rollout's desired state in the API server, so a dead client
changes nothing and the next one carries on; NVIDIA's GPU Operator keeps each node's
driver-upgrade state on the node (a label) and resumes it after a controller restart,
with parallel upgrades capped centrally (k8s-operator-libs, upgrade_state.go).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time

from .jsonfile import read_json, write_json

__all__ = [
    "DONE_STEPS", "HELD_STEPS", "LOCK_PATH", "STATE_PATH", "STEPS", "RolloutError",
    "held_hosts", "held_message", "held_messages", "lost_report", "lock_message", "read_lock", "read_state", "release_lock", "save_state",
    "take_lock", "write_state",
]

STATE_PATH = "/var/lib/gpufleet/rollout-state.json"
LOCK_PATH = "/var/lib/gpufleet/rollout.lock"

# A host's steps, in the order a change goes through them (roles/fleet_upgrade/tasks/
# change.yml and rollback.yml write them before the step they name begins, or once it
# is done for the *_done ones):
#   draining       the gateway is being told to send it nothing new
#   out_of_service drained and idle: it serves nothing through the gateway
#   applied        the change is applied (new containers, driver), gates not yet passed
#   gated          the readiness and probe gates passed, still out of service
#   in_service     re-enabled at the gateway, soak window and record to come
#   recorded       the new last-good record is written: the change is done
#   rolling_back   a gate failed; going back to the last-good record
#   rolled_back    back on the last-good record and in service
#   failed         the rollback itself failed: left as that failure left it
STEPS = ("draining", "out_of_service", "applied", "gated", "in_service", "recorded",
         "rolling_back", "rolled_back", "failed")
DONE_STEPS = frozenset({"recorded", "rolled_back"})
HELD_STEPS = frozenset(STEPS) - DONE_STEPS
HISTORY_LIMIT = 50
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class RolloutError(ValueError):
    """Bad input or a state the operator must act on; the message says what to do."""


def _check_id(rollout):
    if not isinstance(rollout, str) or not _ID.match(rollout):
        raise RolloutError(f"a rollout id is 1-128 letters, digits, '.', '_', ':' or '-', "
                           f"got {rollout!r:.80}")
    return rollout


def read_state(path=STATE_PATH):
    """The host's rollout state ({} when no rollout ever touched it), with "held": True
    when a rollout left it before the end of its change (a step of HELD_STEPS). Trusted
    only when it belongs to the user reading it (root under become) and no one else may
    write it (issue #32 item 6): another user could otherwise hold or free a host."""
    state = read_json(path, {}, "move it aside; then run playbooks/upgrade.yml, which "
                      "re-checks every gate of the host", owner=os.geteuid())
    if state and state.get("step") not in STEPS:
        raise RolloutError(f"{path} names an unknown step {state.get('step')!r}; move it "
                           "aside and run playbooks/upgrade.yml again")
    if state:
        state = dict(state, held=state["step"] in HELD_STEPS)
    return state


def write_state(path, rollout, step, now=None, before=None):
    """The new state when the host enters `step` of `rollout` (the history of steps,
    oldest first, capped at HISTORY_LIMIT, carries over from `before`)."""
    _check_id(rollout)
    if step not in STEPS:
        raise RolloutError(f"step must be one of {', '.join(STEPS)}, got {step!r}")
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    history = list((before or {}).get("history") or [])[-(HISTORY_LIMIT - 1):]
    history.append([rollout, step, at])
    state = {"version": 1, "rollout": rollout, "step": step, "at": at, "history": history}
    return state


def held_message(host, state):
    """What site.yml and upgrade.yml say of a host a rollout left mid-change."""
    return (f"{host} is held by rollout {state.get('rollout')}: it was left at step "
            f"'{state.get('step')}' at {state.get('at')} (a controller that died, an SSH "
            "connection lost, or a rollback that failed). Run playbooks/upgrade.yml again "
            "(with the same inventory): it resumes the host first, finishes the change or "
            "rolls it back, and puts it back in service. site.yml does not touch it until then.")


def held_hosts(hosts, reads):
    """{host: state} of the hosts a rollout left mid-change, from rollout_state reads
    (one result per host, in the order of `hosts`)."""
    return {h: r["rollout_state"] for h, r in zip(hosts, reads or [])
            if isinstance(r, dict) and r.get("held")}


def held_messages(held):
    """held_message for each host of held_hosts()."""
    return [held_message(host, state) for host, state in (held or {}).items()]


def last_step_written(facts):
    """The last step a run wrote on a host, from its registered rollout_state results
    (__fleet_upgrade_step_<step>, one per step, so the write the host was lost at, an
    unreachable result, does not hide the one before): the one with the longest history."""
    best = None
    for name in STEPS:
        result = facts.get(f"__fleet_upgrade_step_{name}")
        state = result.get("rollout_state") if isinstance(result, dict) else None
        if state and (best is None or len(state.get("history") or []) > len(best.get("history") or [])):
            best = state
    return (best or {}).get("step")


def lost_report(batches, host, active, hostvars, rollout):
    """Messages for the hosts of `host`'s batch (from the plan's `batches`) that are no
    longer in the play (`active`: ansible_play_batch) and were not left out on purpose
    (their __fleet_upgrade_left_out): Ansible drops a host it cannot reach mid-change. Each
    names the last step this run wrote on the host (last_step_written), from
    which the next run resumes it."""
    batch = next((b for b in batches or [] if host in b), [])
    out = []
    for lost in batch:
        facts = hostvars[lost] if lost in hostvars else {}
        if lost in (active or []) or facts.get("__fleet_upgrade_left_out"):
            continue
        step = last_step_written(facts) or "none yet (it was not drained)"
        out.append(f"UPGRADE STOPPED after this batch: {lost} became unreachable mid-change in "
                   f"rollout {rollout}; the last step this run wrote on it: {step}. When {lost} "
                   "answers again, run playbooks/upgrade.yml again: it resumes the host first "
                   "(gates, then back in service), and site.yml refuses to touch it until then.")
    return out


# ----------------------------------------------------------------- the lock
def read_lock(path=LOCK_PATH):
    return read_json(path, {}, "it is the rollout lock: if no rollout runs, remove it, or "
                     "run playbooks/upgrade.yml with -e fleet_upgrade_break_lock=<its rollout id>",
                     owner=os.geteuid())


def lock_message(lock, path=LOCK_PATH):
    scope = lock.get("scope") or []
    scope_text = ", ".join(scope[:10]) + (f" and {len(scope) - 10} more" if len(scope) > 10 else "")
    return (f"another rollout holds the fleet: rollout {lock.get('rollout')} by "
            f"{lock.get('holder')}, started {lock.get('started')}, on {scope_text or 'no host'} "
            f"({path}). Wait for it to end. If it is dead (its controller was killed or lost), "
            f"run again with -e fleet_upgrade_break_lock={lock.get('rollout')} to take the "
            "lock over; the hosts it left mid-change are then resumed first.")


def take_lock(path, rollout, holder, scope, break_lock="", now=None, check_mode=False):
    """Take the lock for `rollout`. Returns {"changed", "lock", "broken"}. The file is
    linked into place whole (link() refuses an existing name), so of two runs that start
    at once exactly one gets it; a lock
    held by another rollout is refused (RolloutError with lock_message) unless
    `break_lock` names that rollout's id."""
    _check_id(rollout)
    if not isinstance(holder, str) or not holder or len(holder) > 256 or "\n" in holder:
        raise RolloutError(f"holder must be a one-line name of at most 256 characters, got {holder!r:.80}")
    if not isinstance(scope, (list, tuple)) or not all(isinstance(h, str) for h in scope):
        raise RolloutError(f"scope must be a list of host names, got {scope!r}")
    lock = {"version": 1, "rollout": rollout, "holder": holder, "scope": list(scope),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
    before = read_lock(path)
    if before.get("rollout") == rollout:
        return {"changed": False, "lock": before, "broken": None}
    broken = None
    if before:
        if not break_lock:
            raise RolloutError(lock_message(before, path))
        if break_lock != before.get("rollout"):
            raise RolloutError(f"fleet_upgrade_break_lock is {break_lock!r}, but the lock is held "
                               f"by rollout {before.get('rollout')!r}: name that id to break it. "
                               + lock_message(before, path))
        broken = before
    if check_mode:
        return {"changed": True, "lock": lock, "broken": broken}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o755, exist_ok=True)
    if broken:
        os.unlink(path)
    # The whole file is written aside, then hard-linked into place: link() fails when the
    # name exists, so the lock appears complete or not at all (an O_EXCL create would let a
    # second run read it empty, between the create and the write).
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".rollout-lock-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(lock, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, 0o600)
        os.link(tmp, path)
    except FileExistsError as exc:  # another run took it between the read and here
        raise RolloutError(lock_message(read_lock(path), path)) from exc
    finally:
        os.unlink(tmp)
    return {"changed": True, "lock": lock, "broken": broken}


def release_lock(path, rollout, check_mode=False):
    """Release the lock if `rollout` holds it. A lock of another rollout is left alone
    (and said); no lock is no change."""
    _check_id(rollout)
    before = read_lock(path)
    if not before:
        return {"changed": False, "lock": {}, "msg": "no lock was held"}
    if before.get("rollout") != rollout:
        return {"changed": False, "lock": before,
                "msg": f"the lock is held by rollout {before.get('rollout')}, not {rollout}: left alone"}
    if not check_mode:
        os.unlink(path)
    return {"changed": True, "lock": {}, "msg": f"rollout {rollout} released the lock"}


def save_state(path, state, check_mode=False):
    """Write a state built by write_state (mode 0600: it names rollouts and hosts)."""
    if not check_mode:
        write_json(path, state, mode=0o600)
