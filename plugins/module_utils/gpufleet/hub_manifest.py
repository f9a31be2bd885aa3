"""dest's state folder (.gpufleet): the verified manifest and what a re-run may trust.

The manifest (``dest/.gpufleet/manifest.json``: commit, files, sizes, hashes, mtimes,
verification time; never the token) lets a re-run trust files whose size and mtime are
unchanged instead of re-hashing hundreds of GB. State files are opened without following
links and replaced atomically.
"""
from __future__ import annotations

import datetime
import json
import os
import threading

from .hub_names import STATE_DIR, path_under, redact_url

MANIFEST_NAME = "manifest.json"
PROGRESS_NAME = "progress.json"
MANIFEST_FORMAT = 1


def state_dir(dest):
    return os.path.join(dest, STATE_DIR)


def state_path(dest, *names):
    """dest/.gpufleet/NAMES..., refusing symbolic links on the way (UnsafePathError)."""
    return path_under(dest, "/".join((STATE_DIR,) + names))


def open_nofollow(path, mode):
    """open() that never follows a symbolic link at path (OSError ELOOP instead)."""
    flags = {"rb": os.O_RDONLY, "rb+": os.O_RDWR, "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
             "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC}[mode]
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {}))


def load_manifest(dest):
    """The manifest's files dict ({} when absent or unreadable: then nothing is trusted)."""
    files = read_manifest(dest).get("files")
    return files if isinstance(files, dict) else {}


def read_manifest(dest):
    """The whole manifest ({} when absent, unreadable or of another format)."""
    path = state_path(dest, MANIFEST_NAME)
    try:
        with open_nofollow(path, "rb") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        return {}
    return data


def write_json_atomic(path, data):
    """Replace path atomically, keeping the mode and owner a role may have given it."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open_nofollow(tmp, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        pass
    else:
        os.chmod(tmp, st.st_mode & 0o7777)
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except PermissionError:
            pass
    os.replace(tmp, path)


def manifest_trusts(entry, f, st):
    """verify=manifest: the manifest's hash is the listing's and size+mtime are unchanged."""
    return (isinstance(entry, dict) and entry.get(f.algorithm) == f.digest
            and (not f.pinned or entry.get("lock_sha256") == f.pinned)
            and entry.get("size") == f.size == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns)


def manifest_outdated(entry, f, st):
    """The manifest verified this file with another hash (an earlier revision), and it
    has not been touched since: replace it without hashing or quarantining it."""
    return (isinstance(entry, dict) and entry.get("size") == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns
            and any(entry.get(a) not in (None, f.digest) for a in ("sha256", "sha1")))


def manifest_entries(dest, files):
    """{path: {size, sha256|sha1, mtime_ns}} of RepoFiles whose bytes were verified."""
    entries = {}
    for f in files:
        st = os.lstat(path_under(dest, f.path, final_may_be_link=True))
        entries[f.path] = {"size": f.size, f.algorithm: f.digest, "mtime_ns": st.st_mtime_ns}
        if f.pinned:  # the lock's sha256, checked on these bytes (model_lock)
            entries[f.path]["lock_sha256"] = f.pinned
    return entries


def write_manifest(dest, repo_id, revision, commit, endpoint, entries, complete=True):
    """dest/.gpufleet/manifest.json: what was verified, when, from where (never a token)."""
    os.makedirs(state_path(dest), exist_ok=True)
    write_json_atomic(state_path(dest, MANIFEST_NAME), {
        "format": MANIFEST_FORMAT, "repo_id": repo_id, "revision": revision,
        "commit": commit, "endpoint": redact_url(endpoint), "verified_at": utc_now(),
        "complete": complete, "files": entries})


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
