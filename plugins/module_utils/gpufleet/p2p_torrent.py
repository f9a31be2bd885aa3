"""What a torrent of a verified model folder holds, and the checks a host applies to one.

:func:`torrent_files` / :func:`piece_size`: the files of a *complete, verified* hf_model
manifest (hub_mirror.read_model_folder checks that every file still has the size and mtime
it had when it was verified), sorted, under a root folder named after the commit. Web seeds
(BEP 19) then address a file as ``<endpoint>/<repo>/resolve/`` + ``<commit>/<path>``: the
site mirror's own URL. :func:`check_torrent`: a torrent handed to a host must list exactly
the listing's files (paths and sizes) under its commit, be private, and have the infohash
the control node announced. :func:`make_torrent` / :func:`write_torrents`: the mirror's
torrents, made with libtorrent (imported when called, :func:`load_libtorrent`).
"""
from __future__ import annotations

import hashlib
import os
import tempfile

from .hub_errors import UnsafePathError
from .hub_names import HEX40, safe_relpath, validate_repo_id
from .p2p_errors import P2PError

MIN_PIECE = 16 << 10  # BitTorrent v2 pieces: a power of two, at least 16 KiB
MAX_PIECE = 16 << 20
TARGET_PIECES = 2000


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
    if not isinstance(commit, str) or not HEX40.match(commit):
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


def load_libtorrent():
    try:
        import libtorrent  # noqa: PLC0415 - optional engine, only where p2p is used
    except ImportError:
        raise P2PError("p2p needs libtorrent: install the Debian package python3-libtorrent "
                       "(or model_fetch_transport: http).") from None
    return libtorrent


def torrent_facts(data):
    """{name, private, infohash, infohash_v2, piece_size, num_pieces, files} of torrent
    bytes (files: [(path below the root, size)], pad files left out)."""
    lt = load_libtorrent()
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
    lt = load_libtorrent()
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
    from .hub_manifest import write_json_atomic  # noqa: PLC0415

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
                write_json_atomic(base + ".json", facts)
        out.append(dict(facts, torrent=base + ".torrent", changed=not same))
    return out, changed
