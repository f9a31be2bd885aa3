"""Tests of gpufleet.hub (sync_repo: a verified HF fetch), and through it hub_client and
hub_fetch, against loopback stand-ins.

The hub is tests/hfstub/server.py (a STAND-IN for huggingface.co or a mirror: a real HTTP
server on 127.0.0.1); faults come from tests/hfstub/faultproxy.py (a TEST DOUBLE put
between client and mirror).
"""
import hashlib
import json
import os
import pathlib
import random
import subprocess
import sys
import time

import pytest

from gpufleet import hub, hub_client, hub_fetch, hub_listing
from hfstub.faultproxy import ALL_FAULTS, FaultProxy  # noqa: E402
from hfstub.server import HubStub, Repo, git_blob_sha1  # noqa: E402


def make_files(seed=0, n_small=4, lfs_sizes=(300_000, 1 << 20)):
    rnd = random.Random(seed)
    files = {"config.json": json.dumps({"model_type": "llama", "seed": seed}).encode(),
             "README.md": b"# test model\n", "empty.txt": b""}
    for i in range(n_small):
        files[f"tokenizer/part{i}.json"] = rnd.randbytes(rnd.randrange(1, 20_000))
    for i, size in enumerate(lfs_sizes):
        files[f"model-{i:05d}.safetensors"] = rnd.randbytes(size)
    return files


def client(url, **kw):
    kw.setdefault("timeout", 2)
    kw.setdefault("retries", 4)
    kw.setdefault("backoff", 0.001)
    return hub_client.HubClient(url, **kw)


def assert_tree_matches(dest, files, only_present=False):
    """Every file under its final name has exactly the listed bytes."""
    for path, data in files.items():
        p = pathlib.Path(dest, path)
        if only_present and not p.exists():
            continue
        assert p.read_bytes() == data, f"{path} has wrong content"


def final_files(dest):
    return sorted(str(p.relative_to(dest)) for p in pathlib.Path(dest).rglob("*")
                  if p.is_file() and ".gpufleet" not in p.parts)


@pytest.fixture
def files():
    return make_files()


@pytest.fixture
def stub(files):
    with HubStub([Repo("org/model", files, refs=("main", "v1.0"))], page_size=3) as s:
        yield s


# ---------------------------------------------------------------- fetch against the stub

def test_fetch_verifies_everything_and_second_run_is_unchanged(stub, files, tmp_path):
    dest = tmp_path / "m"
    res = hub.sync_repo(client(stub.url), "org/model", "main", dest)
    assert res["changed"] is True
    assert res["commit"] == stub.repos["org/model"].commit
    assert res["bytes_downloaded"] == sum(len(v) for v in files.values())
    assert final_files(dest) == sorted(files)
    assert_tree_matches(dest, files)
    # the listing came in pages (page_size=3) through Link headers
    assert len(stub.requests_for("/tree/")) >= len(files) // 3
    # LFS files were redirected to the CDN stand-in and fetched there
    assert len(stub.requests_for("/lfs-cdn/")) == 2
    manifest = json.loads((dest / ".gpufleet/manifest.json").read_text())
    assert manifest["commit"] == res["commit"] and manifest["complete"] is True
    for f in res["files"]:
        assert manifest["files"][f["path"]][f["algorithm"]] == f["digest"]
        data = files[f["path"]]
        want = hashlib.sha256(data).hexdigest() if f["algorithm"] == "sha256" else git_blob_sha1(data)
        assert f["digest"] == want

    again = hub.sync_repo(client(stub.url), "org/model", "main", dest, verify="manifest")
    assert again["changed"] is False and again["bytes_downloaded"] == 0
    assert again["bytes_verified"] == 0  # trusted by size+mtime, nothing re-read
    assert {f["status"] for f in again["files"]} == {"trusted"}
    full = hub.sync_repo(client(stub.url), "org/model", "v1.0", dest, verify="full")
    assert full["changed"] is False
    assert full["bytes_verified"] == sum(len(v) for v in files.values())


def test_revision_by_commit_and_unknown_revision(stub, tmp_path):
    commit = stub.repos["org/model"].commit
    res = hub.sync_repo(client(stub.url), "org/model", commit, tmp_path / "m",
                        allow_patterns=["*.json"])
    assert res["commit"] == commit
    with pytest.raises(hub.HubError, match="404 RevisionNotFound"):
        hub.sync_repo(client(stub.url), "org/model", "nope", tmp_path / "n")
    assert not (tmp_path / "n").exists()


def test_no_matching_files_is_an_error(stub, tmp_path):
    with pytest.raises(hub.HubError, match="matches allow_patterns"):
        hub.sync_repo(client(stub.url), "org/model", "main", tmp_path / "m",
                      allow_patterns=["*.gguf"])


def test_check_mode_writes_nothing(stub, files, tmp_path):
    dest = tmp_path / "m"
    res = hub.sync_repo(client(stub.url), "org/model", "main", dest, check_mode=True)
    assert res["changed"] is True
    assert {f["status"] for f in res["files"]} == {"would_download"}
    assert res["bytes_to_download"] == sum(len(v) for v in files.values())
    assert not dest.exists()
    assert not stub.requests_for("/resolve/")
    hub.sync_repo(client(stub.url), "org/model", "main", dest)
    res = hub.sync_repo(client(stub.url), "org/model", "main", dest, check_mode=True)
    assert res["changed"] is False and {f["status"] for f in res["files"]} == {"trusted"}


def test_resume_partial_with_range(stub, files, tmp_path):
    dest = tmp_path / "m"
    name = "model-00001.safetensors"
    data = files[name]
    f = next(x for x in hub_listing.parse_tree(stub.repos["org/model"].tree()) if x.path == name)
    fetcher = hub_fetch.Fetcher(None, "org/model", "c", str(dest))
    part = pathlib.Path(fetcher.partial_path(f))
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:400_000])
    res = hub.sync_repo(client(stub.url), "org/model", "main", dest, allow_patterns=[name])
    assert res["bytes_downloaded"] == len(data) - 400_000
    assert res["bytes_verified"] == len(data)
    assert ("GET", f"/lfs-cdn/{f.digest}", "bytes=400000-") in stub.log
    assert (dest / name).read_bytes() == data
    assert not part.exists()


def test_mirror_without_range_restarts_the_file(files, tmp_path):
    """olah 0.5.4 answers 200 with the whole file to a Range request."""
    name = "model-00001.safetensors"
    data = files[name]
    with HubStub([Repo("org/model", files)], range_support=False, lfs_redirect=False) as s:
        f = next(x for x in hub_listing.parse_tree(s.repos["org/model"].tree()) if x.path == name)
        part = pathlib.Path(hub_fetch.Fetcher(None, "org/model", "c", str(tmp_path)).partial_path(f))
        part.parent.mkdir(parents=True)
        part.write_bytes(data[:100])
        res = hub.sync_repo(client(s.url), "org/model", "main", tmp_path, allow_patterns=[name])
        assert s.requests_for("/resolve/")[0][2] == "bytes=100-"
        assert not s.requests_for("/lfs-cdn/")
    assert res["bytes_downloaded"] == len(data)
    assert (tmp_path / name).read_bytes() == data


def test_corrupt_partial_is_quarantined_and_refetched(stub, files, tmp_path):
    name = "model-00000.safetensors"
    f = next(x for x in hub_listing.parse_tree(stub.repos["org/model"].tree()) if x.path == name)
    part = pathlib.Path(hub_fetch.Fetcher(None, "org/model", "c", str(tmp_path)).partial_path(f))
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * 1000)  # not a prefix of the real bytes
    res = hub.sync_repo(client(stub.url), "org/model", "main", tmp_path, allow_patterns=[name])
    assert [q["path"] for q in res["quarantined"]] == [name]
    assert (tmp_path / name).read_bytes() == files[name]
    assert (tmp_path / ".gpufleet/quarantine" / name).read_bytes()[:1000] == b"\0" * 1000


def test_rotten_file_on_disk_is_caught_by_full_verify(stub, files, tmp_path):
    name = "model-00001.safetensors"
    hub.sync_repo(client(stub.url), "org/model", "main", tmp_path)
    p = tmp_path / name
    st = p.stat()
    with open(p, "r+b") as fh:  # bit rot: same size, same mtime
        fh.seek(12345)
        fh.write(bytes([fh.read(1)[0] ^ 1]))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    trusting = hub.sync_repo(client(stub.url), "org/model", "main", tmp_path, verify="manifest")
    assert trusting["changed"] is False  # documented: manifest mode trusts size+mtime
    res = hub.sync_repo(client(stub.url), "org/model", "main", tmp_path, verify="full")
    assert res["changed"] is True and [q["path"] for q in res["quarantined"]] == [name]
    assert p.read_bytes() == files[name]


def test_touched_file_is_rehashed_in_manifest_mode(stub, files, tmp_path):
    hub.sync_repo(client(stub.url), "org/model", "main", tmp_path)
    os.utime(tmp_path / "config.json", ns=(1, 1))
    res = hub.sync_repo(client(stub.url), "org/model", "main", tmp_path, verify="manifest")
    status = {f["path"]: f["status"] for f in res["files"]}
    assert status["config.json"] == "verified" and status["README.md"] == "trusted"
    assert res["bytes_verified"] == len(files["config.json"])
    assert res["changed"] is True  # the manifest records the new mtime


def test_mirror_that_keeps_lying_fails_naming_file_and_hashes(files, tmp_path):
    name = "model-00000.safetensors"
    bad = bytearray(files[name])
    bad[777] ^= 0x40
    with HubStub([Repo("org/model", files)], corrupt={name: bytes(bad)}) as s:
        with pytest.raises(hub.HubError) as exc:
            hub.sync_repo(client(s.url), "org/model", "main", tmp_path)
    msg = str(exc.value)
    assert name in msg and hashlib.sha256(files[name]).hexdigest() in msg
    assert hashlib.sha256(bytes(bad)).hexdigest() in msg
    assert not (tmp_path / name).exists()
    others = [p for p in files if p != name]
    assert_tree_matches(tmp_path, {p: files[p] for p in others})
    manifest = json.loads((tmp_path / ".gpufleet/manifest.json").read_text())
    assert manifest["complete"] is False and name not in manifest["files"]
    assert exc.value.result["quarantined"][-1]["got"] == hashlib.sha256(bytes(bad)).hexdigest()


def test_disk_space_preflight_refuses_before_writing(stub, tmp_path, monkeypatch):
    real = hub_fetch.shutil.disk_usage

    def tiny(path):
        return real(path)._replace(free=10 << 20)

    monkeypatch.setattr(hub_fetch.shutil, "disk_usage", tiny)
    dest = tmp_path / "m"
    with pytest.raises(hub.DiskSpaceError, match="nothing was written"):
        hub.sync_repo(client(stub.url), "org/model", "main", dest)
    assert not dest.exists()
    assert not stub.requests_for("/resolve/")


def test_space_margin(tmp_path, monkeypatch):
    usage = hub_fetch.shutil.disk_usage(tmp_path)._replace(free=100 << 20)
    monkeypatch.setattr(hub_fetch.shutil, "disk_usage", lambda path: usage)
    hub_fetch.check_disk_space(str(tmp_path / "new" / "dir"), 30 << 20)  # 30 + 64 MiB margin fits
    with pytest.raises(hub.DiskSpaceError):
        hub_fetch.check_disk_space(str(tmp_path), 40 << 20)


def test_second_fetch_into_same_dest_is_refused(stub, tmp_path):
    lock = hub._Lock(str(tmp_path))
    try:
        with pytest.raises(hub.HubError, match="another fetch"):
            hub.sync_repo(client(stub.url), "org/model", "main", tmp_path)
    finally:
        lock.release()


def test_token_is_sent_and_never_written(files, tmp_path):
    token = "hf_TopSecretTok3n"
    with HubStub([Repo("org/model", files)], token=token) as s:
        with pytest.raises(hub.HubError, match="401"):
            hub.sync_repo(client(s.url), "org/model", "main", tmp_path / "x")
        res = hub.sync_repo(client(s.url, token=token), "org/model", "main", tmp_path / "m")
        assert f"Bearer {token}" in s.seen_auth
    assert token not in json.dumps(res)
    for p in pathlib.Path(tmp_path).rglob("*"):
        if p.is_file():
            assert token.encode() not in p.read_bytes(), p


def test_token_is_not_sent_to_the_lfs_cdn_host(files, tmp_path):
    """The hub redirects LFS files to a CDN on another host; the token stays with the hub."""
    token = "hf_TopSecretTok3n"
    repo = Repo("org/model", files)
    with HubStub([repo]) as cdn:
        cdn_url = cdn.url.replace("127.0.0.1", "localhost")  # another host name
        with HubStub([repo], token=token, cdn_url=cdn_url) as s:
            hub.sync_repo(client(s.url, token=token), "org/model", "main", tmp_path)
        assert len(cdn.requests_for("/lfs-cdn/")) == 2
        assert set(cdn.seen_auth) == {None}
    assert_tree_matches(tmp_path, files)


# ---------------------------------------------------------------- retries and faults

def test_429_retry_after_is_honoured(stub, tmp_path):
    with FaultProxy(stub.url, queue=["429"], retry_after="1") as p:
        t0 = time.monotonic()
        hub.sync_repo(client(p.url), "org/model", "main", tmp_path, allow_patterns=["README.md"])
        assert time.monotonic() - t0 >= 1.0
        assert p.injected["429"] == 1


def test_persistent_500_gives_up_clearly(stub, tmp_path):
    with FaultProxy(stub.url, rate=1.0, kinds=["500"]) as p:
        with pytest.raises(hub.HubError, match=r"answered 500 \(gave up after 3 attempts\)"):
            hub.sync_repo(client(p.url, retries=2), "org/model", "main", tmp_path)
        assert p.injected["500"] == 3


def test_dropped_connection_resumes_from_offset(stub, files, tmp_path):
    name = "model-00001.safetensors"
    with FaultProxy(stub.url, queue=["drop"], only="/lfs-cdn/") as p:
        res = hub.sync_repo(client(p.url), "org/model", "main", tmp_path / "m",
                            allow_patterns=[name])
        assert p.injected["drop"] == 1
    ranges = [r for r in stub.log if r[1].startswith("/lfs-cdn/")]
    assert len(ranges) == 2 and ranges[0][2] is None
    assert ranges[1][2] == f"bytes={len(files[name]) // 2}-"  # resumed, not restarted
    assert res["bytes_downloaded"] == len(files[name])
    assert (tmp_path / "m" / name).read_bytes() == files[name]


def test_stalled_connection_times_out_and_resumes(stub, files, tmp_path):
    with FaultProxy(stub.url, queue=["stall"], stall_s=1.0, only="/lfs-cdn/") as p:
        t0 = time.monotonic()
        hub.sync_repo(client(p.url, timeout=0.3), "org/model", "main", tmp_path,
                      allow_patterns=["model-00000.safetensors"])
        assert time.monotonic() - t0 < 5
        assert p.injected["stall"] == 1
    assert_tree_matches(tmp_path, files, only_present=True)


def test_over_100_injected_faults_never_leave_a_wrong_file(tmp_path):
    """Issue 6: across >= 100 faults of every kind, no file with wrong bytes is ever
    accepted under its final name; runs either succeed or fail naming the problem."""
    files = make_files(seed=7, n_small=6, lfs_sizes=(200_000, 500_000, 64_000))
    outcomes = {"ok": 0, "failed": 0}
    quarantined = 0
    with HubStub([Repo("org/model", files)], page_size=4) as s, \
            FaultProxy(s.url, rate=0.35, kinds=ALL_FAULTS, seed=11, stall_s=0.5) as p:
        dest = tmp_path / "run0"
        for run in range(80):
            try:
                res = hub.sync_repo(client(p.url, timeout=0.25, retries=6), "org/model",
                                    "main", dest)
            except hub.HubError as exc:
                outcomes["failed"] += 1
                assert any(w in str(exc) for w in ("mismatch", "gave up")), str(exc)
                quarantined += len(getattr(exc, "result", {}).get("quarantined", []))
                assert_tree_matches(dest, files, only_present=True)
                continue  # the next run resumes into the same dest
            outcomes["ok"] += 1
            quarantined += len(res["quarantined"])
            assert final_files(dest) == sorted(files)
            assert_tree_matches(dest, files)
            dest = tmp_path / f"run{run + 1}"  # a fresh dest downloads everything again
            if p.total_faults >= 120 and all(p.injected[k] for k in ALL_FAULTS):
                break
        faults = dict(p.injected)
    print(f"faults injected: {faults}; runs {outcomes}; quarantined {quarantined}")
    assert sum(faults.values()) >= 100
    assert all(faults.get(k, 0) > 0 for k in ALL_FAULTS), faults
    # flipped bytes were caught by the hash (two flips in one file cost one quarantine)
    assert 0 < quarantined <= faults["flip"]
    assert outcomes["ok"] > 0


def test_wrong_size_file_leaves_its_final_name_even_if_the_fetch_fails(files, tmp_path):
    name = "model-00000.safetensors"
    (tmp_path / name).write_bytes(b"an older revision of this file")
    with HubStub([Repo("org/model", files)], corrupt={name: b"x" * len(files[name])}) as s:
        plan = hub.sync_repo(client(s.url), "org/model", "main", tmp_path, check_mode=True)
        assert {f["path"]: f["status"] for f in plan["files"]}[name] == "would_download"
        with pytest.raises(hub.HubError, match="mismatch"):
            hub.sync_repo(client(s.url), "org/model", "main", tmp_path)
    assert not (tmp_path / name).exists()
    assert_tree_matches(tmp_path, files, only_present=True)


def test_disk_write_error_fails_at_once_naming_the_file(stub, files, tmp_path):
    """A write error (here EFBIG from RLIMIT_FSIZE, like a full disk) is not a network
    fault: no retries, a message naming the file, nothing under the final name."""
    name = "model-00001.safetensors"
    code = f"""
import resource, signal, sys
from gpufleet import hub, hub_client
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
try:
    hub.sync_repo(hub_client.HubClient({stub.url!r}, retries=3, backoff=0.001), "org/model", "main",
                  {str(tmp_path)!r}, allow_patterns=[{name!r}])
except hub.HubError as exc:
    print(exc)
"""
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(hub.__file__).parent.parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env)
    assert name in out.stdout and "File too large" in out.stdout, out.stdout + out.stderr
    assert len(stub.requests_for("/lfs-cdn/")) == 1  # not retried
    assert not (tmp_path / name).exists()


def test_new_revision_replaces_changed_files_without_quarantine(files, tmp_path):
    """main moved: files the manifest verified at the old commit are replaced, not hashed
    again nor kept in quarantine; unchanged files stay trusted."""
    v2 = dict(files)
    v2["config.json"] = b'{"model_type": "llama", "seed": 1}'  # same size, new content
    v2["model-00000.safetensors"] = random.Random(5).randbytes(len(files["model-00000.safetensors"]))
    with HubStub([Repo("org/model", files)]) as s:
        hub.sync_repo(client(s.url), "org/model", "main", tmp_path)
    with HubStub([Repo("org/model", v2)]) as s:
        plan = hub.sync_repo(client(s.url), "org/model", "main", tmp_path, check_mode=True)
        status = {f["path"]: f["status"] for f in plan["files"]}
        assert status["config.json"] == status["model-00000.safetensors"] == "would_download"
        assert status["README.md"] == "trusted"
        res = hub.sync_repo(client(s.url), "org/model", "main", tmp_path)
    assert res["quarantined"] == [] and res["changed"] is True
    changed = len(v2["config.json"]) + len(v2["model-00000.safetensors"])
    assert res["bytes_downloaded"] == res["bytes_verified"] == changed
    assert_tree_matches(tmp_path, v2)
    manifest = json.loads((tmp_path / ".gpufleet/manifest.json").read_text())
    assert manifest["commit"] == res["commit"]


def test_new_commit_with_the_same_files_is_recorded(files, tmp_path):
    """main moved by a commit that touched only files outside the patterns: nothing is
    downloaded, but the manifest must name the new commit (the deploy's model-commit label
    and the upgrade's last-good record read it; the old commit may no longer be served, as
    on the lab's site mirror, where a rollback pinned to it answered 404)."""
    v2 = dict(files)
    v2["README.md"] = b"a new README only\n"
    allow = ["*.json", "*.safetensors"]
    with HubStub([Repo("org/model", files)]) as s:
        first = hub.sync_repo(client(s.url), "org/model", "main", tmp_path, allow_patterns=allow)
    with HubStub([Repo("org/model", v2)]) as s:
        plan = hub.sync_repo(client(s.url), "org/model", "main", tmp_path, allow_patterns=allow,
                             check_mode=True)
        assert plan["changed"] is True and plan["commit"] != first["commit"]
        assert {f["status"] for f in plan["files"]} == {"trusted"}
        res = hub.sync_repo(client(s.url), "org/model", "main", tmp_path, allow_patterns=allow)
        again = hub.sync_repo(client(s.url), "org/model", "main", tmp_path, allow_patterns=allow)
    assert res["changed"] is True and res["bytes_downloaded"] == 0
    manifest = json.loads((tmp_path / ".gpufleet/manifest.json").read_text())
    assert manifest["commit"] == res["commit"] == plan["commit"]
    assert again["changed"] is False


def test_patterns_add_up_and_files_deleted_upstream_are_removed(files, tmp_path):
    with HubStub([Repo("org/model", files)]) as s:
        hub.sync_repo(client(s.url), "org/model", "main", tmp_path, allow_patterns=["*.json"])
        res = hub.sync_repo(client(s.url), "org/model", "main", tmp_path,
                            ignore_patterns=["*.json"])
        assert res["removed"] == []
    manifest = json.loads((tmp_path / ".gpufleet/manifest.json").read_text())
    assert set(manifest["files"]) == set(files)  # both runs' files are recorded
    (tmp_path / "mine.txt").write_text("a file hf_model did not fetch")
    v2 = {k: v for k, v in files.items() if k != "model-00001.safetensors"}
    with HubStub([Repo("org/model", v2)]) as s:
        plan = hub.sync_repo(client(s.url), "org/model", "main", tmp_path, check_mode=True)
        assert plan["changed"] and plan["removed"] == ["model-00001.safetensors"]
        assert (tmp_path / "model-00001.safetensors").exists()
        res = hub.sync_repo(client(s.url), "org/model", "main", tmp_path)
        assert res["changed"] and res["removed"] == ["model-00001.safetensors"]
        again = hub.sync_repo(client(s.url), "org/model", "main", tmp_path)
        assert again["changed"] is False and again["removed"] == []
    assert final_files(tmp_path) == sorted([*v2, "mine.txt"])  # ours only were removed
    assert_tree_matches(tmp_path, v2)
