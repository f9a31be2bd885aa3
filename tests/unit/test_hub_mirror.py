"""Site mirror: gpufleet.hub_mirror, the hf_mirror_index module and the hf_site_mirror role
served by a real nginx, fetched from by hf_model and by `hf download` (huggingface_hub).

Model folders are fetched with hf_model from tests/hfstub/server.py (a STAND-IN hub).
"""
import hashlib
import json
import os
import pathlib
import subprocess

import pytest
import requests

import hf_mirror_index
import hf_model
from gpufleet import hub, hub_client, hub_mirror
from helpers import run_module
from hfstub.server import HubStub, Repo, git_blob_sha1  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}',
    "tokenizer/tokenizer.json": b'{"version": "1.0", "model": {}}' * 50,
    "model.safetensors": os.urandom(3 << 20),
}


@pytest.fixture
def fetched(tmp_path):
    """A folder fetched (and verified) by hf_model."""
    folder = tmp_path / "models" / "tiny"
    with HubStub([Repo("lab/tiny", FILES)]) as s:
        hub.sync_repo(hub_client.HubClient(s.url), "lab/tiny", "main", folder)
        commit = s.repos["lab/tiny"].commit
    return folder, commit


def test_site_tree_lists_the_manifest_hashes(fetched, tmp_path):
    folder, commit = fetched
    site = tmp_path / "site"
    res = hub_mirror.build_site(site, [{"path": str(folder)}])
    assert res["changed"] and res["repos"][0]["commit"] == commit
    tree = json.loads((site / f"www/api/models/lab/tiny/tree/{commit}").read_text())
    files = {e["path"]: e for e in tree if e["type"] == "file"}
    assert set(files) == set(FILES)
    assert files["model.safetensors"]["lfs"]["oid"] == hashlib.sha256(FILES["model.safetensors"]).hexdigest()
    assert files["config.json"]["oid"] == git_blob_sha1(FILES["config.json"])
    assert {"type": "directory", "path": "tokenizer"}.items() <= next(
        e for e in tree if e["path"] == "tokenizer").items()
    info = json.loads((site / "www/api/models/lab/tiny/revision/main").read_text())
    assert info["sha"] == commit and len(info["siblings"]) == 3
    # resolve links point into the folder: nothing copied
    assert os.readlink(site / "www/lab/tiny/resolve/main") == commit
    assert os.readlink(site / f"www/lab/tiny/resolve/{commit}") == str(folder)
    assert (site / "www/lab/tiny/resolve/main/model.safetensors").read_bytes() == FILES["model.safetensors"]
    etags = (site / "nginx/etags.map").read_text()
    assert f'"lab/tiny/config.json" "{git_blob_sha1(FILES["config.json"])}";' in etags
    # idempotent, and check mode writes nothing
    again = hub_mirror.build_site(site, [{"path": str(folder)}])
    assert again["changed"] is False and again["changed_paths"] == []


def test_site_drops_what_is_no_longer_published(fetched, tmp_path):
    folder, _ = fetched
    site = tmp_path / "site"
    hub_mirror.build_site(site, [{"path": str(folder)}])
    res = hub_mirror.build_site(site, [{"path": str(folder), "repo_id": "other/name"}],
                                check_mode=True)
    assert res["changed"] and any("lab/tiny" in p for p in res["changed_paths"])
    assert (site / "www/api/models/lab/tiny/revision/main").exists()  # check mode
    hub_mirror.build_site(site, [{"path": str(folder), "repo_id": "other/name"}])
    assert not (site / "www/api/models/lab").exists()
    assert not os.path.lexists(site / "www/lab/tiny/resolve/main")
    assert "lab/tiny" not in (site / "nginx/etags.map").read_text()


def test_refuses_folders_that_are_not_verified(fetched, tmp_path):
    folder, _ = fetched
    with pytest.raises(hub.HubError, match="no readable manifest"):
        hub_mirror.build_site(tmp_path / "s", [{"path": str(tmp_path)}])
    os.utime(folder / "config.json", ns=(1, 1))
    with pytest.raises(hub.HubError, match="changed since it was verified"):
        hub_mirror.build_site(tmp_path / "s", [{"path": str(folder)}])
    assert not (tmp_path / "s").exists()


def test_refuses_incomplete_fetch_and_duplicates(fetched, tmp_path):
    folder, _ = fetched
    with pytest.raises(hub.HubError, match="given twice"):
        hub_mirror.build_site(tmp_path / "s", [{"path": str(folder)}] * 2)
    m = folder / ".gpufleet/manifest.json"
    data = json.loads(m.read_text())
    m.write_text(json.dumps(dict(data, complete=False)))
    with pytest.raises(hub.HubError, match="did not complete"):
        hub_mirror.build_site(tmp_path / "s", [{"path": str(folder)}])


def test_module_check_mode_and_rerun(fetched, tmp_path, monkeypatch):
    folder, _ = fetched
    a = {"root": str(tmp_path / "site"), "models": [{"path": str(folder)}]}
    res, failed = run_module(hf_mirror_index.main, a, monkeypatch, check_mode=True)
    assert not failed and res["changed"] and not (tmp_path / "site").exists()
    res, failed = run_module(hf_mirror_index.main, a, monkeypatch)
    assert not failed and res["changed"] and res["repos"][0]["files"] == 3
    res, failed = run_module(hf_mirror_index.main, a, monkeypatch)
    assert not failed and res["changed"] is False
    res, failed = run_module(hf_mirror_index.main, {"root": a["root"], "models": [{"x": 1}]},
                             monkeypatch)
    assert failed and "has no path" in res["msg"]


def _playbook(tmp_path, folder, port, extra=""):
    pb = tmp_path / "site.yml"
    pb.write_text(f"""
- hosts: localhost
  gather_facts: false
  roles:
    - role: gpufleet.fleet.hf_site_mirror
      vars:
        hf_site_mirror_models: [{{path: "{folder}"}}]
        hf_site_mirror_root: "{tmp_path / 'site'}"
        hf_site_mirror_port: {port}
        hf_site_mirror_nginx_conf_dir: "{tmp_path / 'conf.d'}"
        hf_site_mirror_install: false
        hf_site_mirror_manage_service: false
{extra}""")
    (tmp_path / "conf.d").mkdir(exist_ok=True)
    out = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
         f"ansible_python_interpreter={ROOT / '.venv/bin/python'}", str(pb)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return out.stdout


@pytest.mark.slow
def test_role_serves_hf_model_and_hf_download(fetched, tmp_path, monkeypatch):
    """hf_model and `hf download` both fetch correctly from the site
    mirror (nginx, sendfile), with hashes, ETag, X-Repo-Commit, Range and error codes."""
    from hfstub.nginxlab import Nginx, free_port
    from hfstub.venvs import tool_venv

    folder, commit = fetched
    port = free_port()
    first = _playbook(tmp_path, folder, port)
    assert "changed=2" in first
    assert "changed=0" in _playbook(tmp_path, folder, port)  # idempotent
    url = f"http://127.0.0.1:{port}"
    with Nginx(tmp_path / "nginx", tmp_path / "conf.d") as n:
        n.wait(url)
        head = requests.head(f"{url}/lab/tiny/resolve/main/model.safetensors", timeout=10)
        assert head.headers["ETag"] == f'"{hashlib.sha256(FILES["model.safetensors"]).hexdigest()}"'
        assert head.headers["X-Repo-Commit"] == commit
        part = requests.get(f"{url}/lab/tiny/resolve/{commit}/config.json",
                            headers={"Range": "bytes=5-"}, timeout=10)
        assert part.status_code == 206 and part.content == FILES["config.json"][5:]
        for path, code, error in (("lab/tiny/resolve/main/missing.json", 404, "EntryNotFound"),
                                  ("lab/tiny/resolve/main/.gpufleet/manifest.json", 404,
                                   "EntryNotFound"),
                                  ("lab/tiny/resolve/nobranch/config.json", 404,
                                   "RevisionNotFound"),
                                  ("api/models/no/repo/revision/main", 401, "RepoNotFound")):
            r = requests.get(f"{url}/{path}", timeout=10)
            assert (r.status_code, r.headers.get("X-Error-Code")) == (code, error), path

        dest = tmp_path / "via-hf_model"
        res, failed = run_module(hf_model.main, {"repo_id": "lab/tiny", "dest": str(dest),
                                                 "endpoint": url}, monkeypatch)
        assert not failed and res["commit"] == commit
        res2, _ = run_module(hf_model.main, {"repo_id": "lab/tiny", "dest": str(dest),
                                             "endpoint": url}, monkeypatch)
        assert res2["changed"] is False

        hf = tool_venv("hfhub")
        env = dict(os.environ, HF_ENDPOINT=url, HF_HOME=str(tmp_path / "hf-home"),
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1")
        local = tmp_path / "via-hf-download"
        out = subprocess.run([str(hf / "hf"), "download", "lab/tiny", "--local-dir", str(local)],
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        # the same client's own view: a missing optional file is "not there", not an error
        probe = subprocess.run(
            [str(hf / "python"), "-c",
             "import huggingface_hub as h;"
             "print(h.file_exists('lab/tiny','generation_config.json'),"
             " h.file_exists('lab/tiny','config.json'),"
             " h.HfApi().model_info('lab/tiny').sha)"],
            env=env, capture_output=True, text=True, timeout=120)
        assert probe.stdout.split() == ["False", "True", commit], probe.stderr[-2000:]
    for rel, data in FILES.items():
        assert (dest / rel).read_bytes() == data
        assert (local / rel).read_bytes() == data


@pytest.mark.slow
def test_role_serves_tls_and_hf_model_verifies_it_with_the_fleet_ca(fetched, tmp_path, monkeypatch):
    """hf_site_mirror_tls: the role's nginx serves https with the fleet CA's certificate
    (made by roles/fleet_ca in a test folder); hf_model fetches with ca_file (the fleet CA)
    and every byte verifies; another CA's file is refused before anything is fetched into
    dest, and plain http to the port gets no mirror answer."""
    from helpers import ca_and_leaf
    from hfstub.nginxlab import Nginx, free_port

    folder, commit = fetched
    port = free_port()
    tls_dir = tmp_path / "tls"
    extra = (f"        hf_site_mirror_tls: true\n        hf_site_mirror_tls_dir: \"{tls_dir}\"\n"
             f"        hf_site_mirror_tls_ca_dir: \"{tmp_path / 'fleet-ca'}\"\n")
    _playbook(tmp_path, folder, port, extra)
    assert oct(tls_dir.stat().st_mode & 0o777) == "0o700"
    assert oct((tls_dir / "key.pem").stat().st_mode & 0o777) == "0o600"
    assert "changed=0" in _playbook(tmp_path, folder, port, extra)  # idempotent
    ca = str(tmp_path / "fleet-ca" / "ca.crt")
    ca_and_leaf(tmp_path, "rogue")
    url = f"https://127.0.0.1:{port}"
    with Nginx(tmp_path / "nginx", tmp_path / "conf.d"):
        deadline = __import__("time").monotonic() + 20
        while True:
            try:
                requests.get(url, timeout=1, verify=ca)
                break
            except requests.ConnectionError:
                assert __import__("time").monotonic() < deadline, "nginx did not answer over TLS"
                __import__("time").sleep(0.1)
        plain = requests.get(f"http://127.0.0.1:{port}/api/models/lab/tiny", timeout=10)
        assert plain.status_code == 400 and "X-Repo-Commit" not in plain.headers
        dest = tmp_path / "via-tls"
        res, failed = run_module(hf_model.main, {"repo_id": "lab/tiny", "dest": str(dest),
                                                 "endpoint": url, "ca_file": ca}, monkeypatch)
        assert not failed and res["commit"] == commit, res
        for rel, data in FILES.items():
            assert (dest / rel).read_bytes() == data
        # controls: another CA, and the system's trust store, refuse the mirror
        for args in ({"ca_file": str(tmp_path / "rogue-ca.crt")}, {}):
            other = tmp_path / f"via-other-{len(args)}"
            res, failed = run_module(hf_model.main, {"repo_id": "lab/tiny", "dest": str(other),
                                                     "endpoint": url, "retries": 0, **args}, monkeypatch)
            assert failed and "failed: SSLError" in res["msg"], res["msg"]
            assert not any(other.rglob("*.safetensors"))
        res, failed = run_module(hf_model.main, {"repo_id": "lab/tiny", "dest": str(tmp_path / "x"),
                                                 "endpoint": url, "ca_file": str(tmp_path / "none.crt")},
                                 monkeypatch)
        assert failed and "is not a readable file" in res["msg"] and "Nothing was fetched" in res["msg"]


LAB_TINY = ROOT / ".cache/lab/models/gpufleet/tiny-llama"  # built by lab/models/build.sh
VLLM_IMAGE = os.environ.get("VLLM_IMAGE", "gpufleet/vllm-cpu:lab")  # lab/vllm/build.sh


def _docker_image_exists(ref):
    try:
        return subprocess.run(["docker", "image", "inspect", ref], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
def test_vllm_serve_loads_a_model_through_the_site_mirror(tmp_path, monkeypatch):
    """`vllm serve ORG/NAME` with HF_ENDPOINT set to the site mirror
    loads the model (no folder mounted: the mirror is its only source) and answers."""
    import time

    from hfstub.nginxlab import Nginx, free_port

    if not (LAB_TINY / "config.json").exists() or not _docker_image_exists(VLLM_IMAGE):
        pytest.skip("needs the lab's tiny model (lab/models/build.sh) and the vLLM CPU "
                    f"image {VLLM_IMAGE} (lab/vllm/build.sh)")
    files = {p.name: p.read_bytes() for p in LAB_TINY.iterdir() if p.is_file()}
    folder = tmp_path / "models" / "tiny-llama"
    with HubStub([Repo("gpufleet/tiny-llama", files)]) as s:
        run_module(hf_model.main, {"repo_id": "gpufleet/tiny-llama", "dest": str(folder),
                                   "endpoint": s.url}, monkeypatch)
    port, api_port = free_port(), free_port()
    _playbook(tmp_path, folder, port)
    url = f"http://127.0.0.1:{port}"
    name = f"hub-vllm-mirror-{os.getpid()}"
    with Nginx(tmp_path / "nginx", tmp_path / "conf.d") as n:
        n.wait(url)
        subprocess.run(
            ["docker", "run", "-d", "--name", name, "--network", "host", "--shm-size", "1g",
             "-e", f"HF_ENDPOINT={url}", "-e", "HF_HUB_DISABLE_XET=1", VLLM_IMAGE,
             "--model", "gpufleet/tiny-llama", "--served-model-name", "tiny",
             "--host", "127.0.0.1", "--port", str(api_port), "--max-model-len", "256",
             "--enforce-eager", "--dtype", "bfloat16", "--kv-cache-memory-bytes", "16777216"],
            check=True, capture_output=True, timeout=120)
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                try:
                    if requests.get(f"http://127.0.0.1:{api_port}/health", timeout=2).ok:
                        break
                except requests.ConnectionError:
                    pass
                state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name],
                                       capture_output=True, text=True).stdout.strip()
                assert state == "true", subprocess.run(
                    ["docker", "logs", "--tail", "60", name], capture_output=True,
                    text=True).stderr[-4000:]
                time.sleep(2)
            else:
                pytest.fail("vLLM was not healthy within 300 s")
            r = requests.post(f"http://127.0.0.1:{api_port}/v1/completions", timeout=120,
                              json={"model": "tiny", "prompt": "The capital of France is",
                                    "max_tokens": 4, "temperature": 0})
            logs = subprocess.run(["docker", "logs", "--tail", "40", name], capture_output=True,
                                  text=True).stderr
            assert r.status_code == 200, r.text + logs[-3000:]
            assert r.json()["usage"]["completion_tokens"] == 4
            # the weights vLLM loaded are the mirror's, byte for byte
            cached = subprocess.run(
                ["docker", "exec", name, "sh", "-c",
                 "sha256sum /root/.cache/huggingface/hub/models--gpufleet--tiny-llama/"
                 "snapshots/*/model.safetensors"], capture_output=True, text=True, timeout=60)
            assert cached.stdout.split()[0] == hashlib.sha256(files["model.safetensors"]).hexdigest()
        finally:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


# --- the site mirror verifies each folder against its model lock (#32 item 8) ------------
def _lock_of(folder, commit, files=FILES, **swap):
    """A lock as the control node writes it from a trusted source holding `files`, with
    the sha256 of some paths replaced by that of other bytes (`swap`: path -> bytes)."""
    pins = {p: hashlib.sha256(swap.get(p.replace("/", "__"), b)).hexdigest()
            for p, b in files.items()}
    return {"repo_id": "lab/tiny", "commit": commit, "files": pins}


def test_the_mirror_publishes_a_folder_that_holds_its_locks_bytes(fetched, tmp_path):
    folder, commit = fetched
    res = hub_mirror.build_site(tmp_path / "site", [{"path": str(folder),
                                                     "lock": _lock_of(folder, commit)}])
    assert res["changed"] and res["repos"][0]["locked"] is True
    assert res["repos"][0]["lock_missing"] == []
    # a lock pinning a file the folder lacks (fetched with allow patterns): served, and said
    lock = _lock_of(folder, commit, dict(FILES, **{"extra.bin": b"x"}))
    res = hub_mirror.build_site(tmp_path / "site", [{"path": str(folder), "lock": lock}])
    assert res["repos"][0]["lock_missing"] == ["extra.bin"]


def test_a_hostile_mirrors_bytes_are_published_without_the_lock_and_refused_with_it(fetched, tmp_path):
    """The folder holds what a mirror served with a matching listing (hf_model verified it
    against that listing); the trusted source the lock was written from holds other bytes
    for the weights (an LFS file, compared as recorded) and for config.json (a git-blob
    file, hashed now). Control: without the lock the mirror publishes them."""
    folder, commit = fetched
    plain = hub_mirror.build_site(tmp_path / "plain", [{"path": str(folder)}])
    assert plain["changed"] and plain["repos"][0]["locked"] is False  # the control
    lock = _lock_of(folder, commit, **{"model.safetensors": b"the real weights",
                                       "config.json": b'{"architectures": ["Other"]}'})
    with pytest.raises(hub.HubError) as err:
        hub_mirror.build_site(tmp_path / "site", [{"path": str(folder), "lock": lock}])
    msg = str(err.value)
    assert "the folder differs from the lock" in msg and "Nothing was published" in msg
    for path, was in (("model.safetensors", "is recorded as"), ("config.json", "hashes to")):
        assert (f"{path}: the lock pins sha256 {lock['files'][path]}, the folder's file {was} "
                f"sha256 {hashlib.sha256(FILES[path]).hexdigest()}") in msg, msg
    assert "tokenizer/tokenizer.json" not in msg
    assert not (tmp_path / "site").exists()  # nothing written


def test_the_mirror_refuses_another_commit_a_file_the_lock_lacks_and_a_bad_lock(fetched, tmp_path):
    folder, commit = fetched
    other = "f" * 40
    with pytest.raises(hub.HubError, match=f"holds commit {commit}, the lock pins commit {other}"):
        hub_mirror.build_site(tmp_path / "s", [{"path": str(folder),
                                                "lock": dict(_lock_of(folder, commit), commit=other)}])
    lock = _lock_of(folder, commit, {p: b for p, b in FILES.items() if p != "config.json"})
    with pytest.raises(hub.HubError, match="config.json: in the folder but not in the lock"):
        hub_mirror.build_site(tmp_path / "s", [{"path": str(folder), "lock": lock}])
    with pytest.raises(hub.HubError, match="the lock given for .* lacks commit"):
        hub_mirror.build_site(tmp_path / "s", [{"path": str(folder),
                                                "lock": {"repo_id": "lab/tiny", "files": {}}}])
    assert not (tmp_path / "s").exists()


def test_the_module_fails_on_a_folder_that_differs_from_its_lock_in_check_mode_too(fetched, tmp_path, monkeypatch):
    folder, commit = fetched
    lock = _lock_of(folder, commit, **{"model.safetensors": b"other"})
    for check in (True, False):
        res, failed = run_module(hf_mirror_index.main, {
            "root": str(tmp_path / "site"), "models": [{"path": str(folder), "lock": lock}]},
            monkeypatch, check_mode=check)
        assert failed and "model.safetensors: the lock pins sha256" in res["msg"], res
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize("extra, expect", [
    ({"hf_site_mirror_models": [{"path": "/srv/m", "repo_id": "lab/tiny"}],
      "hf_site_mirror_locks": {"lab/tiny": {"repo_id": "lab/tiny", "commit": "a" * 40,
                                            "file": {}}}},
     "hf_site_mirror_locks['lab/tiny'] has unknown keys file"),
    ({"hf_site_mirror_models": [{"path": "/srv/m", "repo_id": "lab/tiny"}],
      "hf_site_mirror_require_lock": True},
     "lab/tiny: no lock (hf_site_mirror_require_lock is set)"),
    ({"hf_site_mirror_models": [{"path": "/srv/m"}], "hf_site_mirror_require_lock": True},
     "hf_site_mirror_require_lock: give repo_id (or lock) for /srv/m"),
])
def test_the_roles_preflight_refuses_a_lock_it_cannot_use_before_any_change(tmp_path, extra, expect):
    from helpers import run_role_preflight

    rc, failures, changed = run_role_preflight(tmp_path, "hf_site_mirror", extra)
    assert rc != 0 and changed == [] and any(expect in f for f in failures), failures
    assert any("Nothing was changed" in f for f in failures), failures
