"""model_fetch over p2p (issue #35 item 4), the role through ansible-playbook on loopback.

Real software throughout, as tests/slow/test_p2p_loopback.py (the engine's test) but
driven by the role: the site mirror is nginx serving a folder hf_model verified from the
stand-in hub, its torrent made by hf_mirror_index (torrents: ...) on the "mirror" host;
the GPU hosts are inventory hosts with ansible_host 127.0.0.x and connection local, each
with its own model_fetch_root, modules run by /usr/bin/python3 with Debian's libtorrent
(as on the hosts). The hostile peer (tests/hfstub/badpeer.py) is a GPU host of the
inventory that answers every block with random bytes.

Four playbook runs, in order:
1. the mirror makes the torrent; h1 and h2 fetch over p2p (web seed and each other) and
   stay seeding (until_rollout_end);
2. check mode for the late host: what it would fetch, from where; nothing written;
3. the late host, without the web seed (nginx serves only the listing), with the hostile
   peer among its peers: bans and names it, completes from h1 and h2;
4. h1 again (nothing changes: idempotent, its seeder left as is), then the p2p_stop entry
   point on every host: each seeder ends.
Every host's folder is re-hashed by the test with hf_model's rule.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import time

import pytest

from gpufleet import hub, hub_client, hub_mirror, p2p, p2p_seeder, p2p_torrent
from helpers import run_playbook
from hfstub.badpeer import BadPeer
from hfstub.nginxlab import Nginx, free_port, render_site_conf
from hfstub.p2pplays import p2p_plays
from hfstub.server import HubStub, Repo

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYS_PYTHON = "/usr/bin/python3"
REPO = "lab/tiny-p2p"
MIRROR = "127.0.0.1"
HOSTS = {"h1": "127.0.0.3", "h2": "127.0.0.4", "late": "127.0.0.5", "hostile": "127.0.0.6"}


def _have_libtorrent():
    return subprocess.run([SYS_PYTHON, "-c", "import libtorrent, requests"],
                          capture_output=True).returncode == 0


def _files():
    fx = ROOT / "tests/fixtures/models/opt-125m/config.json"
    return {"config.json": fx.read_bytes(),
            "tokenizer/vocab.json": json.dumps({f"t{i}": i for i in range(4000)}).encode(),
            "README.md": b"",
            "model.safetensors": os.urandom(3 << 20)}


def _inventory(tmp):
    hosts = {name: {"ansible_host": addr, "model_fetch_root": str(tmp / "hosts" / name)}
             for name, addr in HOSTS.items()}
    inv = {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": SYS_PYTHON},
        "hosts": {"mirror": {}},
        "children": {"gpu_hosts": {"hosts": hosts}}}}
    path = tmp / "inventory.json"
    path.write_text(json.dumps(inv))
    return path


PLAYS = p2p_plays(stop_hosts="gpu_hosts")


def _check_folder(link, model):
    """hf_model's rule on every file, recomputed here, and a manifest the site mirror
    accepts."""
    for f in model["files"]:
        h = f.hasher()
        h.update((link / f.path).read_bytes())
        assert h.hexdigest() == f.digest, (link, f.path)
    again = hub_mirror.read_model_folder(str(link.resolve()), REPO)
    assert again["commit"] == model["commit"]


def _resolve_requests(log):
    return sum(1 for line in log.read_text().splitlines() if "/resolve/" in line)


def _status(output, host, task):
    """A task's result for a host from the json callback's report."""
    start = re.search(r"^\{", output, re.M)
    report, _ = json.JSONDecoder().raw_decode(output[start.start():])
    return [t["hosts"][host] for p in report["plays"] for t in p["tasks"]
            if task in t["task"]["name"] and host in t["hosts"]]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    if not (_have_libtorrent() and shutil.which("nginx")):
        pytest.skip("needs nginx and /usr/bin/python3 with python3-libtorrent and "
                    "python3-requests (scripts/setup.sh installs them)")
    tmp = tmp_path_factory.mktemp("p2p-role")
    started = time.monotonic()
    folder = tmp / "mirror" / "tiny-p2p"
    with HubStub([Repo(REPO, _files())]) as s:
        hub.sync_repo(hub_client.HubClient(s.url), REPO, "main", str(folder))
    model = hub_mirror.read_model_folder(str(folder))
    for name, text in PLAYS.items():
        (tmp / name).write_text(text)
    inventory = _inventory(tmp)
    port = free_port()
    swarm_port = free_port()
    endpoint = f"http://{MIRROR}:{port}"
    base = {"site": str(tmp / "site"), "folder": str(folder), "torrents": str(tmp / "torrents"),
            "model_fetch_models": [{"repo_id": REPO, "transport": "p2p"}],
            "model_fetch_endpoint": endpoint, "model_fetch_p2p_mirror_host": "mirror",
            "model_fetch_p2p_torrent_dir": str(tmp / "torrents"),
            "model_fetch_p2p_port": swarm_port, "model_fetch_p2p_timeout": 120,
            "model_fetch_create_group": False, "model_fetch_group": "root",
            "_model_fetch_poll_delay": 1, "model_fetch_progress_interval": 1}
    out = {"model": model, "tmp": tmp, "runs": {}}

    def play(key, name, check=False, **extra):
        t = time.monotonic()
        rc, changed, failures, changed_tasks, output = run_playbook(
            inventory, tmp / name, extra.pop("_host", "h1"), {**base, **extra}, check=check,
            timeout=300, with_output=True)
        out["runs"][key] = {"rc": rc, "changed": changed, "failures": failures,
                            "changed_tasks": changed_tasks, "output": output,
                            "seconds": round(time.monotonic() - t, 1)}
        (tmp / f"{key}.out").write_text(output)
        assert rc == 0, (key, failures, output[-3000:])
        return out["runs"][key]

    play("mirror", "mirror.yml", _host="mirror")
    facts = json.loads(subprocess.run(
        [SYS_PYTHON, str(ROOT / "tests/hfstub/p2ppeer.py"), "facts",
         str(tmp / "torrents" / "lab--tiny-p2p.torrent")], capture_output=True, text=True,
        check=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "plugins/module_utils"))).stdout)
    (tmp / "site").mkdir(exist_ok=True)
    conf = render_site_conf(tmp / "site", f"{MIRROR}:{port}", tmp / "conf.d")
    access = tmp / "nginx-access.log"
    with Nginx(tmp / "nginx", conf, access_log=access) as n:
        n.wait(f"{endpoint}/")
        try:
            play("fetch", "fetch.yml", fetchers="h1:h2")
            out["seeders_after_fetch"] = {
                h: p2p_seeder.seeder_state(str(tmp / "hosts" / h / "lab/.gpufleet-revisions/tiny-p2p"))
                for h in ("h1", "h2")}
            out["resolve_before_late"] = _resolve_requests(access)
            play("check", "fetch.yml", check=True, fetchers="late", _host="late")
            out["late_after_check"] = sorted(p.name for p in (tmp / "hosts" / "late").glob("**/*")
                                             if p.is_file())
            with BadPeer(HOSTS["hostile"], swarm_port, facts["num_pieces"]) as bad:
                play("late", "fetch.yml", fetchers="late", _host="late",
                     model_fetch_p2p_web_seed=False)
                out["hostile_blocks_sent"] = bad.blocks_sent
            out["resolve_after_late"] = _resolve_requests(access)
            play("again", "fetch.yml", fetchers="h1")
            play("stop", "stop.yml", _host="h1")
            play("stop_again", "stop.yml", _host="h1")
        finally:
            for h in HOSTS:  # no seeder outlives the test, whatever failed
                store = tmp / "hosts" / h / "lab/.gpufleet-revisions/tiny-p2p"
                state = p2p_seeder.seeder_state(str(store))
                if state and state["running"]:
                    os.kill(state["pid"], 9)
    out["seconds"] = round(time.monotonic() - started, 1)
    print(f"model_fetch over p2p, 4 hosts on loopback: {out['seconds']} s "
          + ", ".join(f"{k} {v['seconds']} s" for k, v in out["runs"].items()))
    return out


def test_every_host_has_the_verified_model(fleet):
    for h in ("h1", "h2", "late"):
        _check_folder(fleet["tmp"] / "hosts" / h / "lab/tiny-p2p", fleet["model"])


def test_mirror_made_the_torrent_of_its_verified_folder(fleet):
    facts = json.loads((fleet["tmp"] / "torrents" / "lab--tiny-p2p.json").read_text())
    data = (fleet["tmp"] / "torrents" / "lab--tiny-p2p.torrent").read_bytes()
    assert facts["commit"] == fleet["model"]["commit"]
    assert p2p_torrent.infohashes(data)[0] == facts["infohash"]


def test_hosts_report_bytes_by_source_and_keep_seeding(fleet):
    run = fleet["runs"]["fetch"]
    for h in ("h1", "h2"):
        [res] = _status(run["output"], h, "Model_fetch | Follow the fetch")
        got = res["p2p"]
        assert got["bytes_from_peers"] + got["bytes_from_web_seed"] >= 3 << 20, got
        assert got["seeding"]["policy"] == "until_rollout_end"
        assert fleet["seeders_after_fetch"][h]["running"], h
    assert "from peers" in run["output"] and "from the web seed" in run["output"]


def test_web_seed_policy_only_the_first_host_asks_the_mirror(fleet):
    run = fleet["runs"]["fetch"]
    h1, h2 = (_status(run["output"], h, "Model_fetch | Follow the fetch")[0]["p2p"]
              for h in ("h1", "h2"))
    assert h1["web_seed_delay"] == 0 and h1["bytes_from_web_seed"] > 0, h1
    # h2 (second in gpu_hosts) starts with peers only; h1 delivers, so it never falls back
    assert h2["web_seed_delay"] == 30 and h2["web_seed_after"] is None, h2
    assert h2["bytes_from_web_seed"] == 0 and h2["bytes_from_peers"] >= 3 << 20, h2
    [line] = _status(run["output"], "h1", "Report which hosts used the web seed")
    print(line["msg"])
    assert line["msg"].startswith(f"{REPO}: web seed used by h1 ({h1['bytes_from_web_seed']} bytes);")


def test_check_mode_says_what_and_from_where_and_writes_nothing(fleet):
    run = fleet["runs"]["check"]
    [res] = _status(run["output"], "late", "Model_fetch | Report what would be fetched")
    assert res["p2p"]["would_fetch_bytes"] >= 3 << 20
    assert sorted(res["p2p"]["from_peers"]) == sorted(
        f"{a}:{res['p2p']['listen'].rsplit(':', 1)[1]}" for h, a in HOSTS.items() if h != "late")
    assert res["p2p"]["web_seed"].endswith("/lab/tiny-p2p/resolve/")
    assert "would fetch" in run["output"]
    assert fleet["late_after_check"] == []


def test_late_host_completes_from_peers_and_names_the_hostile_one(fleet):
    run = fleet["runs"]["late"]
    [res] = _status(run["output"], "late", "Model_fetch | Follow the fetch")
    assert fleet["hostile_blocks_sent"] > 0
    assert res["p2p"]["banned_peers"] == [HOSTS["hostile"]], res["p2p"]
    assert res["p2p"]["bytes_from_web_seed"] == 0
    assert res["p2p"]["bytes_from_peers"] >= 3 << 20
    # the mirror sent no file byte to the late host: only its listing
    assert fleet["resolve_after_late"] == fleet["resolve_before_late"]
    [report] = _status(run["output"], "late", "Model_fetch | Report the result")
    assert f"banned peers (sent bad pieces, dropped): {HOSTS['hostile']}" in report["msg"]
    print(report["msg"])


def test_a_verified_host_changes_nothing(fleet):
    run = fleet["runs"]["again"]
    assert run["changed"] == 0, run["changed_tasks"]
    [res] = _status(run["output"], "h1", "Model_fetch | Follow the fetch")
    assert res["p2p"]["swarm"] is False
    assert res["p2p"]["seeding"]["pid"] == fleet["seeders_after_fetch"]["h1"]["pid"]


def test_p2p_stop_ends_every_seeder(fleet):
    assert fleet["runs"]["stop"]["changed"] == 1  # h1's seeder
    assert fleet["runs"]["stop_again"]["changed"] == 0
    for h in ("h1", "h2", "late"):
        store = fleet["tmp"] / "hosts" / h / "lab/.gpufleet-revisions/tiny-p2p"
        assert p2p_seeder.seeder_state(str(store)) is None, h
    # the stopped seeder's partial area (p2p.cleanup) is gone; the model stays
    h1 = fleet["tmp"] / "hosts" / "h1" / "lab/tiny-p2p"
    assert not (h1 / ".gpufleet" / p2p.P2P_DIR).exists()
    _check_folder(h1, fleet["model"])
    pid = fleet["seeders_after_fetch"]["h1"]["pid"]
    assert not pathlib.Path(f"/proc/{pid}").exists() or \
        p2p_seeder._proc_start(pid) != fleet["seeders_after_fetch"]["h1"]["start"]
