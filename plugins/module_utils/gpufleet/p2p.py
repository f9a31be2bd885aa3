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
- :func:`web_seed_delay` / :class:`WebSeedGate`: the web-seed policy, so that the mirror
  sends about one copy whatever the fleet's size: the first host(s) of the swarm (the
  inventory's order) use the web seed from the start; the others fetch from peers only
  and add the web seed once no peer delivered a block for ``fallback`` seconds (a fleet
  of one, or one whose other hosts are down, still completes).
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
                  _open_nofollow, manifest_entries, path_under, safe_relpath, state_path,
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
        # a fleet peer that dropped a connection is dialled again within seconds (run_peer
        # redials the inventory's peers it has no connection with), not after a minute
        "min_reconnect_time": 2,
        "ban_web_seeds": True,
        "upload_rate_limit": int(upload_rate), "download_rate_limit": int(download_rate),
        "user_agent": "gpufleet-p2p", "peer_fingerprint": "-GF0001-",
        "announce_to_all_trackers": False,
        # plaintext only: RC4 obfuscation gives no confidentiality, integrity comes from
        # the piece hashes and hf_model's file hashes, and the fleet network is the fence
        "out_enc_policy": 2, "in_enc_policy": 2,
        "handshake_client_version": "gpufleet",
    }


REDIAL = 2.0  # seconds between dials of the inventory's peers a host has no connection with
# seconds a file libtorrent calls complete may fail hf_model's check, its cache flushed and
# the file looked at again once a second, before it is rejected (check_completed)
FLUSH_GRACE = 5.0
WEB_SEED_HOSTS = 1  # hosts of the swarm that use the web seed from the start
WEB_SEED_FALLBACK = 30.0  # seconds without a peer's block before the others add it


def web_seed_delay(host, hosts, first=WEB_SEED_HOSTS, fallback=WEB_SEED_FALLBACK):
    """Seconds `host` fetches from peers only before it may add the web seed: 0 for the
    first `first` of `hosts` (the swarm's hosts taking part, in the inventory's order: the
    same answer on every host), `fallback` for the others. A host not in `hosts` is
    refused (it would not be among its peers' allow-lists)."""
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise P2PError(f"model_fetch_p2p_web_seed_hosts must be a whole number from 0 (no "
                       f"host from the start) up, not {first!r:.40}.")
    if isinstance(fallback, bool) or not isinstance(fallback, (int, float)) \
            or not 0 < fallback <= 86400:
        raise P2PError(f"model_fetch_p2p_web_seed_fallback must be a number of seconds "
                       f"above 0 and at most 86400, not {fallback!r:.40}.")
    hosts = list(hosts or [])
    if host not in hosts:
        raise P2PError(f"host {host!r:.80} is not among the swarm's hosts "
                       f"({', '.join(map(str, hosts[:5])) or 'none'}); put it in "
                       "model_fetch_p2p_group.")
    return 0 if hosts.index(host) < first else fallback


class WebSeedGate:
    """When a host that starts with peers only adds the web seed: once no peer has
    delivered a block for `delay` seconds (counted from the start, then from each peer
    block), so a swarm whose peers stall, or a fleet of one, still completes. delay 0:
    open from the start."""

    def __init__(self, delay, start):
        self.delay, self.last_peer, self.opened_at = float(delay), start, None
        if self.delay <= 0:
            self.opened_at = start

    def peer_block(self, now):
        self.last_peer = max(self.last_peer, now)

    def due(self, now):
        """True once, when the web seed is to be added now."""
        if self.opened_at is not None or now - self.last_peer < self.delay:
            return False
        self.opened_at = now
        return True


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
    mirror_ip = _url_host(job.get("web_seed"))
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
            with _open_nofollow(final, "wb"):
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


# ---------------------------------------------------------------- fleet wiring (model_fetch)

TRANSPORTS = ("http", "p2p")
# After a host's files are verified: seed until the rollout's end (the role's p2p_stop
# entry point, run by playbooks/site.yml's Models play and playbooks/upgrade.yml at their
# end; at most seed_max seconds), until told (forever: only p2p_stop with force, or a new
# commit of the model, stops it), or not at all.
SEED_POLICIES = ("until_rollout_end", "forever", "never")
SEEDER_STATE = "p2p-seeder.json"  # ROOT/.gpufleet-revisions/NAME/: one seeder per model
SEEDER_STOP = "p2p-stop"
SEEDER_LOG = "p2p-seeder.log"
MAX_RATE = 2 ** 40  # bytes/s: a cap above 1 TiB/s is a typo


def _whole(value, name, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise P2PError(f"{name} must be a whole number from {low} to {high}, not {value!r:.40}.")
    return value


def check_settings(transport, seed, upload_rate, download_rate, port,
                   web_seed_hosts=WEB_SEED_HOSTS, web_seed_fallback=WEB_SEED_FALLBACK):
    """The fleet-wide p2p settings of model_fetch (preflight): a list of problems, each
    naming the variable and what it takes (empty: fine)."""
    problems = []
    try:  # the web-seed policy's own rule, on a swarm of one
        web_seed_delay("-", ["-"], web_seed_hosts, web_seed_fallback)
    except P2PError as exc:
        problems.append(str(exc).rstrip("."))
    if transport not in TRANSPORTS:
        problems.append(f"model_fetch_transport is {transport!r:.40}: give http or p2p")
    if seed not in SEED_POLICIES:
        problems.append(f"model_fetch_p2p_seed is {seed!r:.40}: give one of "
                        f"{', '.join(SEED_POLICIES)}")
    for name, value in (("model_fetch_p2p_upload_rate", upload_rate),
                        ("model_fetch_p2p_download_rate", download_rate)):
        try:
            _whole(value, name, 0, MAX_RATE)
        except P2PError as exc:
            problems.append(str(exc).rstrip("."))
    try:
        _port(port, "model_fetch_p2p_port")
    except P2PError as exc:
        problems.append(str(exc).rstrip("."))
    return problems


def _port(value, name):
    """grammar.port (the one rule of a TCP port), as a P2PError."""
    try:
        return grammar.port(value, name)
    except grammar.GrammarError as exc:
        raise P2PError(str(exc)) from None


def port_option(name, value, show=None):
    """A module option's rule (options.check) for a swarm's port: grammar.port."""
    from .options import OptionError  # noqa: PLC0415

    try:
        return grammar.port(value, name)
    except grammar.GrammarError as exc:
        raise OptionError(str(exc)) from None


def model_transports(items, default):
    """{repo_id: transport} of model_fetch's items (an item's `transport` overrides the
    fleet's), and the problems (a transport that is neither http nor p2p)."""
    out, problems = {}, []
    for item in items or []:
        transport = item.get("transport", default)
        if transport not in TRANSPORTS:
            problems.append(f"model {item.get('repo_id')!r:.80}: transport {transport!r:.40} "
                            "is neither http nor p2p")
        out[item.get("repo_id")] = transport
    return out, problems


def model_port(base, index):
    """The listen port of the index-th model of model_fetch_models: one per model, the
    same on every host (its peers dial it), so two models' seeders never share one."""
    base = _port(base, "model_fetch_p2p_port")
    return _port(base + int(index), f"model_fetch_p2p_port + {int(index)} (the model's place "
                 "in model_fetch_models)")


def fleet_addresses(hosts, hostvars):
    """[(host, address)] of the inventory's p2p hosts and the problems: each host's fleet
    address by the one rule other roles use (serve.reachable_address: the operator's
    model_fetch_p2p_address, else the inventory's ansible_host, else the host's name),
    which must be an IP address (a name would be resolved differently by each peer)."""
    from .serve import reachable_address  # noqa: PLC0415 - plain Python, no cycle

    out, problems = [], []
    for host in hosts or []:
        hv = hostvars.get(host, {}) if hasattr(hostvars, "get") else {}
        addr = reachable_address("0.0.0.0", hv.get("model_fetch_p2p_address", ""),
                                 hv.get("ansible_host", host))
        try:
            allow_list([addr])
        except P2PError:
            problems.append(f"{host}: its fleet address {addr!r:.80} is not an IP address; "
                            "set model_fetch_p2p_address (or ansible_host) to the address "
                            "the other GPU hosts reach it at")
            continue
        out.append((host, addr))
    return out, problems


def peer_job(opts, repo_id, endpoint):
    """run_peer's job (without dest, listing, commit) from hf_model's p2p options: the
    host's listen address, the other fleet hosts' addr:port, the allow-list (those and
    the mirror) and the web seed URL (None without one), caps and timeout."""
    listen = opts.get("listen")
    try:
        listen = allow_list([listen])[0]
        fleet = allow_list(list(opts.get("peers") or []) + [listen])
    except P2PError as exc:
        raise P2PError(f"p2p.listen / p2p.peers: {exc}") from None
    port = opts.get("port", DEFAULT_PORT)
    others = [a for a in fleet if a != listen]
    peers = [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in others]
    seed_url = web_seed_url(endpoint, repo_id) if opts.get("web_seed", True) else None
    mirror = opts.get("mirror_address") or (_url_host(seed_url) if seed_url else None)
    if seed_url:
        try:
            allow_list([mirror])
        except P2PError:
            raise P2PError(f"the web seed's host {mirror!r:.80} is not an IP address: set "
                           "model_fetch_p2p_mirror_address to the site mirror's address "
                           "(libtorrent's filter allows addresses, not names).") from None
    job = {"listen": listen, "port": port, "peers": peers,
           "allow": allow_list(fleet, mirror if seed_url else None), "web_seed": seed_url,
           "torrent": opts.get("torrent"), "infohash": opts.get("infohash") or None,
           "upload_rate": opts.get("upload_rate", 0) or 0,
           "download_rate": opts.get("download_rate", 0) or 0,
           "timeout": opts.get("timeout", 3600),
           "web_seed_delay": opts.get("web_seed_delay", 0) or 0,
           "seed": opts.get("seed", "until_rollout_end"), "seed_max": opts.get("seed_max", 86400)}
    for name in ("upload_rate", "download_rate"):
        _whole(job[name], f"p2p.{name} (bytes/s, 0: no cap)", 0, MAX_RATE)
    if isinstance(job["web_seed_delay"], bool) \
            or not isinstance(job["web_seed_delay"], (int, float)) \
            or not 0 <= job["web_seed_delay"] <= 86400:
        raise P2PError(f"p2p.web_seed_delay must be a number of seconds from 0 to 86400, "
                       f"not {job['web_seed_delay']!r:.40}.")
    if not isinstance(job["timeout"], (int, float)) or job["timeout"] <= 0:
        raise P2PError(f"p2p.timeout must be a number of seconds above 0, not "
                       f"{job['timeout']!r:.40}.")
    settings(listen, port, job["upload_rate"], job["download_rate"])  # refuses a bad port
    return job


def seeds_after_fetch(policy):
    """Whether a host keeps seeding once its files are verified."""
    if policy not in SEED_POLICIES:
        raise P2PError(f"seed policy {policy!r:.40} is not one of {', '.join(SEED_POLICIES)}.")
    return policy != "never"


def stops_at_rollout_end(policy, force=False):
    """Whether the role's p2p_stop entry point stops a seeder of this policy."""
    return force or policy == "until_rollout_end"


def check_plan(result, job):
    """What check mode says about a p2p fetch: bytes from where, nothing changed."""
    return {"transport": "p2p", "would_fetch_bytes": result.get("bytes_to_download", 0),
            "from_peers": job.get("peers", []), "web_seed": job.get("web_seed"),
            "web_seed_delay": job.get("web_seed_delay", 0),
            "listen": f"{job.get('listen')}:{job.get('port')}"}


# ---------------------------------------------------------------- fetch (hub.sync_repo's runner)

def _progress_writer(path, total_files, total_bytes):
    from .hub import _write_json_atomic  # noqa: PLC0415

    def write(files_done, verified, by_source):
        if not path:
            return
        got = int(by_source.get("peers", 0)) + int(by_source.get("web_seed", 0))
        _write_json_atomic(path, {
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
        from .hub import _Stats  # noqa: PLC0415

        total = sum(f.size for f, _state in plan)
        fetcher.stats = _Stats(fetcher.dest, len(plan), total, False)
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
    if state.get("dest") and _HEX40.match(str(state.get("commit", ""))):
        cleanup(state["dest"], state["commit"])  # nothing seeds from it any more
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
                result = run_peer(job, log=say)
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
    from .hub import _write_json_atomic  # noqa: PLC0415
    _write_json_atomic(state_file, state)
    return dict(state, running=True)


def ensure_seeder(store, job, policy, check_mode=False):
    """The model's seeder after a fetch, by policy: (changed, state). One seeder per model
    folder: one for another commit is stopped first; one already seeding this commit is
    left as it is (idempotent)."""
    state = seeder_state(store)
    if not seeds_after_fetch(policy):
        if not check_mode and not (state and state["running"]
                                   and state.get("dest") == job["dest"]):
            cleanup(job["dest"], job["commit"])  # nothing will seed from the partial area
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


# ---------------------------------------------------------------- the mirror's torrents

def torrent_name(repo_id):
    """File name (without extension) of a repo's torrent in the mirror's torrent folder:
    one per repo, for the commit the mirror serves (its root names that commit)."""
    return validate_repo_id(repo_id).replace("/", "--")


def write_torrents(out_dir, models, check_mode=False):
    """Torrents of the mirror's verified folders (hub_mirror.read_model_folder's answers):
    out_dir/<org--name>.torrent and .json ({repo_id, commit, infohash, infohash_v2}),
    written only when their bytes change (make_torrent is deterministic). Returns
    ([{repo_id, commit, infohash, torrent, changed}], changed paths)."""
    from .hub import _write_json_atomic  # noqa: PLC0415

    out, changed = [], []
    for model in models:
        base = os.path.join(out_dir, torrent_name(model["repo_id"]))
        data = make_torrent(model)
        v1, v2 = infohashes(data)
        facts = {"repo_id": model["repo_id"], "commit": model["commit"], "infohash": v1,
                 "infohash_v2": v2}
        try:
            with open(base + ".torrent", "rb") as fh:
                same = fh.read() == data
        except OSError:
            same = False
        if not same:
            changed.append(base + ".torrent")
            if not check_mode:
                os.makedirs(out_dir, mode=0o755, exist_ok=True)
                tmp = f"{base}.torrent.tmp{os.getpid()}"
                with open(tmp, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, base + ".torrent")
                _write_json_atomic(base + ".json", facts)
        out.append(dict(facts, torrent=base + ".torrent", changed=not same))
    return out, changed
