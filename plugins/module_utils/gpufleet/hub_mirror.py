"""Site mirror: turn verified model folders into a static tree a web server (nginx) serves
as the Hugging Face API subset that hf_model, `hf download` and `vllm serve` use.

Input: folders fetched by hf_model (each with ``.gpufleet/manifest.json``). Output under
``root`` (nothing is copied: the files are served through symlinks, with sendfile):

- ``www/api/models/ORG/REPO/revision/{REV,COMMIT}``: repo info JSON (``sha``,
  ``siblings`` with ``rfilename``, ``size``, ``blobId``, ``lfs``), like the hub's
  ``?blobs=true`` answer (huggingface_hub hf_api.py ModelInfo / RepoSibling).
- ``www/api/models/ORG/REPO/tree/{REV,COMMIT}``: the recursive tree listing (``type``,
  ``path``, ``size``, ``oid``, ``lfs.oid`` sha256), as huggingface_hub list_repo_tree reads it.
- ``www/ORG/REPO/resolve/COMMIT`` -> the model folder; ``resolve/REV`` -> ``COMMIT``.
- ``nginx/etags.map`` (``"ORG/REPO/PATH" "DIGEST";``), ``nginx/commits.map``,
  ``nginx/revisions.map``: included by the server config so nginx answers with ETag
  (sha256 for LFS, git blob sha1 otherwise), X-Repo-Commit and X-Error-Code, and serves
  only files the manifest lists (never ``.gpufleet/``).

Only complete manifests whose files still have their recorded size and mtime are
published, and a folder given with its model lock (model_lock.py) only when it holds the
lock's commit and the lock's bytes (issue #32 item 8: the site mirror verifies against the
lock as every host does). No Ansible imports.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat

from . import model_lock
from .hub_errors import HubError, UnsafePathError
from .hub_listing import RepoFile
from .hub_manifest import MANIFEST_NAME, manifest_trusts, open_nofollow
from .hub_names import HEX40, STATE_DIR, path_under, safe_relpath, validate_name, validate_repo_id

# Beyond validate_name (quotes, backslashes, whitespace, control characters): what nginx
# map files and locations would read as syntax or variables.
_NGINX_UNSAFE = re.compile(r'[$;{}]')


def _sha256_of(folder, rel):
    h = hashlib.sha256()
    with open_nofollow(path_under(folder, rel), "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_model_folder(folder, repo_id=None, lock=None):
    """The manifest of a folder fetched by hf_model, checked against the disk, and against
    its model lock when one is given (a dict, as model_lock.parse_lock reads it)."""
    path = os.path.join(folder, STATE_DIR, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        raise HubError(f"{folder} has no readable manifest ({path}: {exc}); fetch it with "
                       "hf_model first.") from None
    if not manifest.get("complete"):
        raise HubError(f"{folder}: the last fetch did not complete; run hf_model again "
                       "before publishing it.")
    repo_id = validate_repo_id(repo_id or manifest.get("repo_id"))
    if "/" not in repo_id:
        raise HubError(f"{folder}: repo id {repo_id!r} needs an org ('org/name') to be served.")
    commit = manifest.get("commit")
    if not isinstance(commit, str) or not HEX40.match(commit):
        raise HubError(f"{folder}: the manifest's commit {commit!r:.60} is not a commit sha; "
                       "fetch the folder with hf_model again.")
    revision = manifest.get("revision") or "main"
    if not isinstance(manifest.get("files"), dict):
        raise HubError(f"{folder}: the manifest lists no files; fetch it with hf_model again.")
    for what, name in [("revision", revision)] + [
            ("file name", rel) for rel in sorted(manifest.get("files") or {})]:
        try:
            validate_name(name, what)
        except UnsafePathError as exc:
            raise UnsafePathError(f"{folder}: {exc}") from None
        if _NGINX_UNSAFE.search(name) or (what == "revision" and "/" in name):
            raise UnsafePathError(f"{folder}: {what} {name!r} has characters the mirror "
                                  "cannot serve ('$', ';', braces, or '/' in a revision).")
    files = []
    for rel, entry in sorted(manifest.get("files", {}).items()):
        safe_relpath(rel)
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int):
            raise HubError(f"{folder}: the manifest entry of {rel!r} is unreadable; fetch "
                           "the folder with hf_model again.")
        algorithm = "sha256" if "sha256" in entry else "sha1"
        f = RepoFile(rel, entry["size"], algorithm, entry.get(algorithm))
        try:
            st = os.lstat(path_under(folder, rel))
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode) or not manifest_trusts(entry, f, st):
            raise HubError(f"{folder}/{rel} changed since it was verified (size or mtime); "
                           "run hf_model with verify: full on that folder first.")
        files.append(f)
    lock_missing = None
    if lock is not None:
        try:
            parsed = model_lock.parse_lock(lock, where=f"the lock given for {folder}")
            lock_missing = model_lock.check_folder(
                parsed, repo_id, commit, manifest["files"], lambda rel: _sha256_of(folder, rel))
        except model_lock.LockError as exc:
            raise HubError(f"{folder}: {str(exc).rstrip('.')}. Nothing was published: fetch "
                           "the folder again with its lock (model_fetch_locks), or check "
                           "where its bytes came from.") from None
        except OSError as exc:
            raise HubError(f"{folder}: a file could not be read to check it against the "
                           f"lock: {exc.strerror or exc}. Nothing was published.") from None
    return {"repo_id": repo_id, "commit": commit,
            "revision": revision, "folder": os.path.abspath(folder),
            "files": files, "lock_missing": lock_missing}


def _pointer_blob_id(f):
    """The git blob id of the LFS pointer file, what the hub lists as an LFS file's oid."""
    pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{f.digest}\n"
               f"size {f.size}\n").encode()
    return hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest(), len(pointer)


def tree_listing(files):
    entries, dirs = [], set()
    for f in files:
        parts = f.path.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if f.algorithm == "sha256":
            oid, pointer_size = _pointer_blob_id(f)
            entries.append({"type": "file", "oid": oid, "size": f.size, "path": f.path,
                            "lfs": {"oid": f.digest, "size": f.size,
                                    "pointerSize": pointer_size}})
        else:
            entries.append({"type": "file", "oid": f.digest, "size": f.size, "path": f.path})
    entries += [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0,
                 "path": d} for d in dirs]
    return sorted(entries, key=lambda e: e["path"])


def repo_info(model):
    siblings = []
    for f in model["files"]:
        s = {"rfilename": f.path, "size": f.size}
        if f.algorithm == "sha256":
            s["blobId"] = _pointer_blob_id(f)[0]
            s["lfs"] = {"sha256": f.digest, "size": f.size, "pointerSize": _pointer_blob_id(f)[1]}
        else:
            s["blobId"] = f.digest
        siblings.append(s)
    org = model["repo_id"].split("/")[0]
    return {"_id": model["commit"][:24], "id": model["repo_id"], "modelId": model["repo_id"],
            "author": org, "sha": model["commit"], "private": False, "gated": False,
            "disabled": False, "tags": [], "siblings": siblings}


def plan_site(models):
    """{relative path: content (bytes) or ('symlink', target)} for the whole site."""
    seen, out = {}, {}
    etags, commits, revisions = [], [], []
    for m in models:
        rid = m["repo_id"]
        if rid in seen:
            raise HubError(f"{rid} is given twice ({seen[rid]} and {m['folder']}); a site "
                           "mirror serves one folder per repo.")
        seen[rid] = m["folder"]
        revs = sorted({m["revision"], m["commit"]})
        info = json.dumps(repo_info(m), indent=1).encode()
        tree = json.dumps(tree_listing(m["files"]), indent=1).encode()
        for rev in revs:
            out[f"www/api/models/{rid}/revision/{rev}"] = info
            out[f"www/api/models/{rid}/tree/{rev}"] = tree
            revisions.append(f'"{rid}/{rev}" 1;')
            if rev != m["commit"]:
                out[f"www/{rid}/resolve/{rev}"] = ("symlink", m["commit"])
        out[f"www/{rid}/resolve/{m['commit']}"] = ("symlink", m["folder"])
        commits.append(f'"{rid}" "{m["commit"]}";')
        etags += [f'"{rid}/{f.path}" "{f.digest}";' for f in m["files"]]
    for name, lines in (("etags", etags), ("commits", commits), ("revisions", revisions)):
        out[f"nginx/{name}.map"] = ("\n".join(sorted(lines)) + "\n").encode()
    return out


def apply_site(root, plan, check_mode=False):
    """Write the plan under root, removing what an earlier plan left; returns changed paths."""
    changed = []
    for rel, content in sorted(plan.items()):
        # checked before it is opened: under root, no link on the way (the resolve links
        # themselves are replaced, never followed)
        path = path_under(root, rel, final_may_be_link=True)
        if isinstance(content, tuple):
            target = content[1]
            if os.path.islink(path) and os.readlink(path) == target:
                continue
            changed.append(rel)
            if not check_mode:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = path + ".tmp"
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                os.symlink(target, tmp)
                os.replace(tmp, path)
            continue
        try:
            if not os.path.islink(path):
                with open(path, "rb") as fh:
                    if fh.read() == content:
                        continue
        except OSError:
            pass
        changed.append(rel)
        if not check_mode:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open_nofollow(path + ".tmp", "wb") as fh:
                fh.write(content)
            os.replace(path + ".tmp", path)
    for sub in ("www", "nginx"):
        top = os.path.join(root, sub)
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            for name in filenames + [d for d in dirnames
                                     if os.path.islink(os.path.join(dirpath, d))]:
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if rel not in plan:
                    changed.append(rel)
                    if not check_mode:
                        os.unlink(os.path.join(dirpath, name))
            if not check_mode and dirpath != top and not os.listdir(dirpath):
                os.rmdir(dirpath)
    return changed


def build_site(root, folders, check_mode=False):
    """Publish folders ([{'path': ..., 'repo_id': optional}]) under root."""
    models = [read_model_folder(f["path"], f.get("repo_id"), f.get("lock")) for f in folders]
    if not models:
        raise HubError("give at least one model folder to publish.")
    changed = apply_site(root, plan_site(models), check_mode)
    return {"changed": bool(changed), "changed_paths": changed,
            "repos": [{"repo_id": m["repo_id"], "commit": m["commit"],
                       "revision": m["revision"], "folder": m["folder"],
                       "files": len(m["files"]), "bytes": sum(f.size for f in m["files"]),
                       "locked": m["lock_missing"] is not None,
                       "lock_missing": m["lock_missing"] or []}
                      for m in models]}


def bad_addresses(values, networks=False):
    """The entries of `values` that are not an IP address (IPv4 or IPv6), or with
    networks=True neither an address nor a CIDR network without host bits
    ("10.0.0.0/8", "fd00::/8"): what the site mirror's nginx `listen` and `allow` take."""
    import ipaddress

    bad = []
    for value in values or []:
        try:
            if not isinstance(value, str) or value != value.strip() or not value:
                raise ValueError(value)
            if networks and "/" in value:
                ipaddress.ip_network(value, strict=True)
            else:
                ipaddress.ip_address(value)
        except ValueError:
            bad.append(value)
    return bad
