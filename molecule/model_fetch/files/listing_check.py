#!/usr/bin/env python3
"""Compare a model folder with the hub's listing (runs on the test host, stdlib only).

    listing_check.py ENDPOINT REPO_ID REVISION DEST      (token from $HF_TOKEN, if any)

Reads GET ENDPOINT/api/models/REPO/revision/REV (the commit) and the recursive tree
listing at that commit (following `Link: rel="next"` pages, at most 100), hashes every
file of DEST outside .gpufleet/ (sha256 for LFS entries, git blob sha1 for the others,
as the hub lists them) and prints JSON: commit, files [{path, size, algorithm, listed,
on_disk, ok}], missing (listed, not on disk), extra (on disk, not listed).
"""
import hashlib
import json
import os
import re
import sys
import urllib.request


def get(url, token):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp), resp.headers.get("Link", "")


def digest(path, algorithm):
    size = os.path.getsize(path)
    h = hashlib.sha256() if algorithm == "sha256" else hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    endpoint, repo_id, revision, dest = sys.argv[1:5]
    token = os.environ.get("HF_TOKEN")
    commit = get(f"{endpoint}/api/models/{repo_id}/revision/{revision}", token)[0]["sha"]
    url, entries = f"{endpoint}/api/models/{repo_id}/tree/{commit}?recursive=true", []
    for _ in range(100):
        page, link = get(url, token)
        entries += [e for e in page if e["type"] == "file"]
        m = re.search(r'<([^>]+)>;\s*rel="next"', link)
        if not m:
            break
        url = m.group(1)
    files = []
    for e in entries:
        algorithm, listed = ("sha256", e["lfs"]["oid"]) if e.get("lfs") else ("sha1", e["oid"])
        path = os.path.join(dest, e["path"])
        on_disk = digest(path, algorithm) if os.path.isfile(path) else None
        files.append({"path": e["path"], "size": e["size"], "algorithm": algorithm,
                      "listed": listed, "on_disk": on_disk, "ok": on_disk == listed})
    on_disk = set()
    for top, dirs, names in os.walk(dest):
        dirs[:] = [d for d in dirs if not (top == dest and d == ".gpufleet")]
        on_disk |= {os.path.relpath(os.path.join(top, n), dest) for n in names}
    listed = {e["path"] for e in entries}
    print(json.dumps({"commit": commit, "files": files,
                      "missing": sorted(listed - on_disk), "extra": sorted(on_disk - listed)}))


if __name__ == "__main__":
    main()
