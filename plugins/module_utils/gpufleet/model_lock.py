"""A model's lock: the commit and every file's sha256, pinned on the control node.

issue #32 item 8. A mirror is checked against the listing it serves itself (hub.py), so a
hostile mirror can serve other bytes with a listing whose hashes match them. A lock,
written once on the control node from a source the operator trusts (the hub, or a copy
verified from it: hf_model_lock, playbooks/model_lock.yml) and kept in the inventory or
beside it, names what every host must end up with, whatever the endpoint says:

    format: 1                      # optional
    repo_id: org/name
    commit: <40 hex>               # the commit the revision must resolve to
    files: {path: <64 hex sha256>} # every file of the repository at that commit
    source: https://huggingface.co # optional, informational: where it was written from
    written_at: 2026-12-06T19:00:00+00:00  # optional, informational

This file is the one place for the format and its rules: parse_lock (validation with
clear errors), check_commit, check_listing, check_file and check_folder (each refusal
names the file and both values), unpinned_python (what --trust-remote-code needs pinned), render_lock
(the YAML the control node writes). Plain Python: no Ansible, no requests, no yaml at
import (hub.py, tune.py and the role's filter all use it).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

LOCK_FORMAT = 1
REQUIRED_KEYS = ("repo_id", "commit", "files")
OPTIONAL_KEYS = ("format", "source", "written_at")
MAX_PROBLEMS_SHOWN = 10

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# The same rules as hub.validate_repo_id and hub.validate_name (test_model_lock checks
# that they agree); repeated here so that this file needs no requests (hub imports it).
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_UNSAFE_NAME_CHARS = re.compile(r"[\s\"'`\\\x00-\x1f\x7f-\x9f]")
STATE_DIR = ".gpufleet"


class LockError(ValueError):
    """A lock that cannot be read, or bytes / a listing / a commit it refuses.

    `problems` holds one line per refused file (or the one problem)."""

    def __init__(self, msg, problems=None):
        super().__init__(msg)
        self.problems = list(problems or [msg])


@dataclass(frozen=True)
class ModelLock:
    repo_id: str
    commit: str
    files: dict = field(hash=False)
    source: str = ""
    written_at: str = ""

    def as_dict(self):
        out = {"format": LOCK_FORMAT, "repo_id": self.repo_id, "commit": self.commit,
               "files": dict(sorted(self.files.items()))}
        if self.source:
            out["source"] = self.source
        if self.written_at:
            out["written_at"] = self.written_at
        return out


def _path_problem(path):
    if not isinstance(path, str) or not path:
        return "empty or not a string"
    if _UNSAFE_NAME_CHARS.search(path):
        return "quotes, backslashes, whitespace or control characters"
    if path.startswith("/"):
        return "an absolute path"
    if any(p in ("", ".", "..") for p in path.split("/")):
        return "an empty, '.' or '..' component"
    if path.split("/")[0] == STATE_DIR:
        return f"gpufleet's state folder {STATE_DIR}"
    return None


def parse_lock(data, where="the lock"):
    """A lock (a dict, e.g. read from YAML) -> ModelLock; LockError naming what is wrong.

    Strict: unknown keys (a typo such as `file:`), a commit or sha256 that is not lowercase
    hex of the right length, a path that could leave the model folder, an empty file list
    are all refused, since a lock that says less than it seems to pins nothing."""
    if isinstance(data, ModelLock):
        return data
    if not isinstance(data, dict):
        raise LockError(f"{where} must be a mapping with repo_id, commit and files, not "
                        f"{type(data).__name__}.")
    unknown = sorted(str(k) for k in data if k not in REQUIRED_KEYS + OPTIONAL_KEYS)
    if unknown:
        raise LockError(f"{where} has unknown keys {', '.join(unknown)}: a lock holds "
                        f"{', '.join(REQUIRED_KEYS)} (and optionally "
                        f"{', '.join(OPTIONAL_KEYS)}).")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise LockError(f"{where} lacks {', '.join(missing)}: a lock holds repo_id, commit "
                        "(40 hex digits) and files ({path: sha256}).")
    fmt = data.get("format", LOCK_FORMAT)
    if fmt != LOCK_FORMAT or isinstance(fmt, bool):
        raise LockError(f"{where} has format {fmt!r}; this gpufleet reads format "
                        f"{LOCK_FORMAT}.")
    repo_id = data["repo_id"]
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or ".." in repo_id:
        raise LockError(f"{where}: repo_id {repo_id!r} is not a Hugging Face repo id "
                        "('org/name': letters, digits, '.', '_', '-').")
    where = f"the lock of {repo_id}" if where == "the lock" else where
    commit = data["commit"]
    if not isinstance(commit, str) or not _HEX40.match(commit):
        raise LockError(f"{where}: commit {commit!r:.80} is not a commit sha (40 lowercase "
                        "hex digits); a branch or tag name pins nothing.")
    files = data["files"]
    if not isinstance(files, dict) or not files:
        raise LockError(f"{where}: files must be a non-empty mapping {{path: sha256}}, not "
                        f"{files!r:.80}.")
    problems = []
    for path, digest in files.items():
        why = _path_problem(path)
        if why:
            problems.append(f"path {path!r:.200} is unsafe ({why})")
        elif not isinstance(digest, str) or not _HEX64.match(digest):
            problems.append(f"{path}: {digest!r:.80} is not a sha256 (64 lowercase hex "
                            "digits)")
    if problems:
        raise LockError(_summary(f"{where} is not valid", problems), problems)
    for key in ("source", "written_at"):
        if not isinstance(data.get(key, ""), str):
            raise LockError(f"{where}: {key} must be a string.")
    return ModelLock(repo_id, commit, dict(files), data.get("source", ""),
                     data.get("written_at", ""))


def load_lock_file(path):
    """Read a lock file (YAML, or JSON where PyYAML is missing) -> ModelLock."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise LockError(f"cannot read the lock file {path!r:.200}: "
                        f"{exc.strerror or type(exc).__name__}.") from None
    try:
        import yaml  # on the control node always (Ansible needs it); on a host perhaps not
    except ImportError:
        yaml = None
    try:
        data = yaml.safe_load(text) if yaml else json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError and yaml.YAMLError's parents differ
        raise LockError(f"the lock file {path} is not {'YAML' if yaml else 'JSON'}: "
                        f"{exc}") from None
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError, without importing yaml above
        raise LockError(f"the lock file {path} is not YAML: {exc}") from None
    return parse_lock(data, where=f"the lock file {path}")


def _summary(head, problems):
    shown = problems[:MAX_PROBLEMS_SHOWN]
    more = len(problems) - len(shown)
    tail = f"; and {more} more" if more > 0 else ""
    return f"{head}: {'; '.join(shown)}{tail}."


# ---------------------------------------------------------------- checks against a lock

def _check_repo(lock, repo_id):
    if repo_id != lock.repo_id:
        raise LockError(f"the lock is for {lock.repo_id}, not {repo_id}: give each model "
                        "its own lock.")


def check_commit(lock, repo_id, commit, endpoint="the endpoint"):
    """Refuse another repo or another commit than the lock's (before anything is written)."""
    _check_repo(lock, repo_id)
    if commit != lock.commit:
        raise LockError(f"{repo_id}: {endpoint} resolves the revision to commit {commit}, "
                        f"the lock pins commit {lock.commit}. Nothing was written. Fetch the "
                        "lock's commit (revision: the lock's commit), or write a new lock from "
                        "a source you trust if the model really moved.")


def check_listing(lock, listed, required=None):
    """Refuse a listing that differs from the lock, before anything is downloaded.

    listed: the files the endpoint lists and this fetch selected, each with .path,
    .algorithm ('sha256' for LFS files, 'sha1' git blob for the others) and .digest.
    required: the lock's paths this fetch must find (default: all; the caller narrows it
    with the same allow/ignore patterns). A listed file the lock lacks, a required file
    the listing lacks, an LFS sha256 other than the lock's: each a refusal naming the file
    and both values. sha1-listed files are checked on their bytes (check_file)."""
    problems = []
    seen = set()
    for f in listed:
        seen.add(f.path)
        pinned = lock.files.get(f.path)
        if pinned is None:
            problems.append(f"{f.path}: listed by the endpoint ({f.algorithm} {f.digest}) "
                            "but not in the lock")
        elif f.algorithm == "sha256" and f.digest != pinned:
            problems.append(f"{f.path}: the lock pins sha256 {pinned}, the endpoint lists "
                            f"sha256 {f.digest}")
    for path in sorted(set(lock.files if required is None else required) - seen):
        problems.append(f"{path}: pinned by the lock (sha256 {lock.files[path]}) but the "
                        "endpoint does not list it")
    if problems:
        raise LockError(_summary(f"{lock.repo_id}@{lock.commit}: the endpoint's listing "
                                 "differs from the lock; nothing was downloaded", problems),
                        problems)


def check_file(lock, path, sha256):
    """Refuse bytes whose sha256 is not the lock's for that path."""
    pinned = lock.files.get(path)
    if pinned is None:
        raise LockError(f"{path}: not in the lock of {lock.repo_id}; refusing its bytes.")
    if sha256 != pinned:
        raise LockError(f"{path}: the lock pins sha256 {pinned}, the bytes received hash to "
                        f"sha256 {sha256}. They were not put in place; the mirror serves "
                        "other bytes than the source the lock was written from.")


def check_folder(lock, repo_id, commit, entries, hash_file):
    """Refuse a verified folder that differs from the lock (the site mirror checks each
    folder before it publishes it). entries: the folder's manifest {path: entry}.

    Another repo or commit, a file the lock does not pin, or bytes whose sha256 is not the
    lock's are each a problem naming the file and both values. An entry's recorded sha256
    (an LFS file) or lock_sha256 (written when the fetch itself was locked) is compared as
    recorded, since the manifest's size and mtime still vouch for the bytes; any other
    file is hashed now (hash_file(path) -> sha256; such files are small: configs,
    tokenizers, code). Returns the paths the lock pins that the folder lacks (a folder
    fetched with allow patterns holds a subset): serving less is not serving other bytes."""
    _check_repo(lock, repo_id)
    if commit != lock.commit:
        raise LockError(f"{repo_id}: the folder holds commit {commit}, the lock pins commit "
                        f"{lock.commit}. Fetch the lock's commit into it, or write a new lock "
                        "from a source you trust if the model really moved.")
    problems = []
    for path, entry in sorted(entries.items()):
        pinned = lock.files.get(path)
        if pinned is None:
            problems.append(f"{path}: in the folder but not in the lock")
            continue
        entry = entry if isinstance(entry, dict) else {}
        recorded = entry.get("lock_sha256") or entry.get("sha256")
        digest = recorded if recorded else hash_file(path)
        if digest != pinned:
            how = "is recorded as" if recorded else "hashes to"
            problems.append(f"{path}: the lock pins sha256 {pinned}, the folder's file {how} "
                            f"sha256 {digest}")
    if problems:
        raise LockError(_summary(f"{repo_id}@{commit}: the folder differs from the lock",
                                 problems), problems)
    return sorted(set(lock.files) - set(entries))


def python_files(paths):
    """The *.py paths among `paths` (what --trust-remote-code may run)."""
    return sorted(p for p in paths if isinstance(p, str) and p.endswith(".py"))


def unpinned_python(lock, paths):
    """The *.py files among `paths` (the model folder's, the modules config.json's
    auto_map names) that the lock does not pin."""
    return [p for p in python_files(paths) if p not in lock.files]


# ---------------------------------------------------------------- writing

def render_lock(lock, comment=""):
    """The YAML text of a lock (strings written as JSON scalars, which YAML reads as
    written; no PyYAML needed), keys and files in a stable order."""
    data = lock.as_dict()
    lines = [f"# {line}" for line in comment.splitlines()] if comment else []
    lines.append("---")
    for key in ("format", "repo_id", "commit", "source", "written_at"):
        if key in data:
            lines.append(f"{key}: {json.dumps(data[key])}")
    lines.append("files:")
    for path, digest in data["files"].items():
        lines.append(f"  {json.dumps(path)}: {json.dumps(digest)}")
    return "\n".join(lines) + "\n"


def same_pins(a, b):
    """True when two locks pin the same repo, commit and files (source and time aside)."""
    return (a.repo_id, a.commit, a.files) == (b.repo_id, b.commit, b.files)


def write_lock_file(path, lock, force=False, comment="", dry_run=False):
    """Write the lock at path (mode 0644: it holds no secret). Returns True when written
    (with dry_run: when it would be; nothing is written).

    An existing lock pinning the same files is kept (False); one pinning others is
    replaced only with force, since a lock is written once from a trusted source."""
    if os.path.lexists(path):
        try:
            old = load_lock_file(path)
        except LockError:
            old = None
        if old is not None and same_pins(old, lock):
            return False
        if not force:
            what = (f"commit {old.commit}" if old is not None else "something that is not a "
                    "valid lock")
            repo = lock.repo_id if old is None else old.repo_id
            raise LockError(f"{path} already holds {what} for {repo}; this lock pins "
                            f"commit {lock.commit} of {lock.repo_id}. A lock is written "
                            "once: set force to replace it (after checking why it changed).")
    if dry_run:
        return True
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(render_lock(lock, comment))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


# ---------------------------------------------------------------- the role's inputs

def lock_file_name(repo_id):
    """The file name playbooks/model_lock.yml writes a model's lock to (org--name.lock.yml)."""
    return f"{str(repo_id).replace('/', '--')}.lock.yml"


def resolve_locks(entries, locks=None, lock_dir="", require=False, role="model_fetch"):
    """The model_fetch role's models with each one's lock found, read and checked on the
    control node, before anything changes. Returns (entries, problems).

    A model's lock is, first found: the entry's `lock` (a lock, or the path of its file on
    the control node), model_fetch_locks[repo_id] (the same), the file
    lock_dir/org--name.lock.yml when lock_dir is set and it exists. Each lock must parse,
    be for the entry's repo_id, and pin the entry's revision when that is a commit; an
    entry without revision gets the lock's commit. With require, a model without a lock is
    a problem. An entry comes back with `lock` as a plain dict (what hf_model takes).
    role names the variables in the messages: model_fetch (model_fetch_models,
    model_fetch_locks...) or hf_site_mirror, whose folders are checked the same way."""
    out, problems = [], []
    locks = locks or {}
    if not isinstance(locks, dict):
        return list(entries or []), [f"{role}_locks must map repo ids to locks (or "
                                     f"lock files), not {type(locks).__name__}"]
    for entry in entries or []:
        if not isinstance(entry, dict):
            out.append(entry)
            continue
        repo_id = entry.get("repo_id")
        source, where = None, ""
        if entry.get("lock") is not None:
            source, where = entry["lock"], f"the lock of {role}_models entry {repo_id}"
        elif repo_id in locks:
            source, where = locks[repo_id], f"{role}_locks[{repo_id!r}]"
        elif lock_dir:
            path = os.path.join(lock_dir, lock_file_name(repo_id))
            if os.path.exists(path):
                source, where = path, f"the lock file {path}"
        entry = dict(entry)
        entry.pop("lock", None)
        if source is None:
            if require:
                problems.append(f"{repo_id}: no lock ({role}_require_lock is set); write "
                                "one with playbooks/model_lock.yml")
            out.append(entry)
            continue
        try:
            if isinstance(source, str):
                if not os.path.isabs(source):
                    raise LockError(f"{where}: the lock file {source!r:.200} must be an "
                                    "absolute path on the control node (e.g. "
                                    "'{{ inventory_dir }}/locks/...')")
                lock = load_lock_file(source)
            else:
                lock = parse_lock(source, where=where)
            check_commit(lock, repo_id, lock.commit)
        except LockError as exc:
            problems.append(f"{repo_id}: {str(exc).rstrip('.')}")
            out.append(entry)
            continue
        revision = entry.get("revision")
        if revision is None:
            entry["revision"] = lock.commit
        elif _HEX40.match(str(revision)) and revision != lock.commit:
            problems.append(f"{repo_id}: revision {revision} is not the commit the lock pins "
                            f"({lock.commit})")
        entry["lock"] = lock.as_dict()
        out.append(entry)
    return out, problems
