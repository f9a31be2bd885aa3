"""Tests of the hf_model module: main() through tests/helpers.run_module, and real
`ansible` runs (token never shown, kill halfway then resume).

The hub is tests/hfstub/server.py, a STAND-IN for a Hugging Face mirror on 127.0.0.1.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import hf_model
from gpufleet import hub_fetch, hub_listing
from helpers import run_module
from hfstub.server import HubStub, Repo  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKEN = "hf_gpufleetTestTokenDoNotLeak42"
FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}',
    "tokenizer.json": b'{"version": "1.0"}' * 200,
    "model.safetensors": os.urandom(2 << 20),
}


@pytest.fixture
def stub():
    with HubStub([Repo("org/tiny", FILES)], token=TOKEN) as s:
        yield s


def args(stub, dest, **kw):
    a = {"repo_id": "org/tiny", "dest": str(dest), "endpoint": stub.url, "token": TOKEN}
    a.update(kw)
    return a


def test_module_fetch_check_and_rerun(stub, tmp_path, monkeypatch):
    dest = tmp_path / "tiny"
    res, failed = run_module(hf_model.main, args(stub, dest), monkeypatch, check_mode=True)
    assert not failed and res["changed"] is True and not dest.exists()
    assert {f["status"] for f in res["files"]} == {"would_download"}

    res, failed = run_module(hf_model.main, args(stub, dest), monkeypatch)
    assert not failed and res["changed"] is True
    assert res["commit"] == stub.repos["org/tiny"].commit
    assert res["bytes_downloaded"] == sum(len(v) for v in FILES.values())
    for path, data in FILES.items():
        assert (dest / path).read_bytes() == data

    res, failed = run_module(hf_model.main, args(stub, dest), monkeypatch)
    assert not failed and res["changed"] is False and res["bytes_downloaded"] == 0
    res, failed = run_module(hf_model.main, args(stub, dest), monkeypatch, check_mode=True)
    assert not failed and res["changed"] is False


def test_module_endpoint_from_hf_endpoint_env(stub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", stub.url + "/")
    a = args(stub, tmp_path / "m", allow_patterns=["*.json"])
    del a["endpoint"]
    res, failed = run_module(hf_model.main, a, monkeypatch)
    assert not failed and sorted(f["path"] for f in res["files"]) == ["config.json",
                                                                     "tokenizer.json"]


@pytest.mark.parametrize("bad,msg", [
    ({"repo_id": "not a repo"}, "repo_id"),
    ({"endpoint": "hf-mirror.com"}, "not an http"),
    ({"max_workers": 0}, "max_workers"),
    ({"timeout": 0}, "timeout"),
    ({"revision": "nope"}, "RevisionNotFound"),
    ({"token": "wrong"}, "401"),
])
def test_module_bad_input_fails_clearly_and_writes_nothing(stub, tmp_path, monkeypatch, bad, msg):
    res, failed = run_module(hf_model.main, args(stub, tmp_path / "m", **bad), monkeypatch)
    assert failed and msg in res["msg"]
    assert not (tmp_path / "m").exists()


def _ansible(module_args, env=None, **popen):
    cmd = [str(ROOT / ".venv/bin/ansible"), "localhost", "-i", "localhost,", "-c", "local",
           "-e", f"ansible_python_interpreter={ROOT / '.venv/bin/python'}", "-m", "gpufleet.fleet.hf_model",
           "-a", json.dumps(module_args), "-vvv"]
    full_env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), **(env or {}))
    return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def _holders(root):
    """Pids of the processes with a file open under root (from /proc: no procps)."""
    pids = set()
    for fd in pathlib.Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd).startswith(str(root) + "/"):
                pids.add(int(fd.parts[2]))
        except (OSError, ValueError):
            continue
    return pids - {os.getpid()}


def _kill_tree(proc, root):
    """SIGKILL proc and every descendant (ansible's local connection runs the module in
    its own session, so a process-group kill misses it), then every process still holding
    a file under root: a module started between the look at /proc and the kill escapes
    the tree (its parent dies, it is re-parented) and would keep dest's fetch lock."""
    children = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [proc.pid], []
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate(timeout=30)
    # SIGKILL lands once a process leaves the kernel: one blocked in a disk write (a busy
    # machine) still holds dest's fetch lock for a while. The killed run is over only when
    # every process of it is gone (or a zombie: its files, the lock's included, are closed).
    deadline = time.monotonic() + 30
    for pid in tree:
        while time.monotonic() < deadline:
            try:
                state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                break
            if state == "Z":
                break
            time.sleep(0.05)
    while time.monotonic() < deadline:
        left = _holders(root)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    else:
        pytest.fail(f"processes {sorted(_holders(root))} still hold files under {root}")


def test_kill_tree_also_stops_a_process_that_escaped_the_tree(tmp_path):
    """A process holding dest's fetch lock outside the killed tree (re-parented when its
    parent died before the tree was read) is killed too, so the next run gets the lock
    (CI, 2026-12-07: "another fetch is writing into ..." right after the kill)."""
    import fcntl

    lock = tmp_path / "lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
         str(lock)], stdout=subprocess.PIPE, text=True)
    tree = subprocess.Popen(["sleep", "60"])
    try:
        assert holder.stdout.readline().strip() == "held"
        _kill_tree(tree, tmp_path)
        holder.wait(timeout=10)
        with open(lock, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while it is held
    finally:
        holder.kill()
        tree.kill()


def test_token_never_appears_in_output_log_or_files(stub, tmp_path):
    """The token is never written: grep every output, log and written file for the token."""
    log = tmp_path / "ansible.log"
    dest = tmp_path / "tiny"
    outputs = []
    for a in (args(stub, dest), args(stub, dest, verify="full"),
              args(stub, dest, revision="no-such-branch")):
        proc = _ansible(a, env={"ANSIBLE_LOG_PATH": str(log)})
        out, _ = proc.communicate(timeout=120)
        outputs.append(out)
    assert '"changed": true' in outputs[0] or "CHANGED" in outputs[0], outputs[0][-2000:]
    assert "SUCCESS" in outputs[1] and "RevisionNotFound" in outputs[2]
    assert f"Bearer {TOKEN}" in stub.seen_auth  # it was used ...
    for out in outputs:  # ... and never shown
        assert TOKEN not in out
    assert log.exists() and TOKEN not in log.read_text()
    for p in tmp_path.rglob("*"):
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p


def test_kill_halfway_then_resume_downloads_less(tmp_path, monkeypatch):
    """Resume: kill the download halfway; the next run resumes."""
    big = os.urandom(24 << 20)
    files = {"config.json": b"{}", "model.safetensors": big}
    dest = tmp_path / "m"
    with HubStub([Repo("org/big", files)], throttle_bps=6 << 20) as s:
        a = {"repo_id": "org/big", "dest": str(dest), "endpoint": s.url}
        proc = _ansible(a)
        # a new commit is fetched into its own folder (plugins/module_utils/gpufleet/revisions.py)
        incomplete = (tmp_path / ".gpufleet-revisions" / "m" / s.repos["org/big"].commit
                      / ".gpufleet" / "incomplete")
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                sizes = [p.stat().st_size for p in incomplete.glob("*.incomplete")] \
                    if incomplete.exists() else []
                if sizes and max(sizes) >= len(big) // 2:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the download never reached half")
        finally:
            _kill_tree(proc, tmp_path)
        assert not (dest / "model.safetensors").exists()  # never under its final name
        kept = max(p.stat().st_size for p in incomplete.glob("*.incomplete"))
        assert kept >= len(big) // 2

        s.throttle_bps = None
        res, failed = run_module(hf_model.main, a, monkeypatch)
    assert not failed, res.get("msg", res)
    assert res["changed"] is True
    assert 0 < res["bytes_downloaded"] <= len(big) - kept + len(files["config.json"])
    assert res["bytes_downloaded"] < len(big)
    assert (dest / "model.safetensors").read_bytes() == big
    assert not list(incomplete.glob("*.incomplete"))


@pytest.mark.slow
def test_against_olah_offline_mirror(tmp_path, monkeypatch):
    """hf_model against olah (a real mirror, offline over a local git
    repo with git-lfs) downloads LFS and non-LFS files, every hash equals the listing
    and git's own, and a second run reports changed: false."""
    import hashlib

    import requests

    from hfstub.olahlab import Olah, git_lfs_repo

    files = {"config.json": FILES["config.json"], "tokenizer/vocab.txt": b"a\nb\nc\n" * 500,
             "model-00001-of-00002.safetensors": os.urandom(3 << 20),
             "model-00002-of-00002.safetensors": os.urandom(1 << 20)}
    repo_dir = tmp_path / "mirrors/models/lab/tiny"
    commit = git_lfs_repo(repo_dir, files)
    dest = tmp_path / "dest"
    with Olah(tmp_path) as url:
        a = {"repo_id": "lab/tiny", "dest": str(dest), "endpoint": url, "max_workers": 4}
        listing = requests.get(f"{url}/api/models/lab/tiny/tree/{commit}",
                               params={"recursive": "true"}, timeout=30).json()
        res, failed = run_module(hf_model.main, a, monkeypatch)
        assert not failed, res
        assert res["changed"] is True and res["commit"] == commit
        by_path = {f["path"]: f for f in res["files"]}
        assert set(by_path) == set(files) | {".gitattributes"}
        for row in listing:
            if row["type"] != "file":
                continue
            f = by_path[row["path"]]
            data = (dest / row["path"]).read_bytes()
            if "lfs" in row:
                assert f["algorithm"] == "sha256"
                assert f["digest"] == row["lfs"]["oid"] == hashlib.sha256(data).hexdigest()
            else:
                git_oid = subprocess.run(["git", "hash-object", str(dest / row["path"])],
                                         capture_output=True, text=True, check=True).stdout.strip()
                assert f["algorithm"] == "sha1" and f["digest"] == row["oid"] == git_oid
            if row["path"] in files:
                assert data == files[row["path"]]

        again, failed = run_module(hf_model.main, a, monkeypatch)
        assert not failed and again["changed"] is False and again["bytes_downloaded"] == 0
        full, failed = run_module(hf_model.main, dict(a, verify="full"), monkeypatch)
        assert not failed and full["changed"] is False
        assert full["bytes_verified"] == sum(f["size"] for f in res["files"])

        # olah ignores Range: a partial file is restarted, and still verified
        os.unlink(dest / "model-00002-of-00002.safetensors")
        (dest / ".gpufleet/manifest.json").unlink()
        f2 = by_path["model-00002-of-00002.safetensors"]
        part = pathlib.Path(hub_fetch.Fetcher(None, "lab/tiny", commit, str(dest)).partial_path(
            hub_listing.RepoFile(f2["path"], f2["size"], f2["algorithm"], f2["digest"])))
        part.write_bytes(files["model-00002-of-00002.safetensors"][:1000])
        res3, failed = run_module(hf_model.main, a, monkeypatch)
        assert not failed and res3["changed"] is True
        assert res3["bytes_downloaded"] == 1 << 20
        assert (dest / "model-00002-of-00002.safetensors").read_bytes() == \
            files["model-00002-of-00002.safetensors"]


@pytest.mark.slow
def test_model_fetch_role_async_progress_modes_and_rerun(tmp_path):
    """roles/model_fetch: check mode, an async fetch with progress reports, modes that let
    the group read but not write, a re-run that changes nothing, the token never shown."""
    big = os.urandom(8 << 20)
    files = {"config.json": FILES["config.json"], "model.safetensors": big}
    root = tmp_path / "models"
    with HubStub([Repo("org/tiny", files)], token=TOKEN, throttle_bps=1 << 20) as s:
        pb = tmp_path / "fetch.yml"
        pb.write_text(f"""
- hosts: localhost
  gather_facts: false
  roles:
    - role: gpufleet.fleet.model_fetch
      vars:
        model_fetch_models: [{{repo_id: org/tiny}}]
        model_fetch_root: "{root}"
        model_fetch_endpoint: "{s.url}"
        model_fetch_token: "{TOKEN}"
        model_fetch_group: root
        model_fetch_create_group: false
        model_fetch_progress_interval: 5
""")

        def play(*extra):
            out = subprocess.run(
                [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local",
                 "-e", f"ansible_python_interpreter={ROOT / '.venv/bin/python'}", str(pb),
                 *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
            assert TOKEN not in out.stdout + out.stderr
            return out.stdout

        checked = play("--check")
        assert not (root / "org/tiny/model.safetensors").exists()
        assert "would_download" in play("--check", "-v") or "would_download" in checked
        first = play()
        s.throttle_bps = None
        second = play()
    dest = root / "org/tiny"
    assert (dest / "model.safetensors").read_bytes() == big
    assert "files," in first and "GiB verified" in first  # a progress report while it ran
    assert "changed=True" in first and "changed=False" in second
    assert "changed=0" in second.split("PLAY RECAP")[1], second
    assert (dest.stat().st_mode & 0o777) == 0o750
    assert dest.is_symlink()  # to its commit folder, which the role gave the same modes
    assert ((root / "org/.gpufleet-revisions").stat().st_mode & 0o777) == 0o750
    assert ((dest / "model.safetensors").stat().st_mode & 0o777) == 0o640
