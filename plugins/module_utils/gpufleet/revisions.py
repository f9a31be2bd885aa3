"""Model revisions side by side (issue #31 item 6).

The model folder DEST is a symbolic link to ROOT/.gpufleet-revisions/NAME/COMMIT/ (ROOT
and NAME: DEST's parent and base name). A new commit is fetched and verified into its own
folder, seeded with hard links of the files the listing gives the same hash as the served
commit's verified manifest (only changed bytes are fetched); DEST is flipped to it (a
symbolic link under a temporary name renamed over DEST) only once every file verified. A
failed or cut fetch leaves DEST and the folder it points at untouched; its partial files
stay in the new commit's folder and resume on the next run. The previous commit's folder
stays, so a rollback to it re-points DEST without asking the mirror (offline); folders
beyond the keep count are removed, never the served one, the previous one, one a running
container mounts (read from /proc/*/mountinfo), a pinned one or one a fetch is writing.

A container binds the commit folder (DEST's real path, vllm_server), so a flip never
changes what a running container reads.

Plain Python (no Ansible): plugins/modules/hf_model.py calls sync_revision().
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import stat

from . import hub, hub_listing, hub_manifest, hub_names
from . import model_lock

STORE = ".gpufleet-revisions"
PROGRESS = "progress.json"
# In a commit folder's state folder: every path of the commit's listing, written once the
# fetch verified (so an offline rollback can check what today's patterns select).
SELECTION = "listing.json"
KEEP_MIN, KEEP_MAX = 2, 100
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_MOUNT_ESCAPE = re.compile(r"\\([0-7]{3})")


class Layout:
    """Paths of one model: link (DEST), root (its parent), store (root/STORE/NAME)."""

    def __init__(self, dest):
        link = os.path.abspath(dest)
        name = os.path.basename(link)
        if not name or name in (".", "..") or name.startswith(".") or \
                hub_names.UNSAFE_NAME_CHARS.search(name):
            raise hub.UnsafePathError(
                f"dest {dest!r}: its last component {name!r} cannot name a model folder "
                "(empty, hidden, or with spaces, quotes or control characters); give a "
                "path such as /srv/models/org/name.")
        self.link, self.name = link, name
        self.root = os.path.dirname(link)
        self.store = os.path.join(self.root, STORE, name)
        self.progress = os.path.join(self.store, PROGRESS)

    def commit_dir(self, commit):
        return os.path.join(self.store, check_commit(commit))

    def target(self, commit):
        """The link's text: relative, so the tree can be moved or mounted elsewhere."""
        return os.path.join(STORE, self.name, check_commit(commit))


def check_commit(commit):
    """A revision folder is named by a 40-hex commit, nothing else (no '..', no '/')."""
    if not isinstance(commit, str) or not _COMMIT.match(commit):
        raise hub.UnsafePathError(f"{str(commit)[:80]!r} is not a 40-hex commit sha; a "
                                  "revision folder is named by its commit only.")
    return commit


def check_store(layout):
    """No symbolic link where the store's folders are (a link there could send the
    fetch, the flip or the pruning anywhere)."""
    for path in (os.path.join(layout.root, STORE), layout.store):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            raise hub.UnsafePathError(
                f"{path} is not a folder (a symbolic link or a file): gpufleet keeps model "
                "revisions there and never writes through links; remove it and run again.")


def served(layout):
    """-> (kind, commit): ('absent', None), ('link', COMMIT) or ('legacy', COMMIT|None) for
    a real folder (the layout before revisions; its manifest's commit, if any). A link
    gpufleet did not make (another target) is refused."""
    try:
        st = os.lstat(layout.link)
    except FileNotFoundError:
        return "absent", None
    if stat.S_ISLNK(st.st_mode):
        text = os.readlink(layout.link)
        parts = text.split("/")
        if len(parts) == 3 and parts[:2] == [STORE, layout.name] and _COMMIT.match(parts[2]):
            return "link", parts[2]
        raise hub.UnsafePathError(
            f"dest {layout.link} is a symbolic link to {text[:200]!r}, not one gpufleet "
            f"made ({STORE}/{layout.name}/COMMIT); remove it (or give another dest) and run "
            "again.")
    if not stat.S_ISDIR(st.st_mode):
        raise hub.HubError(f"dest {layout.link} exists and is not a directory.")
    commit = hub_manifest.read_manifest(layout.link).get("commit")
    return "legacy", commit if isinstance(commit, str) and _COMMIT.match(commit) else None


def served_dir(layout, kind, commit):
    """The folder the served files are in now (None: none)."""
    if kind == "link":
        return layout.commit_dir(commit)
    return layout.link if kind == "legacy" else None


def migration(layout, kind, commit):
    """What migrating a legacy folder does: None (nothing to migrate) or its commit.
    Raises HubError when it cannot be migrated (the message says what to do)."""
    if kind != "legacy":
        return None
    if commit is None:
        if not os.listdir(layout.link):
            return ""  # an empty folder: removed, nothing to keep
        raise hub.HubError(
            f"dest {layout.link} is a folder without a manifest naming its commit (not "
            "fetched by hf_model): move its files away (or fetch it once with an older "
            "gpufleet), then run again. Nothing was changed.")
    if os.path.lexists(layout.commit_dir(commit)):
        raise hub.HubError(
            f"dest {layout.link} (commit {commit}) is a folder and "
            f"{layout.commit_dir(commit)} exists too: remove one of them, then run again. "
            "Nothing was changed.")
    return commit


def migrate(layout, commit):
    """Move the legacy folder to its commit folder and put the link in its place. The
    link is made under a temporary name first, so DEST is missing only between two
    renames (a container bound to the folder keeps reading it: a bind follows the
    inode, not the name)."""
    if commit == "":
        os.rmdir(layout.link)
        return
    os.makedirs(layout.store, exist_ok=True)
    tmp = _tmp_link(layout, commit)
    os.rename(layout.link, layout.commit_dir(commit))
    os.replace(tmp, layout.link)


def _tmp_link(layout, commit):
    tmp = os.path.join(layout.root, f".{layout.name}.gpufleet-link.{os.getpid()}")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(layout.target(commit), tmp)
    return tmp


def flip(layout, commit):
    """Point DEST at the commit folder atomically (rename of a new link over it)."""
    os.replace(_tmp_link(layout, commit), layout.link)


def seed_plan(files, old_dir, old_manifest):
    """Files of the new listing whose bytes the served folder holds, verified: same hash
    in its manifest and size and mtime unchanged. -> {path: manifest entry}."""
    plan = {}
    if not old_dir:
        return plan
    for f in files:
        entry = old_manifest.get(f.path)
        try:
            st = os.lstat(hub_names.path_under(old_dir, f.path))
        except (hub.HubError, OSError):
            continue
        if stat.S_ISREG(st.st_mode) and hub_manifest.manifest_trusts(entry, f, st):
            plan[f.path] = entry
    return plan


def seed(old_dir, new_dir, plan):
    """Hard-link the planned files into new_dir (a file already there is left as it
    is). -> paths linked. A file system that refuses links leaves them to the fetch."""
    linked = []
    for path in sorted(plan):
        src = hub_names.path_under(old_dir, path)
        dst = hub_names.path_under(new_dir, path)
        if os.path.lexists(dst):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                continue
            raise
        linked.append(path)
    return linked


def offline_ready(layout, commit, repo_id, lock=None):
    """The commit folder is complete as verified (manifest complete, same repo and
    commit, every file's size and mtime unchanged, the lock's hashes when locked): a
    rollback can re-point to it without the mirror. -> the manifest, or None."""
    path = layout.commit_dir(commit)
    if not os.path.isdir(path) or os.path.islink(path):
        return None
    data = hub_manifest.read_manifest(path)
    files = data.get("files")
    if not (data.get("complete") and data.get("commit") == commit
            and data.get("repo_id") == repo_id and isinstance(files, dict) and files):
        return None
    if lock is not None and (lock.commit != commit or any(
            (files.get(p) or {}).get("lock_sha256") != d for p, d in lock.files.items()
            if p in files)):
        return None
    for rel, entry in files.items():
        try:
            st = os.lstat(hub_names.path_under(path, hub_names.safe_relpath(rel)))
        except (hub.HubError, OSError):
            return None
        if not (isinstance(entry, dict) and stat.S_ISREG(st.st_mode)
                and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns):
            return None
    return data


class _Path:
    def __init__(self, path):
        self.path = path


def write_listing(path, listing):
    """Keep every path of the commit's listing beside its verified folder."""
    hub_manifest.write_json_atomic(hub_manifest.state_path(path, SELECTION),
                                   {"paths": sorted(f.path for f in listing)})


def selection_problem(path, manifest, allow_patterns=None, ignore_patterns=None):
    """None when the folder holds every file today's patterns select from its commit's
    listing (kept by write_listing); else why an offline rollback cannot use it. Files it
    holds beyond them stay, as an online fetch with narrower patterns leaves them (hub's
    leftovers: verified files of an earlier run with other patterns are kept)."""
    data = hub_manifest.read_manifest(path) if manifest is None else manifest
    try:
        with open(hub_manifest.state_path(path, SELECTION), encoding="utf-8") as fh:
            paths = json.load(fh)["paths"]
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise ValueError("not a list of paths")
    except (OSError, ValueError, KeyError, TypeError):
        return ("its folder does not keep the commit's file list (fetched before gpufleet "
                "kept one), so allow_patterns/ignore_patterns cannot be checked offline")
    selected = {f.path for f in hub_listing.filter_files([_Path(p) for p in paths], allow_patterns,
                                                         ignore_patterns)}
    lacks = sorted(selected - set(data.get("files") or {}))
    if not lacks:
        return None
    return ("allow_patterns/ignore_patterns changed since it was fetched: they select "
            f"{len(lacks)} file(s) it lacks ({', '.join(lacks[:3])})")


def mounted_commits(layout, proc="/proc"):
    """Commits whose folder a mount namespace on the host binds (a running container),
    read from /proc/*/mountinfo: the mount's root names the commit folder."""
    pattern = re.compile(r"/" + re.escape(STORE) + "/" + re.escape(layout.name)
                         + r"/([0-9a-f]{40})(?:/|$)")
    found, seen = set(), set()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            ns = os.readlink(os.path.join(proc, pid, "ns", "mnt"))
        except OSError:
            ns = pid
        if ns in seen:
            continue
        seen.add(ns)
        try:
            with open(os.path.join(proc, pid, "mountinfo"), encoding="utf-8",
                      errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(" ")
            if len(fields) > 4:
                root = _MOUNT_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[3])
                match = pattern.search(root)
                if match:
                    found.add(match.group(1))
    return found


def _busy(path):
    """A fetch holds this commit folder's lock (hub._Lock)."""
    lock = os.path.join(path, hub_names.STATE_DIR, "lock")
    try:  # read-only, never created: check mode writes nothing
        fh = open(lock, "rb")  # pylint: disable=consider-using-with
    except OSError:
        return False
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        fh.close()
    return False


def prune_plan(revisions, keep, protect):
    """revisions: [(commit, rank)] of the store (revisions_in; a higher rank is kept
    first); keep: how many to keep in all; protect:
    commits never removed (served, previous, mounted, pinned, busy). The newest others
    fill the count; -> the commits to remove, oldest first."""
    protect = set(protect)
    room = max(0, keep - len([c for c, _when in revisions if c in protect]))
    others = sorted((r for r in revisions if r[0] not in protect), key=lambda r: r[1],
                    reverse=True)
    return [c for c, _when in sorted(others[room:], key=lambda r: r[1])]


def revisions_in(layout):
    """[(commit, rank)] of the commit folders in the store (other names are left). rank:
    (complete, when its manifest was written): a partial fetch ranks below every
    complete folder, then the most recently verified first."""
    out = []
    try:
        names = os.listdir(layout.store)
    except FileNotFoundError:
        return out
    for name in names:
        path = os.path.join(layout.store, name)
        st = os.lstat(path)
        if not (_COMMIT.match(name) and stat.S_ISDIR(st.st_mode)):
            continue
        try:
            when = os.lstat(os.path.join(path, hub_names.STATE_DIR, hub_manifest.MANIFEST_NAME)).st_mtime
        except OSError:
            when = st.st_mtime
        out.append((name, (bool(hub_manifest.read_manifest(path).get("complete")), when)))
    return out


def prune(layout, keep, protect, check_mode=False, proc="/proc"):
    """Remove commit folders beyond keep. -> commits removed (or that would be)."""
    revisions = revisions_in(layout)
    if len(revisions) <= keep:
        return []
    protect = set(protect) | mounted_commits(layout, proc)
    protect |= {c for c, _when in revisions if _busy(layout.commit_dir(c))}
    doomed = prune_plan(revisions, keep, protect)
    if not check_mode:
        for commit in doomed:
            shutil.rmtree(layout.commit_dir(commit))
    return doomed


def sync_revision(client, repo_id, revision, dest, keep=KEEP_MIN, pinned=(),
                  check_mode=False, lock=None, verify="manifest", proc="/proc", **fetch):
    """Make DEST point at the verified files of repo_id@revision, fetched beside the served
    ones. Returns hub.sync_repo's result plus: path (the commit folder), previous (the
    commit served before, or None), switched (DEST re-pointed), migrated (a legacy folder
    moved into the store: its commit), linked (files hard-linked from the served commit),
    offline (re-pointed to a complete folder without asking the mirror), pruned.

    fetch: hub.sync_repo's other keyword arguments (allow_patterns, ...). Raises
    hub.HubError; on a failure after the fetch started, DEST and its folder are as they
    were (the message says so).
    """
    hub_names.validate_repo_id(repo_id)
    if not isinstance(keep, int) or not KEEP_MIN <= keep <= KEEP_MAX:
        raise hub.HubError(f"revisions_keep must be from {KEEP_MIN} to {KEEP_MAX} (the served "
                           f"commit and the previous one at least), not {keep!r}.")
    pinned = {check_commit(c) for c in pinned or ()}
    if lock is not None:
        try:
            lock = model_lock.parse_lock(lock)
        except model_lock.LockError as exc:
            raise hub.LockMismatchError(str(exc)) from None
    hub_names.validate_name(revision or "main", "revision")
    layout = Layout(dest)
    check_store(layout)
    kind, current = served(layout)
    extra = {"previous": current, "switched": False, "migrated": None, "linked": [],
             "offline": False, "pruned": []}

    if (verify == "manifest" and kind == "link" and _COMMIT.match(revision or "")
            and revision != current):
        manifest = offline_ready(layout, revision, repo_id, lock)
        why = manifest and selection_problem(layout.commit_dir(revision), manifest,
                                             fetch.get("allow_patterns"),
                                             fetch.get("ignore_patterns"))
        if manifest and not why:
            return _offline(layout, revision, current, keep, pinned, check_mode, proc,
                            dict(extra, locked=lock is not None))
        if why:  # fetched again from the mirror (the folder resumes what it holds)
            extra["offline_refused"] = (f"{revision}'s folder was not used offline: {why}; "
                                        "fetching it from the mirror.")
    try:
        return _online(client, repo_id, revision, layout, kind, current, keep, pinned,
                       check_mode, lock, verify, proc, extra, fetch)
    except hub.HubError as exc:
        if extra.get("offline_refused"):
            exc.args = (f"{extra['offline_refused']} {exc}",)
        raise


def _online(client, repo_id, revision, layout, kind, current, keep, pinned, check_mode,
            lock, verify, proc, extra, fetch):
    """sync_revision's fetch from the mirror (its docstring)."""
    client.start()
    commit = client.resolve_commit(repo_id, revision)
    listing = client.list_files(repo_id, commit)
    moved = migration(layout, kind, current)
    if moved is not None:
        extra["migrated"] = moved or None
        if not check_mode:
            migrate(layout, moved)
            kind, current = ("link", moved) if moved else ("absent", None)
    old_dir = served_dir(layout, kind, current)
    target = layout.commit_dir(commit)
    same = old_dir is not None and current == commit
    new_dir = old_dir if same else target
    kw = dict(fetch, verify=verify, lock=lock, resolved=(commit, listing))
    if same:
        result = hub.sync_repo(client, repo_id, revision, new_dir, check_mode=check_mode,
                               progress_path=None if check_mode else layout.progress, **kw)
        if not check_mode:
            write_listing(new_dir, listing)
        result.update(extra, path=new_dir, pruned=prune(
            layout, keep, {commit} | pinned, check_mode, proc) if kind == "link" else [])
        result["changed"] = bool(result["changed"] or extra["migrated"] or result["pruned"])
        return result

    files = hub_listing.filter_files(listing, fetch.get("allow_patterns"),
                                     fetch.get("ignore_patterns"))
    old_manifest = hub_manifest.load_manifest(old_dir) if old_dir else {}
    plan = seed_plan(files, old_dir, old_manifest)
    if check_mode:
        result = hub.sync_repo(client, repo_id, revision, new_dir, check_mode=True, **kw)
        for item in result["files"]:
            if item["path"] in plan and not os.path.lexists(
                    os.path.join(new_dir, item["path"])):
                item["status"] = "would_link"
        result["bytes_to_download"] -= sum(
            f.size for f in files if f.path in plan and not os.path.lexists(
                os.path.join(new_dir, f.path)))
        extra.update(linked=sorted(plan), pruned=[])
        result.update(extra, path=new_dir, changed=True)
        return result
    os.makedirs(os.path.join(new_dir, hub_names.STATE_DIR), exist_ok=True)
    linked = seed(old_dir, new_dir, plan) if plan else []
    if linked:  # the linked files are the served commit's verified bytes: trusted as such
        entries = dict(hub_manifest.load_manifest(new_dir))
        entries.update({p: plan[p] for p in linked})
        hub_manifest.write_manifest(new_dir, repo_id, revision, commit, client.endpoint, entries,
                                    complete=False)
    extra["linked"] = linked
    try:
        result = hub.sync_repo(client, repo_id, revision, new_dir,
                               progress_path=layout.progress, **kw)
    except hub.HubError as exc:
        served_now = (f"{layout.link} still points at {current}" if current
                      else f"{layout.link} was not made")
        exc.args = (f"{exc} The fetch of {commit} went into {new_dir} and stopped there: "
                    f"{served_now}, untouched; the next run resumes it.",)
        exc.result = {**getattr(exc, "result", {}), **extra, "path": new_dir}
        raise
    write_listing(new_dir, listing)
    flip(layout, commit)
    extra["switched"] = True
    result.update(extra, path=new_dir, changed=True,
                  pruned=prune(layout, keep, {commit, current} | pinned, False, proc))
    return result


def diff(dest, result):
    """Ansible's diff of a sync_revision result: the commit dest points at, before and
    after (in check mode, would point at)."""
    switched = result.get("switched") or result.get("previous") != result.get("commit")
    after = result.get("commit") if switched or result.get("migrated") else result.get("previous")
    return {"before": {"dest": dest, "commit": result.get("previous")},
            "after": {"dest": dest, "commit": after}}


def _offline(layout, commit, current, keep, pinned, check_mode, proc, extra):
    """Re-point DEST to a complete commit folder (a rollback): no request to the mirror."""
    path = layout.commit_dir(commit)
    data = hub_manifest.read_manifest(path)
    if not check_mode:
        flip(layout, commit)
    extra.update(switched=not check_mode, offline=True)
    files = [{"path": p, "size": e.get("size"),
              "algorithm": "sha256" if "sha256" in e else "sha1",
              "digest": e.get("sha256") or e.get("sha1"), "status": "trusted"}
             for p, e in sorted(data["files"].items())]
    return {**extra, "changed": True, "commit": commit, "path": path,
            "files": files, "bytes_to_download": 0, "bytes_downloaded": 0,
            "bytes_verified": 0, "quarantined": [], "removed": [],
            "manifest": hub_manifest.state_path(path, hub_manifest.MANIFEST_NAME),
            "pruned": prune(layout, keep, {commit, current} | pinned, check_mode, proc)}
