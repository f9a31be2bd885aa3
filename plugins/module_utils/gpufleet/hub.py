"""Verified model fetch from a Hugging Face hub or mirror (pure Python + requests).

What it does, and where the protocol comes from (huggingface_hub 1.x, constants.py,
file_download.py, hf_api.py; ../shared/notes/vllm-hf-facts.md):

- ``GET {endpoint}/api/models/{repo}/revision/{rev}`` -> ``sha`` (the commit).
- ``GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true`` (paginated with a
  ``Link: <...>; rel="next"`` header) -> ``path``, ``size``, ``oid`` (git blob sha1) and,
  for LFS files, ``lfs.oid`` (sha256 of the content).
- ``GET {endpoint}/{repo}/resolve/{commit}/{path}`` with ``Range: bytes=N-`` -> 206 (or
  200 from mirrors that ignore Range, e.g. olah 0.5.4); LFS files may redirect.
- git blob sha1 = sha1(b"blob " + str(size) + b"\\0" + content).

Every byte is hashed while it streams in (one read of the bytes), partial files live in
``dest/.gpufleet/incomplete/`` and only a file whose hash matched the listing is moved
(``os.replace``) to its final name. A verified manifest (``dest/.gpufleet/manifest.json``:
commit, files, sizes, hashes, mtimes, verification time; never the token) lets a re-run
trust files whose size and mtime are unchanged instead of re-hashing hundreds of GB.
No Ansible imports: the module ``plugins/modules/hf_model.py`` is a thin shell around
:func:`sync_repo`. This file holds the entry points (sync_repo, lock_from_hub,
lock_from_folder); the rules they apply are in hub_names (names, paths, URLs), hub_listing
(the listing), hub_client (HTTP), hub_manifest (the state folder) and hub_fetch (the bytes).
The errors are named here in __all__ (hub_errors, hub_fetch).
"""
from __future__ import annotations

import fcntl
import hashlib
import os

from . import model_lock
from .hub_client import CHUNK
from .hub_errors import (DeadlineError, DiskSpaceError, HubError, LockMismatchError,
                         UnsafePathError)
from .hub_fetch import Fetcher, ShortFileError, VerificationError, check_disk_space
from .hub_listing import RepoFile, filter_files
from .hub_manifest import (MANIFEST_NAME, load_manifest, manifest_entries, manifest_trusts,
                           open_nofollow, read_manifest, state_path, utc_now, write_manifest)
from .hub_names import (HEX40, STATE_DIR, path_under, redact_url, safe_relpath, validate_name,
                        validate_repo_id)

__all__ = [
    "DeadlineError", "DiskSpaceError", "HubError", "LockMismatchError", "ShortFileError",
    "UnsafePathError", "VerificationError",
    "VERIFY_MODES", "leftovers", "lock_from_folder", "lock_from_hub", "sync_repo",
]

VERIFY_MODES = ("full", "manifest")


class _Lock:
    """One fetch per dest at a time (fcntl lock on dest/.gpufleet/lock)."""

    def __init__(self, dest):
        os.makedirs(state_path(dest), exist_ok=True)
        self.fh = open_nofollow(state_path(dest, "lock"), "w")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.fh.close()
            raise HubError(f"another fetch is writing into {dest}; wait for it to "
                           "finish (or stop it) and run again.") from None

    def release(self):
        self.fh.close()


def sync_repo(client, repo_id, revision, dest, allow_patterns=None, ignore_patterns=None,
              verify="manifest", max_workers=8, check_mode=False, lock=None, resolved=None,
              progress_path=None, runner=None):
    """Make dest hold the verified files of repo_id@revision. Returns a result dict.

    resolved: (commit, listing) already read from the endpoint by the caller
    (revisions.sync_revision), so they are not asked for twice. progress_path: where the
    progress file goes (default dest/.gpufleet/progress.json). runner: what brings the
    missing bytes instead of the mirror's http (p2p.Runner: runner(fetcher, plan,
    progress_path) -> (outcome, errors)), called after the disk-space check; not called
    when nothing is missing.

    lock: the model's lock (model_lock.ModelLock or its dict): the revision must resolve
    to its commit, the selected files must be the lock's (same patterns) with its sha256s,
    checked on the listing before anything is written and on every file's bytes before it
    gets its final name (LockMismatchError).

    Raises HubError (DiskSpaceError, VerificationError, LockMismatchError) with a message
    for the user.
    """
    validate_repo_id(repo_id)
    if lock is not None:
        try:
            lock = model_lock.parse_lock(lock)
            model_lock.check_commit(lock, repo_id, lock.commit)  # the lock's repo
        except model_lock.LockError as exc:
            raise LockMismatchError(str(exc)) from None
    if verify not in VERIFY_MODES:
        raise HubError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {verify!r}.")
    if int(max_workers) < 1:
        raise HubError("max_workers must be at least 1.")
    if not revision:
        raise HubError("revision must be a branch, tag or commit sha, e.g. 'main'.")
    validate_name(revision, "revision")
    dest = os.path.abspath(dest)
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise HubError(f"dest {dest} exists and is not a directory.")

    if resolved is None:
        client.start()
        commit = client.resolve_commit(repo_id, revision)
        listing = client.list_files(repo_id, commit)
    else:
        commit, listing = resolved
    if lock is not None:
        listing = _apply_lock(lock, client, repo_id, commit, listing, allow_patterns,
                              ignore_patterns)
    files = filter_files(listing, allow_patterns, ignore_patterns)
    if not files:
        raise HubError(f"no file of {repo_id}@{commit} matches allow_patterns/"
                       "ignore_patterns; check the patterns.")
    old = read_manifest(dest)
    manifest = load_manifest(dest)
    # The files of a new commit can all equal the old one's (a commit that touched only
    # files outside the patterns): the folder then holds the new commit, and the manifest
    # must say so (the deploy labels and the upgrade's last-good record read its commit).
    recommit = bool(old) and (old.get("commit"), old.get("repo_id")) != (commit, repo_id)
    fetcher = Fetcher(client, repo_id, commit, dest, verify, int(max_workers))
    plan = fetcher.classify(files, manifest)
    kept, deleted = leftovers(dest, listing, {f.path for f in files}, manifest)
    needed = fetcher.bytes_to_fetch(plan)
    check_disk_space(dest, needed, fetcher.inodes_to_create(plan))

    result = {"commit": commit, "locked": lock is not None,
              "bytes_to_download": needed, "quarantined": [],
              "removed": deleted, "manifest": state_path(dest, MANIFEST_NAME)}
    if check_mode:
        would = {"missing": "would_download", "stale": "would_download",
                 "outdated": "would_download", "present": "would_verify",
                 "trusted": "trusted"}
        result.update(changed=bool(deleted) or recommit
                      or any(would[s] == "would_download" for _file, s in plan),
                      bytes_downloaded=0,
                      bytes_verified=0,
                      files=[_file_result(f, would[s]) for f, s in plan])
        return result

    os.makedirs(dest, exist_ok=True)
    lock = _Lock(dest)
    try:
        if runner is not None and needed:
            outcome, errors = runner(fetcher, plan, progress_path=progress_path)
        else:
            outcome, errors = fetcher.run(plan, progress_path=progress_path)
        for path in deleted:
            os.unlink(path_under(dest, path, final_may_be_link=True))
        changed = _write_manifest(dest, client, repo_id, revision, commit, fetcher, plan,
                                  outcome, manifest, kept, recommit)
    finally:
        lock.release()
    changed = changed or bool(deleted) or bool(fetcher.quarantined) \
        or any(s == "downloaded" for s in outcome.values())
    result.update(
        changed=changed, quarantined=fetcher.quarantined,
        bytes_downloaded=fetcher.stats.bytes_downloaded,
        bytes_verified=fetcher.stats.bytes_verified,
        files=[_file_result(f, outcome.get(f.path, "failed")) for f, _state in plan])
    if errors:
        msgs = "; ".join(str(e) for e in errors)
        exc = HubError(f"{len(errors)} of {len(plan)} files failed: {msgs}")
        exc.result = result  # what was done before the failure, for the module's report
        raise exc
    return result


def _apply_lock(lock, client, repo_id, commit, listing, allow_patterns, ignore_patterns):
    """Check the resolved commit and the selected files against the lock (no write yet);
    returns the listing with each locked file's sha256 attached (RepoFile.pinned)."""
    try:
        model_lock.check_commit(lock, repo_id, commit, redact_url(client.endpoint))
        selected = filter_files(listing, allow_patterns, ignore_patterns)
        required = {f.path for f in filter_files(
            [RepoFile(p, 0, "sha256", d) for p, d in lock.files.items()],
            allow_patterns, ignore_patterns)}
        model_lock.check_listing(lock, selected, required)
    except model_lock.LockError as exc:
        raise LockMismatchError(str(exc)) from None
    return [RepoFile(f.path, f.size, f.algorithm, f.digest, lock.files.get(f.path))
            for f in listing]


def _file_result(f, status):
    return {"path": f.path, "size": f.size, "algorithm": f.algorithm, "digest": f.digest,
            "status": status}


def leftovers(dest, listing, planned, manifest):
    """Manifest entries outside this run's files -> (kept, deleted).

    kept: still in the repo with the same hash and untouched since verified (fetched by an
    earlier run with other patterns): they stay in the manifest. deleted: gone from the
    repo at this commit and untouched since verified: ours to remove, so no stray shard
    of an old revision is left for vLLM to load. Files we did not verify are never touched.
    """
    by_path = {f.path: f for f in listing}
    kept, deleted = {}, []
    for path, entry in sorted(manifest.items()):
        try:
            st = os.lstat(path_under(dest, safe_relpath(path), final_may_be_link=True))
        except (HubError, OSError):
            continue
        if path in planned or not isinstance(entry, dict):
            continue
        f = by_path.get(path)
        if f is not None:
            if manifest_trusts(entry, f, st):
                kept[path] = entry
        elif entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
            deleted.append(path)
    return kept, deleted


def _write_manifest(dest, client, repo_id, revision, commit, fetcher, plan, outcome, old,
                    kept, recommit=False):
    """Record the verified files; returns True when the file list or the commit changed."""
    verified = [f for f, _state in plan if f.path in outcome]
    files = {**kept, **manifest_entries(dest, verified)}
    if files == old and len(verified) == len(plan) and not recommit:
        return False
    write_manifest(dest, repo_id, revision, commit, client.endpoint, files,
                   complete=len(verified) == len(plan))
    return True


# ---------------------------------------------------------------- writing a lock

def lock_from_hub(client, repo_id, revision, max_workers=8):
    """The lock (model_lock.ModelLock) of repo_id@revision from an endpoint the operator
    trusts: the commit it resolves, the listing's sha256 of each LFS file (the weights are
    not downloaded), and the sha256 of every other file's bytes, fetched into a temporary
    folder and checked against the listing's git blob sha1 first. Every file of the
    repository, whatever patterns a fetch uses later."""
    import tempfile

    validate_repo_id(repo_id)
    validate_name(revision, "revision")
    client.start()
    commit = client.resolve_commit(repo_id, revision)
    listing = client.list_files(repo_id, commit)
    files = {f.path: f.digest for f in listing if f.algorithm == "sha256"}
    small = [f for f in listing if f.algorithm != "sha256"]
    with tempfile.TemporaryDirectory(prefix="gpufleet-lock-") as tmp:
        fetcher = Fetcher(client, repo_id, commit, tmp, "full", int(max_workers))
        _outcome, errors = fetcher.run([(f, "missing") for f in small], write_progress=False)
        if errors:
            raise HubError(f"{len(errors)} of {len(small)} files could not be read to write "
                           f"the lock; no lock was written: "
                           + "; ".join(str(e) for e in errors))
        for f in small:
            h = hashlib.sha256()
            with open_nofollow(fetcher.final_path(f), "rb") as fh:
                while chunk := fh.read(CHUNK):
                    h.update(chunk)
            files[f.path] = h.hexdigest()
    return _checked_lock(model_lock.ModelLock(repo_id, commit, files,
                                              source=redact_url(client.endpoint),
                                              written_at=utc_now()))


def _checked_lock(lock):
    """A lock just made, held to the rules every reader applies (never write one that
    hf_model would refuse to read)."""
    try:
        return model_lock.parse_lock(lock.as_dict())
    except model_lock.LockError as exc:
        raise HubError(f"no lock was written: {exc}") from None


def lock_from_folder(src):
    """The lock of a copy hf_model verified (src holds its complete manifest): every file the
    manifest lists is hashed again (sha256, and its recorded hash checked), so the lock says
    what is on disk now and the manifest vouches for where it came from."""
    src = os.path.abspath(src)
    manifest = read_manifest(src)
    if not manifest or manifest.get("complete") is not True:
        raise HubError(f"{src} holds no complete manifest ({STATE_DIR}/{MANIFEST_NAME}) of "
                       "a verified fetch; fetch it with hf_model first, from a source you "
                       "trust.")
    repo_id, commit = manifest.get("repo_id"), manifest.get("commit")
    validate_repo_id(repo_id)
    if not isinstance(commit, str) or not HEX40.match(commit):
        raise HubError(f"{src}: the manifest's commit {commit!r:.60} is not a commit sha.")
    files, problems = {}, []
    for path, entry in sorted((manifest.get("files") or {}).items()):
        safe_relpath(path)
        algorithm = "sha1" if isinstance(entry, dict) and entry.get("sha1") else "sha256"
        expected = entry.get(algorithm) if isinstance(entry, dict) else None
        f = RepoFile(path, int(entry.get("size", -1)) if isinstance(entry, dict) else -1,
                     algorithm, str(expected))
        h256, h = hashlib.sha256(), f.hasher()
        try:
            with open_nofollow(path_under(src, path), "rb") as fh:
                while chunk := fh.read(CHUNK):
                    h.update(chunk)
                    h256.update(chunk)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            continue
        if h.hexdigest() != expected or (entry.get("lock_sha256")
                                         not in (None, h256.hexdigest())):
            problems.append(f"{path}: the manifest records {algorithm} {expected}, the file "
                            f"hashes to {h.hexdigest()}")
            continue
        files[path] = h256.hexdigest()
    if problems:
        raise HubError(f"{src} no longer holds what its manifest verified; no lock was "
                       "written: " + "; ".join(problems[:10]))
    return _checked_lock(model_lock.ModelLock(repo_id, commit, files, source=f"file://{src}",
                                              written_at=utc_now()))
