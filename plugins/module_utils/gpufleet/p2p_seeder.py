"""The detached seeder: one per model in its revisions store, started after a verified
fetch, found again by its state file, stopped by its stop file or at the rollout's end."""
from __future__ import annotations

import json
import os
import time

from . import p2p
from .hub_names import HEX40
from .p2p_errors import P2PError
from .p2p_plan import check_plan, seeds_after_fetch
from .p2p_swarm import DEFAULT_PORT

SEEDER_STATE = "p2p-seeder.json"  # ROOT/.gpufleet-revisions/NAME/: one seeder per model
SEEDER_STOP = "p2p-stop"
SEEDER_LOG = "p2p-seeder.log"


# ---------------------------------------------------------------- the seeder (detached)

def seeder_paths(store):
    """(state, stop, log) files of the model's seeder in its revisions store."""
    return (os.path.join(store, SEEDER_STATE), os.path.join(store, SEEDER_STOP),
            os.path.join(store, SEEDER_LOG))


def _proc_start(pid, proc="/proc"):
    try:
        with open(f"{proc}/{int(pid)}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError, ValueError):
        return None


def seeder_state(store, proc="/proc"):
    """The model's seeder as its state file names it, {pid, start, commit, infohash,
    policy, ...} with running (the pid alive with the same start time: a reused pid is not
    ours), or None when there is no state file."""
    state_file, _stop_file, _log_file = seeder_paths(store)
    try:
        with open(state_file, encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    start = _proc_start(state.get("pid", 0), proc)
    state["running"] = start is not None and start == state.get("start")
    return state


def stop_seeder(store, wait=30.0, proc="/proc"):
    """Tell the model's seeder to stop (its stop file) and wait for it to end; the state
    file goes. Returns what was stopped (its state) or None when none was running."""
    state = seeder_state(store, proc)
    state_file, stop_file, _log_file = seeder_paths(store)
    if state is None:
        return None
    if state["running"]:
        with open(stop_file, "w", encoding="utf-8"):
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _proc_start(state["pid"], proc) == state["start"]:
            time.sleep(0.2)
        if _proc_start(state["pid"], proc) == state["start"]:
            raise P2PError(f"the seeder (pid {state['pid']}) did not stop within {wait:g} s of "
                           f"its stop file {stop_file}; look at {seeder_paths(store)[2]}.")
    for path in (state_file, stop_file):
        if os.path.lexists(path):
            os.unlink(path)
    if state.get("dest") and HEX40.match(str(state.get("commit", ""))):
        p2p.cleanup(state["dest"], state["commit"])  # nothing seeds from it any more
    return state if state["running"] else None


def start_seeder(store, job):
    """Seed job['dest'] (verified) in a detached process (its own session: it outlives
    the module and Ansible's async job) until the stop file exists or job['timeout']
    seconds; its state file lets the role find and stop it. Returns its state."""
    state_file, stop_file, log_file = seeder_paths(store)
    if os.path.lexists(stop_file):
        os.unlink(stop_file)
    job = dict(job, seed_only=True, stop_file=stop_file, web_seed=None)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: a new session, then the seeder as a grandchild
        try:
            os.close(read_end)
            os.setsid()
            if os.fork():
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            log = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.write(write_end, str(os.getpid()).encode())
            # nothing of the caller's stays open (Ansible's async pipes, a test's capture)
            os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 4096)

            def say(line):  # straight to the log file (fd 1), unbuffered
                os.write(1, f"{line}\n".encode())

            try:
                result = p2p.run_peer(job, log=say)
                say(json.dumps({k: v for k, v in result.items() if k != "events"}))
            except Exception as exc:  # noqa: BLE001 - the log is all that is left
                say(f"seeder failed: {type(exc).__name__}: {exc}")
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        seeder = int(fh.read() or 0)
    os.waitpid(pid, 0)
    if not seeder:
        raise P2PError(f"the seeder did not start; look at {log_file}.")
    state = {"pid": seeder, "start": _proc_start(seeder), "commit": job["commit"],
             "infohash": job.get("infohash"), "dest": job["dest"],
             "listen": f"{job['listen']}:{job.get('port', DEFAULT_PORT)}",
             "policy": job.get("seed", "until_rollout_end"), "log": log_file,
             "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    from .hub_manifest import write_json_atomic  # noqa: PLC0415
    write_json_atomic(state_file, state)
    return dict(state, running=True)


def ensure_seeder(store, job, policy, check_mode=False):
    """The model's seeder after a fetch, by policy: (changed, state). One seeder per model
    folder: one for another commit is stopped first; one already seeding this commit is
    left as it is (idempotent)."""
    state = seeder_state(store)
    if not seeds_after_fetch(policy):
        if not check_mode and not (state and state["running"]
                                   and state.get("dest") == job["dest"]):
            p2p.cleanup(job["dest"], job["commit"])  # nothing will seed from the partial area
        return False, state if state and state["running"] else None
    if state and state["running"] and state.get("commit") == job["commit"] \
            and state.get("infohash") == job.get("infohash"):
        return False, state
    if check_mode:
        return True, None
    if state:
        stop_seeder(store)
    return True, start_seeder(store, dict(job, seed=policy))


def seeder_job(result, job):
    """The seeder's job for a fetched folder (hf_model's result: path, commit, files)."""
    return dict(job, dest=result["path"], commit=result["commit"],
                listing=[{k: f[k] for k in ("path", "size", "algorithm", "digest")}
                         for f in result["files"]],
                timeout=job.get("seed_max", 86400) if job.get("seed") != "forever" else 0)


def report(result, job, runner, store, policy, check_mode=False):
    """hf_model's `p2p` result after a fetch: where the bytes came from, the peers banned
    for bad pieces (named), and the seeder the policy leaves running. Starts the seeder
    (not in check mode). Returns (report, changed)."""
    if check_mode:
        out = check_plan(result, job)
        out["would_seed"] = seeds_after_fetch(policy)
        return out, False
    ran = runner.result if runner is not None else None
    out = {"transport": "p2p", "swarm": ran is not None,
           "bytes_from_peers": ran["bytes_by_source"]["peers"] if ran else 0,
           "bytes_from_web_seed": ran["bytes_by_source"]["web_seed"] if ran else 0,
           "banned_peers": ran["banned_peers"] if ran else [],
           "blocked_peers": ran["blocked_peers"] if ran else [],
           "hash_failures": ran["hash_failures"] if ran else 0,
           # the web-seed policy: 0 from the start, else seconds of no peer block first
           "web_seed_delay": job.get("web_seed_delay", 0) if job.get("web_seed") else None,
           "web_seed_after": ran["web_seed_after"] if ran else None,
           "web_seed_down": bool(ran) and any(e["event"] == "web_seed_down"
                                              for e in ran["events"])}
    changed, state = ensure_seeder(store, seeder_job(result, job), policy)
    out["seeding"] = ({k: state[k] for k in ("pid", "commit", "listen", "policy", "log")}
                      if state else None)
    return out, changed
