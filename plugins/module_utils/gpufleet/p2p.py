"""Peer-to-peer fan-out of verified model folders over BitTorrent (libtorrent).

The engine is libtorrent (Debian 12 ``python3-libtorrent`` 2.0.8 on the hosts; see
docs/model-fetch.md, "Peer-to-peer fan-out"). The decisions are plain
Python (importable without Ansible and without libtorrent). This file holds the engine
(:func:`run_peer`, one host's session), hub.sync_repo's runner (:class:`Runner`) and the
file checks:

- :func:`verify_file` / :func:`place_file`: each downloaded file is checked with
  hf_model's rule (sha256 for LFS files, git blob sha1 otherwise, and the lock's sha256
  where one pins it: hub_listing.RepoFile) before it gets its final name.

What a torrent holds is in p2p_torrent, who a session may talk to and the web-seed policy
in p2p_swarm, model_fetch's settings in p2p_fleet, the detached seeder in p2p_seeder; the
errors (p2p_errors) are named here in __all__.
"""
from __future__ import annotations

import json
import os
import shutil
import time

from .hub_client import CHUNK
from .hub_errors import HubError
from .hub_listing import RepoFile
from .hub_manifest import manifest_entries, open_nofollow, state_path, write_manifest
from .hub_names import STATE_DIR, path_under
from .p2p_errors import P2PError, WebSeedDown
from .p2p_swarm import (DEFAULT_PORT, REDIAL, WebSeedGate, ip_filter_rules, probe_web_seed,
                        settings, url_host)
from .p2p_torrent import check_torrent, load_libtorrent, torrent_facts

__all__ = ["P2PError", "WebSeedDown", "P2P_DIR", "Runner", "cleanup", "partial_root",
           "place_file", "run_peer", "summary", "verify_file"]

P2P_DIR = "p2p"  # dest/.gpufleet/p2p/<commit>/...: libtorrent's storage (partial area)
# seconds a file libtorrent calls complete may fail hf_model's check, its cache flushed and
# the file looked at again once a second, before it is rejected (check_completed)
FLUSH_GRACE = 5.0


# ---------------------------------------------------------------- files

def partial_root(dest):
    """dest/.gpufleet/p2p: libtorrent's save_path; files land in <commit>/<path> below."""
    return os.path.join(dest, STATE_DIR, P2P_DIR)


def verify_file(path, f):
    """hf_model's rule on a file: None when its bytes hash to the listing's digest (and
    the lock's sha256, if pinned), else a description of the mismatch."""
    h = f.hasher()
    with open_nofollow(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    got = h.hexdigest()
    if got != f.digest:
        return f"{f.path}: {f.algorithm} {got}, the listing gives {f.digest}"
    pinned = f.pinned_ok(h)
    if pinned is not None and pinned != f.pinned:
        return f"{f.path}: sha256 {pinned}, the lock pins {f.pinned}"
    return None


def check_completed(partial, f, seen, now, flush, grace=FLUSH_GRACE):
    """hf_model's rule on a file whose every piece libtorrent has: None (verified), "retry"
    (look again later) or why it is rejected. libtorrent 2.0 hashes a piece from its store
    buffer, so the piece can count as had before its bytes are in the file (seen in the
    fleet lab, 25 hosts on two loaded cores: a file whose pieces all passed failed the
    listing's sha1): a mismatch flushes libtorrent's cache (`flush`) and the file is looked
    at again, at most once a second, for `grace` seconds; only then is it rejected. `seen`
    (path -> (first mismatch, last look)) is the caller's, one per session."""
    last = seen.get(f.path)
    if last is not None and now - last[1] < 1.0:
        return "retry"
    bad = verify_file(partial, f)
    if bad is None:
        return None
    first = last[0] if last else now
    if now - first >= grace:
        return bad
    flush()
    seen[f.path] = (first, now)
    return "retry"


def place_file(dest, partial, f):
    """Give a verified partial file its final name: a hard link (libtorrent keeps seeding
    from the partial area) renamed over dest/<path> in one step."""
    final = path_under(dest, f.path, final_may_be_link=True)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    tmp = f"{final}.gpufleet-p2p.{os.getpid()}"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.link(partial, tmp)
    os.replace(tmp, final)


def summary(events, carried):
    """The task's verdict from the runner's events: files placed, peers banned (a bad
    piece) and refused (not allowed), bytes by source."""
    placed = sorted(e["path"] for e in events if e["event"] == "placed")
    bad = sorted(e["path"] for e in events if e["event"] == "rejected")
    return {
        "complete": len(placed) == len(carried) and not bad,
        "files_placed": placed, "files_rejected": bad,
        "banned_peers": sorted({e["peer"] for e in events if e["event"] == "banned"}),
        "blocked_peers": sorted({e["peer"] for e in events if e["event"] == "blocked"}),
        "hash_failures": sum(1 for e in events if e["event"] == "hash_failed"),
        # seconds after the start when the web seed was added (None: never)
        "web_seed_after": next((e["after"] for e in events if e["event"] == "web_seed_added"),
                               None),
    }


# ---------------------------------------------------------------- engine (libtorrent)
def _ip(endpoint):
    return str(endpoint[0]) if isinstance(endpoint, tuple) else str(endpoint)


def _block_bytes(ti, piece, block, block_size=16 << 10):
    """Bytes of one block (16 KiB, the last of a piece may be shorter)."""
    return max(0, min(block_size, ti.piece_size(piece) - block * block_size))


def run_peer(job, log=None, progress=None):
    """One host's session until it is done: `job` (a dict, JSON-able):

    torrent (path), dest, listing ([{path, size, algorithm, digest, pinned}]), commit,
    infohash (optional), listen ("addr"), port, peers (["addr:port"]), allow (addresses),
    web_seed (base URL; probed first unless probe_web_seed is false: one that ignores
    Range fails the run, one that does not answer is left out), web_seed_delay (seconds:
    0 uses the web seed from the start, else it is added once no peer delivered a block
    for that long: WebSeedGate),
    seed_only (dest is verified already),
    stop_file (seeding ends when it exists; without one the run ends when complete),
    upload_rate / download_rate (bytes/s, 0: no cap), timeout (seconds for the whole run;
    0: none, for a seeder told to seed until stopped), write_manifest (default true).
    progress(files_placed, {peers, web_seed}) is called about once a second.
    Returns summary() plus bytes and events. Files are verified with hf_model's rule
    before they get their final name; a complete run writes dest's manifest."""
    lt = load_libtorrent()
    with open(job["torrent"], "rb") as fh:
        data = fh.read()
    listing = [RepoFile(e["path"], e["size"], e["algorithm"], e["digest"], e.get("pinned"))
               for e in job["listing"]]
    facts = torrent_facts(data)
    carried = check_torrent(facts, listing, job["commit"], job.get("infohash"))
    dest = job["dest"]
    events = []

    def note(event, **kw):
        events.append({"event": event, "t": round(time.monotonic() - start, 3), **kw})
        if log:
            log(json.dumps(events[-1]))

    start = time.monotonic()
    ses = lt.session(settings(job["listen"], job.get("port", DEFAULT_PORT),
                              job.get("upload_rate", 0), job.get("download_rate", 0)), 0)
    ses.add_extension("smart_ban")  # names the peer behind a bad block even in mixed pieces
    ses.apply_settings({"alert_queue_size": 100000,
                        "alert_mask": lt.alert_category.error | lt.alert_category.peer
                        | lt.alert_category.status | lt.alert_category.storage
                        | lt.alert_category.ip_block | lt.alert_category.file_progress
                        | lt.alert_category.block_progress})
    flt = lt.ip_filter()
    for first, last, blocked in ip_filter_rules(job["allow"]):
        flt.add_rule(first, last, 1 if blocked else 0)
    ses.set_ip_filter(flt)

    save = partial_root(dest)
    os.makedirs(save, exist_ok=True)
    atp = lt.add_torrent_params()
    atp.ti = lt.torrent_info(lt.bdecode(data))
    atp.save_path = save
    atp.flags = (lt.torrent_flags.apply_ip_filter | lt.torrent_flags.disable_dht
                 | lt.torrent_flags.disable_lsd | lt.torrent_flags.disable_pex)
    if job.get("seed_only"):
        # a verified dest seeds as it is: hard links of its files in the partial area
        for f in carried:
            _link_for_seeding(dest, save, job["commit"], f)
        atp.flags |= lt.torrent_flags.seed_mode
    gate, pending_seed = WebSeedGate(job.get("web_seed_delay", 0) or 0, start), None
    if job.get("web_seed"):
        try:
            if job.get("probe_web_seed", True):
                probe_web_seed(job["web_seed"], job["commit"], carried[0].path)
            if gate.opened_at is not None:
                atp.url_seeds = [job["web_seed"]]
                note("web_seed_added", after=0.0, why="first host(s) of the swarm")
            else:
                pending_seed = job["web_seed"]
        except WebSeedDown as exc:  # a seed that ignores Range is refused (P2PError)
            note("web_seed_down", message=str(exc))
    h = ses.add_torrent(atp)
    dial = []
    for peer in job.get("peers") or []:
        host, _sep, port = peer.rpartition(":")
        dial.append((host.strip("[]"), int(port)))
    for endpoint in dial:
        h.connect_peer(endpoint)
    last_dial = time.monotonic()

    files = atp.ti.files()
    index = {}
    for i in range(files.num_files()):
        rel = files.file_path(i).replace(os.sep, "/").partition("/")[2]
        index[i] = rel
    by_path = {f.path: f for f in carried}
    done, rejected = set(), set()
    rechecks = {}  # check_completed's looks at files that did not verify yet
    if job.get("seed_only"):
        done = set(by_path)
    by_peer = {}  # bytes of blocks received, by the sender's address
    ti = atp.ti
    mirror_ip = url_host(job.get("web_seed"))
    timeout = float(job.get("timeout", 600))
    deadline = start + timeout if timeout > 0 else float("inf")
    finished_at = None
    last_progress = 0.0
    while time.monotonic() < deadline:
        completed = []
        for a in ses.pop_alerts():
            if isinstance(a, lt.file_completed_alert):
                completed.append(int(a.index))
            elif isinstance(a, lt.block_finished_alert):
                ip = _ip(a.endpoint)
                by_peer[ip] = by_peer.get(ip, 0) + _block_bytes(ti, int(a.piece_index),
                                                                int(a.block_index))
                if ip != mirror_ip:
                    gate.peer_block(time.monotonic())
            elif isinstance(a, lt.peer_ban_alert):
                note("banned", peer=_ip(a.endpoint), message=a.message())
            elif isinstance(a, lt.peer_blocked_alert):
                note("blocked", peer=_ip(a.endpoint), reason=int(a.reason))
            elif isinstance(a, lt.hash_failed_alert):
                note("hash_failed", piece=int(a.piece_index))
            elif isinstance(a, (lt.torrent_error_alert, lt.listen_failed_alert,
                                lt.file_error_alert)):
                note("error", message=a.message())
        if len(done | rejected) < len(carried):
            # alerts can be dropped when the queue is full: the pieces' progress is the truth
            have = h.file_progress(lt.torrent_handle.piece_granularity)
            completed += [i for i, rel in index.items()
                          if rel in by_path and have[i] == by_path[rel].size]
        for i in completed:
            rel = index.get(i)
            f = by_path.get(rel)
            if f is None or rel in done or rel in rejected:
                continue
            partial = path_under(os.path.join(save, job["commit"]), rel)
            bad = check_completed(partial, f, rechecks, time.monotonic(), h.flush_cache)
            if bad == "retry":
                continue
            if bad:
                rejected.add(rel)
                note("rejected", path=rel, why=bad)
            else:
                place_file(dest, partial, f)
                done.add(rel)
                note("placed", path=rel)
        if finished_at is None and time.monotonic() - last_dial >= REDIAL:
            # hosts that start together dial each other at once, and libtorrent drops one
            # of two connections between the same two addresses, sometimes both: dial the
            # inventory's peers this host has no connection with again
            last_dial = time.monotonic()
            connected = {_ip(p.ip) for p in h.get_peer_info()}
            for endpoint in dial:
                if endpoint[0] not in connected:
                    h.connect_peer(endpoint)
        if pending_seed and finished_at is None and gate.due(time.monotonic()):
            h.add_url_seed(pending_seed)
            pending_seed = None
            note("web_seed_added", after=round(gate.opened_at - start, 3),
                 why=f"no peer delivered a block for {gate.delay:g} s")
        if progress and time.monotonic() - last_progress >= 1.0:
            last_progress = time.monotonic()
            progress(len(done), _by_source(by_peer, mirror_ip))
        if finished_at is None and len(done) == len(carried):
            finished_at = time.monotonic()
            if not job.get("seed_only"):
                _finish(dest, job, listing, carried)
            note("complete")
        if rejected and len(done | rejected) == len(carried):
            # bytes that passed the torrent's piece hashes but not the listing's (or the
            # lock's): the torrent cannot bring others; nothing of them got a final name
            note("incomplete", rejected=sorted(rejected))
            break
        if finished_at is not None:
            stop = job.get("stop_file")
            if not stop or os.path.exists(stop):
                break
        time.sleep(0.1)
    st = h.status()
    from_sources = _by_source(by_peer, mirror_ip)
    if progress:
        progress(len(done), from_sources)
    result = summary(events, carried)
    result.update({"infohash": facts["infohash"], "events": events,
                   "payload_downloaded": st.total_payload_download,
                   "payload_uploaded": st.total_payload_upload,
                   "bytes_by_source": from_sources, "bytes_by_peer": by_peer,
                   "seconds": round(time.monotonic() - start, 3)})
    ses.remove_torrent(h)
    del ses
    return result


def _by_source(by_peer, mirror_ip):
    return {"peers": sum(n for ip, n in by_peer.items() if ip != mirror_ip),
            "web_seed": by_peer.get(mirror_ip, 0)}


def _link_for_seeding(dest, save, commit, f):
    """save/<commit>/<path> as a hard link of dest/<path>, whose bytes match f."""
    final = path_under(dest, f.path)
    if verify_file(final, f):
        raise P2PError(f"{final} does not hash to the listing's digest: fetch it again "
                       "(hf_model verify: full) before seeding it.")
    partial = path_under(os.path.join(save, commit), f.path)
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    if os.path.lexists(partial):
        os.unlink(partial)
    os.link(final, partial)


def _finish(dest, job, listing, carried):
    """Empty listed files (not in the torrent) and the manifest of the verified folder."""
    carried_paths = {f.path for f in carried}
    for f in listing:
        if f.path not in carried_paths and f.size == 0:
            final = path_under(dest, f.path, final_may_be_link=True)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            with open_nofollow(final, "wb"):
                pass
            if verify_file(final, f):
                raise P2PError(f"{f.path}: an empty file does not hash to the listing's digest.")
    if job.get("write_manifest", True):
        write_manifest(dest, job.get("repo_id", ""), job.get("revision", job["commit"]),
                       job["commit"], job.get("endpoint", "p2p"),
                       manifest_entries(dest, listing))


def cleanup(dest, commit):
    """Remove the partial area of `commit` once nothing seeds from it (dest's files are
    other hard links of the same bytes): stop_seeder calls it, and ensure_seeder when the
    policy leaves no seeder. The partial root goes too when it is left empty."""
    shutil.rmtree(os.path.join(partial_root(dest), commit), ignore_errors=True)
    try:
        os.rmdir(partial_root(dest))
    except OSError:
        pass  # absent, or another commit's area is still there


# ---------------------------------------------------------------- fetch (hub.sync_repo's runner)

def _progress_writer(path, total_files, total_bytes):
    from .hub_manifest import write_json_atomic  # noqa: PLC0415

    def write(files_done, verified, by_source):
        if not path:
            return
        got = int(by_source.get("peers", 0)) + int(by_source.get("web_seed", 0))
        write_json_atomic(path, {
            "files_done": files_done, "files_total": total_files,
            "bytes_downloaded": got, "bytes_verified": min(verified, total_bytes),
            "bytes_total": total_bytes, "bytes_from_peers": int(by_source.get("peers", 0)),
            "bytes_from_web_seed": int(by_source.get("web_seed", 0)),
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())})
    return write


class Runner:
    """hub.sync_repo's runner for p2p: takes the Fetcher's plan (files trusted, present,
    missing...) and brings the missing bytes over BitTorrent. `job` is run_peer's job
    without dest, listing and commit (the plan gives them). After it ran: .result (the
    run_peer summary, or None when nothing had to come)."""

    def __init__(self, job, repo_id=""):
        self.job, self.repo_id, self.result = dict(job), repo_id, None

    def __call__(self, fetcher, plan, progress_path=None):
        from .hub_fetch import Stats  # noqa: PLC0415

        total = sum(f.size for f, _state in plan)
        fetcher.stats = Stats(fetcher.dest, len(plan), total, False)
        # the folder's layout as after an http fetch (a re-run finds what it left)
        os.makedirs(state_path(fetcher.dest, "incomplete"), exist_ok=True)
        outcome, todo = {}, []
        for f, state in plan:  # what is on disk and verifies stays: hf_model's own rule
            final = fetcher.final_path(f)
            if state == "trusted":
                outcome[f.path] = "trusted"
                continue
            if state == "present":
                bad = verify_file(final, f)
                fetcher.stats.add(verified=f.size)
                if not bad:
                    outcome[f.path] = "verified"
                    continue
                fetcher.quarantine(f, final, bad)
            elif state == "stale":
                fetcher.quarantine(f, final, "not a regular file of the listed size")
            elif state == "outdated":
                os.unlink(final)
            todo.append(f)
        if not todo:
            return outcome, []
        for f, _state in plan:  # verified files are in the swarm's storage: libtorrent checks them
            if f.path in outcome and f.size:
                _link_for_seeding(fetcher.dest, partial_root(fetcher.dest), fetcher.commit, f)
        write = _progress_writer(progress_path, len(plan), total)
        done_before = sum(f.size for f, _state in plan if f.path in outcome)

        def progress(placed, by_source):
            write(len(outcome) + placed, done_before + sum(by_source.values()), by_source)

        job = dict(self.job, dest=fetcher.dest, commit=fetcher.commit, repo_id=self.repo_id,
                   listing=[{"path": f.path, "size": f.size, "algorithm": f.algorithm,
                             "digest": f.digest, "pinned": f.pinned} for f, _state in plan],
                   seed_only=False, stop_file=None, write_manifest=False)
        job.pop("seed", None)
        self.result = run_peer(job, progress=progress)
        got = self.result["bytes_by_source"]
        fetcher.stats.add(downloaded=got["peers"] + got["web_seed"],
                          verified=sum(f.size for f in todo))
        placed = set(self.result["files_placed"])
        errors = []
        for f in todo:
            if f.path in placed or (f.size == 0 and self.result["complete"]):
                outcome[f.path] = "downloaded"
            else:
                why = [e.get("why") for e in self.result["events"]
                       if e["event"] == "rejected" and e.get("path") == f.path]
                errors.append(HubError(f"{f.path}: " + (
                    why[0] if why else
                    "not complete from the swarm within the p2p timeout (peers and web seed "
                    "were asked); the next run resumes it")))
        return outcome, errors
