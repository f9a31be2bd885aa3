"""gpufleet.model_lock: the lock's format, its rules and each refusal (issue #32 item 8).
The fetch against a hostile mirror is in test_hf_model_lock.py."""
import hashlib
import os

import pytest

from gpufleet import hub, hub_listing, hub_names, model_lock
from gpufleet.model_lock import LockError, parse_lock

COMMIT = "a" * 40
SHA_A, SHA_B = hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()
GOOD = {"repo_id": "org/m", "commit": COMMIT,
        "files": {"config.json": SHA_A, "model.safetensors": SHA_B, "sub/code.py": SHA_A}}


def listed(path, algorithm, digest):
    return hub_listing.RepoFile(path, 1, algorithm, digest)


def test_a_good_lock_parses_and_round_trips():
    lock = parse_lock({**GOOD, "format": 1, "source": "https://huggingface.co",
                       "written_at": "2026-12-06T19:00:00+00:00"})
    assert (lock.repo_id, lock.commit, lock.files) == ("org/m", COMMIT, GOOD["files"])
    assert parse_lock(lock.as_dict()) == lock
    assert parse_lock(lock) is lock


@pytest.mark.parametrize("data, needle", [
    ([], "must be a mapping"),
    ({**GOOD, "file": {}}, "unknown keys file"),
    ({k: v for k, v in GOOD.items() if k != "commit"}, "lacks commit"),
    ({**GOOD, "format": 2}, "format 2"),
    ({**GOOD, "format": True}, "format True"),
    ({**GOOD, "repo_id": "org/../m"}, "is not a Hugging Face repo id"),
    ({**GOOD, "commit": "main"}, "'main' is not a commit sha"),
    ({**GOOD, "commit": "A" * 40}, "is not a commit sha (40 lowercase"),
    ({**GOOD, "files": {}}, "non-empty mapping"),
    ({**GOOD, "files": ["config.json"]}, "non-empty mapping"),
    ({**GOOD, "files": {"config.json": "abc"}}, "config.json: 'abc' is not a sha256"),
    ({**GOOD, "files": {"config.json": SHA_A.upper()}}, "is not a sha256"),
    ({**GOOD, "files": {"config.json": None}}, "None is not a sha256"),
    ({**GOOD, "files": {"../etc/passwd": SHA_A}}, "'..' component"),
    ({**GOOD, "files": {"/abs": SHA_A}}, "an absolute path"),
    ({**GOOD, "files": {"a b.py": SHA_A}}, "whitespace"),
    ({**GOOD, "files": {".gpufleet/manifest.json": SHA_A}}, "state folder"),
    ({**GOOD, "source": 3}, "source must be a string"),
])
def test_a_bad_lock_is_refused_saying_why(data, needle):
    with pytest.raises(LockError) as exc:
        parse_lock(data)
    assert needle in str(exc.value)


@pytest.mark.parametrize("name", ["a.py", "sub/dir/x.json", "../x", "a/./b", "/x", "a\\b",
                                  "a\nb", "a'b", "", "a//b", "ü/é.txt"])
def test_lock_paths_follow_the_fetch_s_name_rule(name):
    """model_lock repeats hub_names.validate_name's rule (it must not import hub): they agree."""
    try:
        hub_names.validate_name(name, "path")
        hub_ok = True
    except hub.HubError:
        hub_ok = False
    assert (model_lock._path_problem(name) is None) == hub_ok


@pytest.mark.parametrize("repo_id", ["org/m", "m", "org/m.v1", "org/../m", "org/m/x", "-x/m",
                                     "org/m n"])
def test_lock_repo_ids_follow_the_fetch_s_rule(repo_id):
    try:
        hub_names.validate_repo_id(repo_id)
        hub_ok = True
    except hub.HubError:
        hub_ok = False
    try:
        parse_lock({**GOOD, "repo_id": repo_id})
        lock_ok = True
    except LockError:
        lock_ok = False
    assert lock_ok == hub_ok


def test_check_commit_refuses_another_repo_or_commit():
    lock = parse_lock(GOOD)
    model_lock.check_commit(lock, "org/m", COMMIT)  # the control: no refusal
    with pytest.raises(LockError, match="the lock is for org/m, not org/n"):
        model_lock.check_commit(lock, "org/n", COMMIT)
    with pytest.raises(LockError) as exc:
        model_lock.check_commit(lock, "org/m", "b" * 40, "http://mirror")
    assert (f"http://mirror resolves the revision to commit {'b' * 40}, the lock pins "
            f"commit {COMMIT}") in str(exc.value)


def test_check_listing_names_each_refused_file_and_both_values():
    lock = parse_lock(GOOD)
    good = [listed("config.json", "sha1", "1" * 40), listed("model.safetensors", "sha256", SHA_B),
            listed("sub/code.py", "sha1", "2" * 40)]
    model_lock.check_listing(lock, good)  # the control: the trusted listing passes
    bad = [listed("config.json", "sha1", "1" * 40), listed("model.safetensors", "sha256", SHA_A),
           listed("evil.py", "sha1", "3" * 40)]
    with pytest.raises(LockError) as exc:
        model_lock.check_listing(lock, bad)
    assert exc.value.problems == [
        f"model.safetensors: the lock pins sha256 {SHA_B}, the endpoint lists sha256 {SHA_A}",
        f"evil.py: listed by the endpoint (sha1 {'3' * 40}) but not in the lock",
        f"sub/code.py: pinned by the lock (sha256 {SHA_A}) but the endpoint does not list it",
    ]
    assert "nothing was downloaded" in str(exc.value)
    # required narrows what must be listed (the fetch's patterns)
    model_lock.check_listing(lock, good[:2], required={"config.json", "model.safetensors"})


def test_check_listing_shows_ten_problems_and_counts_the_rest():
    lock = parse_lock(GOOD)
    many = [listed(f"x{i}.py", "sha1", "1" * 40) for i in range(15)]
    with pytest.raises(LockError) as exc:
        model_lock.check_listing(lock, many, required=set())
    assert len(exc.value.problems) == 15 and "and 5 more" in str(exc.value)


def test_check_file():
    lock = parse_lock(GOOD)
    model_lock.check_file(lock, "config.json", SHA_A)  # the control
    with pytest.raises(LockError) as exc:
        model_lock.check_file(lock, "config.json", SHA_B)
    assert f"the lock pins sha256 {SHA_A}, the bytes received hash to sha256 {SHA_B}" \
        in str(exc.value)
    with pytest.raises(LockError, match="evil.py: not in the lock"):
        model_lock.check_file(lock, "evil.py", SHA_A)


def test_unpinned_python():
    lock = parse_lock(GOOD)
    assert model_lock.unpinned_python(lock, ["sub/code.py", "config.json", "x.py"]) == ["x.py"]
    assert model_lock.unpinned_python(lock, ["sub/code.py"]) == []


def test_load_lock_file_errors(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("repo_id: [unclosed\n")
    with pytest.raises(LockError, match="is not YAML"):
        model_lock.load_lock_file(str(bad))
    wrong = tmp_path / "wrong.yml"
    wrong.write_text("repo_id: org/m\ncommit: main\nfiles: {}\n")
    with pytest.raises(LockError, match=f"the lock file {wrong}: commit 'main'"):
        model_lock.load_lock_file(str(wrong))


def test_write_lock_file_is_written_once(tmp_path):
    path = str(tmp_path / "m.lock.yml")
    lock = parse_lock(GOOD)
    assert model_lock.write_lock_file(path, lock, dry_run=True) is True
    assert not os.path.exists(path)
    assert model_lock.write_lock_file(path, lock) is True
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert model_lock.load_lock_file(path) == lock
    assert model_lock.write_lock_file(path, lock) is False  # same pins: kept
    moved = parse_lock({**GOOD, "commit": "b" * 40})
    before = open(path).read()
    with pytest.raises(LockError, match="set force to replace it"):
        model_lock.write_lock_file(path, moved)
    assert open(path).read() == before
    assert model_lock.write_lock_file(path, moved, force=True) is True
    assert model_lock.load_lock_file(path).commit == "b" * 40
