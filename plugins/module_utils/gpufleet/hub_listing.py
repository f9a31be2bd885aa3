"""A repository's listing at one commit: its files and what their bytes must hash to.

The tree API's entries become RepoFile records (path, size, sha256 for LFS files, git
blob sha1 for the others, and the sha256 a model's lock pins); a listing that cannot
describe one tree is refused; allow/ignore patterns select from it as huggingface_hub does.
"""
from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass

from .hub_errors import HubError
from .hub_names import HEX40, HEX64, safe_relpath


@dataclass(frozen=True)
class RepoFile:
    """One file of the listing: what its bytes must hash to."""

    path: str
    size: int
    algorithm: str  # "sha256" for LFS files, "sha1" (git blob) for the others
    digest: str
    pinned: str | None = None  # the sha256 the model's lock pins (model_lock), if any

    def hasher(self):
        if self.algorithm == "sha256":
            return hashlib.sha256()
        h = hashlib.sha1()
        h.update(b"blob %d\0" % self.size)
        # a locked sha1-listed file is also hashed with sha256 (one read of the bytes)
        return _PinnedHasher(h) if self.pinned else h

    def pinned_ok(self, hasher):
        """The lock's word on bytes that matched the listing: None when no lock pins this
        file, else the sha256 they hash to (equal to self.pinned or not)."""
        if not self.pinned:
            return None
        return self.digest if self.algorithm == "sha256" else hasher.sha256.hexdigest()


class _PinnedHasher:
    """The listing's git-blob sha1 (hexdigest) and the lock's sha256 at once."""

    def __init__(self, sha1):
        self.sha1, self.sha256 = sha1, hashlib.sha256()

    def update(self, data):
        self.sha1.update(data)
        self.sha256.update(data)

    def hexdigest(self):
        return self.sha1.hexdigest()


def parse_tree(items):
    """Tree API entries -> RepoFile list (directories skipped). A listing that cannot
    describe one tree is refused before anything is downloaded: the same path twice (two
    downloads would write one partial file, and the manifest would call it complete), or a
    path that is a file and a folder at once. Messages quote at most 200 characters of an
    entry."""
    files, folders = [], set()
    for item in items:
        if not isinstance(item, dict):
            raise HubError(f"the listing has an entry that is not an object ({item!r:.80}); "
                           "the mirror does not serve the tree API.")
        if item.get("type") == "directory":
            folders.add(safe_relpath(item.get("path")))
            continue
        if item.get("type") != "file":
            continue
        path = safe_relpath(item.get("path"))
        lfs = item.get("lfs") or None
        if lfs and not isinstance(lfs, dict):
            lfs = {}
        if lfs:
            algorithm, digest = "sha256", str(lfs.get("oid") or lfs.get("sha256") or "")
            size = lfs.get("size", item.get("size"))
            ok = HEX64.match(digest)
        else:
            algorithm, digest, size = "sha1", str(item.get("oid") or ""), item.get("size")
            ok = HEX40.match(digest)
        if not ok or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise HubError(f"the listing entry for {path!r:.200} has no usable size/hash "
                           f"({item!r:.200}); the mirror does not serve the tree API with hashes.")
        files.append(RepoFile(path, size, algorithm, digest))
    _check_one_tree(files, folders)
    return files


def _check_one_tree(files, folders):
    """Refuse a listing whose paths cannot all exist at once (see parse_tree)."""
    seen = set()
    for f in files:
        if f.path in seen:
            raise HubError(f"the listing names {f.path!r:.200} twice: it does not describe one "
                           "tree, so nothing was downloaded. Fix the mirror (or the proxy in "
                           "front of it) that serves this listing.")
        seen.add(f.path)
    parents = set(folders)
    for f in files:
        parts = f.path.split("/")[:-1]
        parents.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    both = sorted(seen & parents)
    if both:
        raise HubError(f"the listing names {both[0]!r:.200} as a file and as a folder: it does "
                       "not describe one tree, so nothing was downloaded. Fix the mirror that "
                       "serves this listing.")


def filter_files(files, allow_patterns=None, ignore_patterns=None):
    """fnmatch filtering as huggingface_hub's filter_repo_objects: 'dir/' means 'dir/*'."""
    def norm(patterns):
        if patterns is None:
            return None
        if isinstance(patterns, str):
            patterns = [patterns]
        return [p + "*" if p.endswith("/") else p for p in patterns]

    allow, ignore = norm(allow_patterns), norm(ignore_patterns)
    return [f for f in files
            if (allow is None or any(fnmatch.fnmatch(f.path, p) for p in allow))
            and not (ignore and any(fnmatch.fnmatch(f.path, p) for p in ignore))]
