"""Peer-to-peer fan-out of verified model folders over BitTorrent (libtorrent).

The engine is libtorrent (Debian 12 ``python3-libtorrent`` 2.0.8 on the hosts; see
docs/model-fetch.md, "Peer-to-peer fan-out"). This module holds the decisions in plain
Python (importable without Ansible and without libtorrent):

- :func:`torrent_files` / :func:`piece_size`: what a torrent is made of: the files of a
  *complete, verified* hf_model manifest (hub_mirror.read_model_folder checks that every
  file still has the size and mtime it had when it was verified), sorted, under a root
  folder named after the commit. Web seeds (BEP 19) then address a file as
  ``<endpoint>/<repo>/resolve/`` + ``<commit>/<path>``: the site mirror's own URL.
- :func:`check_torrent` : a torrent handed to a host must list exactly the listing's
  files (paths and sizes) under its commit, be private, and have the infohash the control
  node announced.
- :func:`settings` / :func:`allow_list` / :func:`ip_filter_rules`: the session: no DHT,
  LSD, UPnP, NAT-PMP, PEX or uTP; listen and connect from one address; every address but
  the inventory's peers and the mirror is blocked (libtorrent applies the filter to web
  seeds too).
- :func:`web_seed_verdict`: a web seed must honour Range (206); olah 0.5.4 ignores it, so
  p2p mode refuses such an endpoint instead of fetching whole files per piece.
- :func:`verify_file` / :func:`place_file`: each downloaded file is checked with
  hf_model's rule (sha256 for LFS files, git blob sha1 otherwise, and the lock's sha256
  where one pins it: hub.RepoFile) before it gets its final name.

The engine part (:func:`make_torrent`, :func:`run_peer`) imports libtorrent when called.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shutil
import tempfile
import time

from . import grammar
from .hub import (CHUNK, STATE_DIR, HubError, RepoFile, UnsafePathError, _HEX40,
                  _open_nofollow, manifest_entries, path_under, safe_relpath,
                  validate_repo_id, write_manifest)

P2P_DIR = "p2p"  # dest/.gpufleet/p2p/<commit>/...: libtorrent's storage (partial area)
MIN_PIECE = 16 << 10  # BitTorrent v2 pieces: a power of two, at least 16 KiB
MAX_PIECE = 16 << 20
TARGET_PIECES = 2000
DEFAULT_PORT = 6881
_OLAH_HINT = ("olah (and any mirror that ignores Range) answers every piece request with the "
              "whole file")


class P2PError(HubError):
    """A p2p input or outcome that cannot go on; the message says what to do."""


class WebSeedDown(P2PError):
    """The web seed did not answer: peers may still serve every piece."""


# ---------------------------------------------------------------- what a torrent holds

def piece_size(total):
    """Power of two between 16 KiB and 16 MiB giving about TARGET_PIECES pieces: a
    function of the bytes alone, so two makes of one model choose the same size."""
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise P2PError(f"total size {total!r} is not a byte count.")
    size = MIN_PIECE
    while size < MAX_PIECE and total / size > TARGET_PIECES:
        size *= 2
    return size


def torrent_files(model):
    """(root, [(path, size)]) of a model read by hub_mirror.read_model_folder: the commit
    names the root folder, files sorted by path. Empty files are left out (a torrent
    cannot carry them; the host writes them itself, they hash like any other)."""
    commit = model.get("commit")
    if not isinstance(commit, str) or not _HEX40.match(commit):
        raise P2PError(f"commit {commit!r:.60} is not a commit sha: make torrents only from "
                       "a complete hf_model manifest.")
    files = []
    for f in sorted(model.get("files") or [], key=lambda f: f.path):
        safe_relpath(f.path)
        if f.size:
            files.append((f.path, f.size))
    if not files:
        raise P2PError(f"{model.get('folder')}: no non-empty file to share.")
    return commit, files


def check_torrent(info, listing, commit, infohash=None):
    """A torrent's facts (from :func:`torrent_facts`) against what the host expects: its
    root is the commit, it is private, its files are exactly the listing's non-empty files
    with the listing's sizes, and (when the control node gave one) its v1 infohash.
    Returns the RepoFiles it carries, in the torrent's order. Raises P2PError naming the
    first difference."""
    if info.get("name") != commit:
        raise P2PError(f"the torrent's root is {info.get('name')!r:.60}, not the commit "
                       f"{commit}: it was made for another revision; make it again.")
    if not info.get("private"):
        raise P2PError("the torrent is not private (DHT and peer exchange would announce it "
                       "outside the fleet); make it with gpufleet.p2p.make_torrent.")
    if infohash is not None and info.get("infohash") != infohash:
        raise P2PError(f"the torrent's infohash {info.get('infohash')} is not the one the "
                       f"control node announced ({infohash}); refusing it.")
    by_path = {f.path: f for f in listing}
    carried = []
    for path, size in info.get("files") or []:
        try:
            safe_relpath(path)
        except UnsafePathError as exc:
            raise P2PError(f"the torrent names an unsafe path: {exc}") from None
        f = by_path.get(path)
        if f is None:
            raise P2PError(f"the torrent carries {path!r:.200}, which the listing (manifest) "
                           "of this commit does not have; refusing the torrent.")
        if f.size != size:
            raise P2PError(f"the torrent gives {path!r:.200} {size} bytes, the listing "
                           f"{f.size}; refusing the torrent.")
        carried.append(f)
    missing = sorted(set(p for p, f in by_path.items() if f.size) - {f.path for f in carried})
    if missing:
        raise P2PError(f"the torrent lacks {missing[0]!r:.200} (and {len(missing) - 1} more "
                       "listed files); make it again from the complete manifest.")
    return carried


def _bdecode_at(data, i):
    """(value, end) of the bencoded value at data[i] (dict keys as bytes)."""
    c = data[i:i + 1]
    if c == b"i":
        end = data.index(b"e", i)
        return int(data[i + 1:end]), end + 1
    if c in (b"l", b"d"):
        i += 1
        items = []
        while data[i:i + 1] != b"e":
            value, i = _bdecode_at(data, i)
            items.append(value)
        if c == b"l":
            return items, i + 1
        return dict(zip(items[::2], items[1::2])), i + 1
    if c.isdigit():
        colon = data.index(b":", i)
        start = colon + 1
        end = start + int(data[i:colon])
        if end > len(data):
            raise ValueError("string past the end")
        return data[start:end], end
    raise ValueError(f"unexpected byte {c!r} at {i}")


def infohashes(data):
    """(v1 sha1, v2 sha256) hex of a torrent's info dict, in plain Python: what the
    control node checks against the announced infohash without libtorrent. Raises
    P2PError for bytes that are not a torrent."""
    try:
        if data[:1] != b"d":
            raise ValueError("not a dictionary")
        i = 1
        while data[i:i + 1] != b"e":
            key, i = _bdecode_at(data, i)
            start = i
            _value, i = _bdecode_at(data, i)
            if key == b"info":
                info = data[start:i]
                return (hashlib.sha1(info).hexdigest(),  # noqa: S324 - BEP 3's infohash
                        hashlib.sha256(info).hexdigest())
    except (ValueError, IndexError, RecursionError) as exc:
        raise P2PError(f"the torrent is not valid bencode ({exc}); make it again.") from None
    raise P2PError("the torrent has no info dictionary; make it again.")


# ---------------------------------------------------------------- the session

def allow_list(peers, mirror=None):
    """Sorted, de-duplicated IP addresses the session may talk to: the inventory's peers
    and the mirror's address. Names are refused (the role passes the addresses Ansible
    gathered): a name would be resolved differently by each host."""
    out = set()
    for value in list(peers or []) + ([mirror] if mirror else []):
        try:
            if not isinstance(value, str) or value != value.strip():
                raise ValueError(value)
            addr = ipaddress.ip_address(value)
        except ValueError:
            raise P2PError(f"peer address {value!r:.80} is not an IP address; give the "
                           "inventory hosts' addresses (for example ansible_host), not "
                           "names or networks.") from None
        if addr.is_unspecified or addr.is_multicast:
            raise P2PError(f"peer address {value} is unspecified or multicast: not a host.")
        out.add(addr)
    if not out:
        raise P2PError("the allow-list is empty: give at least one peer or the mirror.")
    return [str(a) for a in sorted(out, key=lambda a: (a.version, a))]


def ip_filter_rules(allowed):
    """(first, last, blocked) ranges: everything blocked, each allowed address open."""
    rules = [("0.0.0.0", "255.255.255.255", True),
             ("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", True)]
    rules += [(a, a, False) for a in allowed]
    return rules


def settings(listen_address, port=DEFAULT_PORT, upload_rate=0, download_rate=0):
    """libtorrent settings_pack of a fleet session: private to the fleet, one address."""
    try:
        addr = ipaddress.ip_address(listen_address)
    except ValueError:
        raise P2PError(f"listen address {listen_address!r:.80} is not an IP address: give "
                       "the host's fleet address.") from None
    if addr.is_unspecified:
        raise P2PError("listen address 0.0.0.0/:: would listen on every interface; give "
                       "the host's fleet address.")
    try:
        port = grammar.port(port, "listen port")
    except grammar.GrammarError as exc:
        raise P2PError(str(exc)) from None
    host = f"[{addr}]" if addr.version == 6 else str(addr)
    return {
        "listen_interfaces": f"{host}:{port}",
        "outgoing_interfaces": str(addr),
        "enable_dht": False, "enable_lsd": False, "enable_upnp": False,
        "enable_natpmp": False, "enable_incoming_utp": False, "enable_outgoing_utp": False,
        "enable_incoming_tcp": True, "enable_outgoing_tcp": True,
        "allow_multiple_connections_per_ip": False,
        "ban_web_seeds": True,
        "upload_rate_limit": int(upload_rate), "download_rate_limit": int(download_rate),
        "user_agent": "gpufleet-p2p", "peer_fingerprint": "-GF0001-",
        "announce_to_all_trackers": False,
        # plaintext only: RC4 obfuscation gives no confidentiality, integrity comes from
        # the piece hashes and hf_model's file hashes, and the fleet network is the fence
        "out_enc_policy": 2, "in_enc_policy": 2,
        "handshake_client_version": "gpufleet",
    }


def web_seed_verdict(url, status, headers):
    """A probe of the web seed (GET with ``Range: bytes=0-0``) -> None when usable, else
    the reason it is refused. A server that ignores Range cannot be a BEP 19 seed."""
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    if status == 206 and re.match(r"^bytes 0-0/\d+$", headers.get("content-range", "")):
        return None
    return (f"the web seed {url} ignores Range (answered {status}, Content-Range "
            f"{headers.get('content-range')!r}): {_OLAH_HINT}. Use the site mirror "
            "(hf_site_mirror, nginx) as the p2p web seed, or model_fetch_transport: http.")


def probe_web_seed(base_url, commit, path, timeout=10):
    """Ask the web seed for the first byte of one file; P2PError when it cannot serve
    pieces (web_seed_verdict), or cannot be reached."""
    import requests  # noqa: PLC0415 - hub needs it anyway; kept out of the decisions

    url = f"{base_url}{commit}/{path}"
    try:
        with requests.get(url, headers={"Range": "bytes=0-0"}, stream=True,
                          timeout=timeout, allow_redirects=False) as r:
            why = web_seed_verdict(url, r.status_code, dict(r.headers))
    except requests.RequestException as exc:
        raise WebSeedDown(f"the web seed {url} did not answer ({type(exc).__name__}); start "
                          "the site mirror or leave the web seed out.") from None
    if why:
        raise P2PError(why)


def web_seed_url(endpoint, repo_id):
    """BEP 19 base URL: libtorrent appends ``<commit>/<path>`` (the torrent's root and a
    file's path), giving the site mirror's ``/<repo>/resolve/<commit>/<path>``."""
    validate_repo_id(repo_id)
    if not re.match(r"^https?://[^/\s]+/?$", str(endpoint)):
        raise P2PError(f"web seed endpoint {endpoint!r:.80} is not http(s)://host[:port].")
    return f"{str(endpoint).rstrip('/')}/{repo_id}/resolve/"


# ---------------------------------------------------------------- files

def partial_root(dest):
    """dest/.gpufleet/p2p: libtorrent's save_path; files land in <commit>/<path> below."""
    return os.path.join(dest, STATE_DIR, P2P_DIR)


def verify_file(path, f):
    """hf_model's rule on a file: None when its bytes hash to the listing's digest (and
    the lock's sha256, if pinned), else a description of the mismatch."""
    h = f.hasher()
    with _open_nofollow(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    got = h.hexdigest()
    if got != f.digest:
        return f"{f.path}: {f.algorithm} {got}, the listing gives {f.digest}"
    pinned = f.pinned_ok(h)
    if pinned is not None and pinned != f.pinned:
        return f"{f.path}: sha256 {pinned}, the lock pins {f.pinned}"
    return None


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
    }


# ---------------------------------------------------------------- engine (libtorrent)

def _lt():
    try:
        import libtorrent  # noqa: PLC0415 - optional engine, only where p2p is used
    except ImportError:
        raise P2PError("p2p needs libtorrent: install the Debian package python3-libtorrent "
                       "(or model_fetch_transport: http).") from None
    return libtorrent


def torrent_facts(data):
    """{name, private, infohash, infohash_v2, piece_size, num_pieces, files} of torrent
    bytes (files: [(path below the root, size)], pad files left out)."""
    lt = _lt()
    ti = lt.torrent_info(lt.bdecode(data))
    fs = ti.files()
    files = []
    for i in range(fs.num_files()):
        if fs.file_flags(i) & lt.file_storage.flag_pad_file:
            continue
        path = fs.file_path(i).replace(os.sep, "/")
        root, _sep, rel = path.partition("/")
        files.append((rel, fs.file_size(i)))
    hashes = ti.info_hashes()
    return {"name": ti.name(), "private": ti.priv(), "infohash": str(hashes.v1),
            "infohash_v2": str(hashes.v2), "piece_size": ti.piece_length(),
            "num_pieces": ti.num_pieces(), "files": files}


def make_torrent(model):
    """Torrent bytes of a verified model (hub_mirror.read_model_folder's answer): hybrid
    v1+v2, canonical file order, private, no creation date, creator or web seed (those
    lie outside the info dict anyway): two makes of one folder give the same bytes."""
    lt = _lt()
    commit, files = torrent_files(model)
    fs = lt.file_storage()
    for path, size in files:
        fs.add_file(f"{commit}/{path}", size)
    ct = lt.create_torrent(fs, piece_size(sum(s for _path, s in files)),
                           flags=lt.create_torrent.canonical_files)
    ct.set_priv(True)
    with tempfile.TemporaryDirectory(prefix="gpufleet-p2p-") as tmp:
        os.symlink(model["folder"], os.path.join(tmp, commit))
        lt.set_piece_hashes(ct, tmp)
    entry = ct.generate()
    for key in (b"creation date", b"created by", b"url-list", b"announce", b"comment"):
        entry.pop(key, None)
    return lt.bencode(entry)


def _ip(endpoint):
    return str(endpoint[0]) if isinstance(endpoint, tuple) else str(endpoint)


def _url_host(url):
    if not url:
        return None
    from urllib.parse import urlsplit  # noqa: PLC0415
    return urlsplit(url).hostname


def _block_bytes(ti, piece, block, block_size=16 << 10):
    """Bytes of one block (16 KiB, the last of a piece may be shorter)."""
    return max(0, min(block_size, ti.piece_size(piece) - block * block_size))


def run_peer(job, log=None):
    """One host's session until it is done: `job` (a dict, JSON-able):

    torrent (path), dest, listing ([{path, size, algorithm, digest, pinned}]), commit,
    infohash (optional), listen ("addr"), port, peers (["addr:port"]), allow (addresses),
    web_seed (base URL, origin host only; probed first unless probe_web_seed is false:
    one that ignores Range fails the run, one that does not answer is left out),
    seed_only (dest is verified already),
    stop_file (seeding ends when it exists; without one the run ends when complete),
    upload_rate / download_rate (bytes/s, 0: no cap), timeout (seconds for the whole run).
    Returns summary() plus bytes and events. Files are verified with hf_model's rule
    before they get their final name; a complete run writes dest's manifest."""
    lt = _lt()
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
    if job.get("web_seed"):
        try:
            if job.get("probe_web_seed", True):
                probe_web_seed(job["web_seed"], job["commit"], carried[0].path)
            atp.url_seeds = [job["web_seed"]]
        except WebSeedDown as exc:  # a seed that ignores Range is refused (P2PError)
            note("web_seed_down", message=str(exc))
    h = ses.add_torrent(atp)
    for peer in job.get("peers") or []:
        host, _sep, port = peer.rpartition(":")
        h.connect_peer((host.strip("[]"), int(port)))

    files = atp.ti.files()
    index = {}
    for i in range(files.num_files()):
        rel = files.file_path(i).replace(os.sep, "/").partition("/")[2]
        index[i] = rel
    by_path = {f.path: f for f in carried}
    done, rejected = set(), set()
    if job.get("seed_only"):
        done = set(by_path)
    by_peer = {}  # bytes of blocks received, by the sender's address
    ti = atp.ti
    mirror_ip = _url_host(job.get("web_seed"))
    deadline = start + float(job.get("timeout", 600))
    finished_at = None
    while time.monotonic() < deadline:
        completed = []
        for a in ses.pop_alerts():
            if isinstance(a, lt.file_completed_alert):
                completed.append(int(a.index))
            elif isinstance(a, lt.block_finished_alert):
                ip = _ip(a.endpoint)
                by_peer[ip] = by_peer.get(ip, 0) + _block_bytes(ti, int(a.piece_index),
                                                                int(a.block_index))
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
            progress = h.file_progress(lt.torrent_handle.piece_granularity)
            completed += [i for i, rel in index.items()
                          if rel in by_path and progress[i] == by_path[rel].size]
        for i in completed:
            rel = index.get(i)
            f = by_path.get(rel)
            if f is None or rel in done or rel in rejected:
                continue
            partial = path_under(os.path.join(save, job["commit"]), rel)
            bad = verify_file(partial, f)
            if bad:
                rejected.add(rel)
                note("rejected", path=rel, why=bad)
            else:
                place_file(dest, partial, f)
                done.add(rel)
                note("placed", path=rel)
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
    from_sources = {"peers": sum(n for ip, n in by_peer.items() if ip != mirror_ip),
                    "web_seed": by_peer.get(mirror_ip, 0)}
    result = summary(events, carried)
    result.update({"infohash": facts["infohash"], "events": events,
                   "payload_downloaded": st.total_payload_download,
                   "payload_uploaded": st.total_payload_upload,
                   "bytes_by_source": from_sources, "bytes_by_peer": by_peer,
                   "seconds": round(time.monotonic() - start, 3)})
    ses.remove_torrent(h)
    del ses
    return result


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
            with _open_nofollow(final, "wb"):
                pass
            if verify_file(final, f):
                raise P2PError(f"{f.path}: an empty file does not hash to the listing's digest.")
    write_manifest(dest, job.get("repo_id", ""), job.get("revision", job["commit"]),
                   job["commit"], job.get("endpoint", "p2p"), manifest_entries(dest, listing))


def cleanup(dest, commit):
    """Remove the partial area once seeding has stopped (dest's files are other links)."""
    shutil.rmtree(os.path.join(partial_root(dest), commit), ignore_errors=True)
