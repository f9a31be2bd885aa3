"""Peer-to-peer fan-out (gpufleet.p2p, libtorrent) on loopback: one swarm, several checks.

Real software throughout: the site mirror is nginx (hf_site_mirror's template, sendfile,
Range) serving a model folder fetched and verified by hf_model from the stand-in hub
(tests/hfstub/server.py); every host is its own process running gpufleet.p2p.run_peer
with Debian's python3-libtorrent (/usr/bin/python3, as on the GPU hosts), bound to its own
127.0.0.x address. The hostile peer is tests/hfstub/badpeer.py (plain wire protocol,
random bytes for every block).

The swarm, in order:
1. origin  127.0.0.2: web seed (nginx) only; then seeds.
2. hosts   127.0.0.3, 127.0.0.4: the web-seed policy's others (peers first, the web seed
   only after 30 s without a peer's block), at the same time: all from the origin.
   alone 127.0.0.11 (same policy, 1 s) whose only peer is down: adds the web seed.
3. outsider 127.0.0.9 (not in the allow-list) knocks on the origin: refused.
4. seeder  127.0.0.8 seeds a folder hf_model verified over http (the mirror's own);
   fresh   127.0.0.10 knows only that one and completes from it.
5. locked  127.0.0.7: its lock pins another sha256 for the weights: refused, not placed.
6. nginx stopped; late   127.0.0.5 joins with the hostile peer 127.0.0.6 (in the
   allow-list: a compromised fleet host) listed first: bans and names it, completes
   from the good peers.
The mirror's egress is the body bytes in nginx's access log.
"""
import json
import os
import pathlib
import shutil
import socket
import subprocess
import time

import pytest

from gpufleet import hub, hub_client, hub_mirror
from hfstub.badpeer import PSTR, BadPeer  # noqa: E402
from hfstub.nginxlab import Nginx, free_port, render_site_conf  # noqa: E402
from hfstub.server import HubStub, Repo  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEER = ROOT / "tests/hfstub/p2ppeer.py"
# the peer script imports gpufleet (plain Python, system python3 with libtorrent)
PEER_ENV = dict(os.environ, PYTHONPATH=str(ROOT / "plugins/module_utils"))
SYS_PYTHON = "/usr/bin/python3"
MODEL_BYTES = 4 << 20
REPO = "lab/tiny-p2p"
ORIGIN, HOST_B, HOST_C, LATE, HOSTILE, LOCKED, SEEDER, OUTSIDER, FRESH, ALONE, DOWN = (
    "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8",
    "127.0.0.9", "127.0.0.10", "127.0.0.11", "127.0.0.12")
FALLBACK = 30  # the web-seed policy's wait of a host that starts with peers only
ALONE_FALLBACK = 1  # alone's: its only peer is down
MIRROR = "127.0.0.1"
TIMEOUT = 60  # seconds a session may run at most (a hang fails the test, it is no timing)


def _have_libtorrent():
    return subprocess.run([SYS_PYTHON, "-c", "import libtorrent"],
                          capture_output=True).returncode == 0


def _files():
    fx = ROOT / "tests/fixtures/models/opt-125m/config.json"  # a real model's config
    return {"config.json": fx.read_bytes(),
            "tokenizer/vocab.json": json.dumps({f"t{i}": i for i in range(4000)}).encode(),
            "generation_config.json": b'{"do_sample": false}',
            "README.md": b"",  # empty: not in the torrent, written and hashed by the host
            "model.safetensors": os.urandom(MODEL_BYTES)}


def _wait_for(path, needle, proc, what):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited ({proc.returncode}) before '{needle}':\n"
                                 + path.read_text()[-3000:])
        time.sleep(0.1)
    raise AssertionError(f"{what}: no '{needle}' within {TIMEOUT} s:\n"
                         + path.read_text()[-3000:])


class Swarm:
    def __init__(self, tmp, torrent, listing, commit, infohash, allow, web_seed):
        self.tmp, self.torrent, self.listing = tmp, torrent, listing
        self.commit, self.infohash, self.allow, self.web_seed = commit, infohash, allow, web_seed
        self.stop_file = tmp / "stop-seeding"
        self.procs, self.ports = {}, {}

    def port(self, addr):
        return self.ports.setdefault(addr, free_port())

    def start(self, name, addr, peers=(), web_seed=False, listing=None, dest=None,
              web_seed_delay=0):
        job = {"torrent": str(self.torrent), "dest": str(dest or self.tmp / "hosts" / name),
               "listing": listing or self.listing, "commit": self.commit, "infohash": self.infohash,
               "repo_id": REPO, "listen": addr, "port": self.port(addr),
               "peers": [f"{p}:{self.port(p)}" for p in peers], "allow": self.allow,
               "web_seed": self.web_seed if web_seed else None,
               "web_seed_delay": web_seed_delay,
               "stop_file": str(self.stop_file), "timeout": TIMEOUT,
               "seed_only": dest is not None}
        (self.tmp / f"{name}.job.json").write_text(json.dumps(job))
        log = self.tmp / f"{name}.log"
        proc = subprocess.Popen(
            [SYS_PYTHON, str(PEER), "peer", str(self.tmp / f"{name}.job.json"),
             str(self.tmp / f"{name}.result.json")],
            stdout=log.open("w"), stderr=subprocess.STDOUT, env=PEER_ENV)
        self.procs[name] = (proc, log)
        return proc

    def wait_complete(self, name):
        proc, log = self.procs[name]
        _wait_for(log, '"event": "complete"', proc, name)

    def kill(self):
        """After a failure: no host outlives the test."""
        for proc, _ in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def finish(self):
        self.stop_file.touch()
        results = {}
        for name, (proc, log) in self.procs.items():
            try:
                proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            assert proc.returncode == 0, f"{name}:\n{log.read_text()[-3000:]}"
            results[name] = json.loads((self.tmp / f"{name}.result.json").read_text())
        return results


def _knock(addr, port, infohash, source):
    """A BitTorrent handshake from `source`: what came back before the peer hung up."""
    with socket.create_connection((addr, port), timeout=5, source_address=(source, 0)) as s:
        try:
            s.sendall(bytes([19]) + PSTR + bytes(8) + bytes.fromhex(infohash)
                      + b"-XX0001-" + os.urandom(12))
            got = b""
            while chunk := s.recv(4096):
                got += chunk
        except (ConnectionResetError, BrokenPipeError, socket.timeout):
            pass
        return got


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    if not (_have_libtorrent() and shutil.which("nginx")):
        pytest.skip("needs nginx and /usr/bin/python3 with python3-libtorrent "
                    "(scripts/setup.sh installs both)")
    tmp = tmp_path_factory.mktemp("p2p")
    started = time.monotonic()
    mirror_folder = tmp / "mirror" / "tiny-p2p"
    with HubStub([Repo(REPO, _files())]) as s:
        hub.sync_repo(hub_client.HubClient(s.url), REPO, "main", str(mirror_folder))
    model = hub_mirror.read_model_folder(str(mirror_folder))
    site = tmp / "site"
    hub_mirror.build_site(str(site), [{"path": str(mirror_folder)}])
    port = free_port()
    conf = render_site_conf(site, f"{MIRROR}:{port}", tmp / "conf.d")
    torrent = tmp / "model.torrent"
    made = subprocess.run([SYS_PYTHON, str(PEER), "make", str(mirror_folder), str(torrent)],
                          capture_output=True, text=True, check=True, env=PEER_ENV)
    facts = json.loads(made.stdout)
    listing = [{"path": f.path, "size": f.size, "algorithm": f.algorithm,
                "digest": f.digest} for f in model["files"]]
    allow = [MIRROR, ORIGIN, HOST_B, HOST_C, LATE, HOSTILE, LOCKED, SEEDER, FRESH, ALONE, DOWN]
    sw = Swarm(tmp, torrent, listing, model["commit"], facts["infohash"], allow,
               f"http://{MIRROR}:{port}/{REPO}/resolve/")
    out = {"model": model, "facts": facts, "egress": {}, "tmp": tmp}
    with Nginx(tmp / "nginx", conf, access_log=tmp / "nginx-access.log") as n:
        try:
            n.wait(f"http://{MIRROR}:{port}/")
            sw.start("origin", ORIGIN, web_seed=True)
            sw.wait_complete("origin")
            out["egress"]["origin"] = n.egress()
            for name, addr in (("host_b", HOST_B), ("host_c", HOST_C)):
                sw.start(name, addr, peers=[ORIGIN, HOST_B, HOST_C], web_seed=True,
                         web_seed_delay=FALLBACK)
            sw.wait_complete("host_b")
            sw.wait_complete("host_c")
            out["egress"]["hosts"] = n.egress()
            sw.start("alone", ALONE, peers=[DOWN], web_seed=True, web_seed_delay=ALONE_FALLBACK)
            sw.wait_complete("alone")
            out["egress"]["alone"] = n.egress()
            out["outsider_got"] = _knock(ORIGIN, sw.port(ORIGIN), facts["infohash"], OUTSIDER)
            out["insider_got"] = _knock(ORIGIN, sw.port(ORIGIN), facts["infohash"], LATE)[:68]
            # a host whose lock pins other bytes for the weights than the mirror's
            locked = [dict(e, pinned="0" * 64) if e["path"] == "model.safetensors" else e
                      for e in listing]
            sw.start("locked", LOCKED, peers=[ORIGIN, HOST_B, HOST_C], listing=locked)
            n.stop()
            with BadPeer(HOSTILE, sw.port(HOSTILE), facts["num_pieces"]) as bad:
                sw.start("late", LATE, peers=[HOSTILE, ORIGIN, HOST_B, HOST_C], web_seed=True)
                sw.wait_complete("late")
                out["hostile_blocks_sent"] = bad.blocks_sent
            out["egress"]["late"] = n.egress()
            # a host that verified the model over http seeds it as it is; a fresh host
            # that knows only that one completes from it
            sw.start("seeder", SEEDER, dest=mirror_folder)
            sw.start("fresh", FRESH, peers=[SEEDER])
            sw.wait_complete("fresh")
            out["results"] = sw.finish()
        finally:
            sw.kill()
    out["seconds"] = time.monotonic() - started
    print(f"p2p swarm on loopback: {out['seconds']:.1f} s, egress {out['egress']}, "
          f"hostile blocks {out['hostile_blocks_sent']}")
    return out


def _check_folder(folder, model):
    """hf_model's rule on every file, recomputed here (not by the engine), and a manifest
    the site mirror accepts (complete, sizes and mtimes as verified)."""
    for f in model["files"]:
        h = f.hasher()
        h.update((folder / f.path).read_bytes())
        assert h.hexdigest() == f.digest, f.path
    again = hub_mirror.read_model_folder(str(folder), REPO)
    assert again["commit"] == model["commit"]
    assert {f.path for f in again["files"]} == {f.path for f in model["files"]}


def test_every_host_has_the_verified_model(swarm):
    for name in ("origin", "host_b", "host_c", "late", "alone"):
        r = swarm["results"][name]
        assert r["complete"], (name, r)
        assert r["files_rejected"] == []
        assert r["infohash"] == swarm["facts"]["infohash"]
        _check_folder(swarm["tmp"] / "hosts" / name, swarm["model"])


def test_mirror_sends_the_model_once(swarm):
    size = sum(f.size for f in swarm["model"]["files"])
    egress = swarm["egress"]
    assert size <= egress["origin"] <= 1.5 * size, egress
    # the two hosts and the late joiner took nothing from the mirror: their bytes are peers'
    # (beside the one byte each of the two hosts' probes of the web seed, Range 0-0)
    assert egress["hosts"] - egress["origin"] == 2 and egress["late"] == egress["alone"], egress
    for name in ("host_b", "host_c", "late"):
        r = swarm["results"][name]
        assert r["bytes_by_source"]["web_seed"] == 0, (name, r["bytes_by_source"])
        assert r["bytes_by_source"]["peers"] >= size - 4096, (name, r["bytes_by_source"])


def test_hostile_peer_is_banned_and_named(swarm):
    late = swarm["results"]["late"]
    assert swarm["hostile_blocks_sent"] > 0  # it did get to send bad bytes
    assert late["banned_peers"] == [HOSTILE], late["banned_peers"]
    assert late["hash_failures"] > 0
    for name in ("origin", "host_b", "host_c"):
        assert HOSTILE not in swarm["results"][name]["banned_peers"]


def test_peer_outside_the_allow_list_is_refused(swarm):
    assert swarm["outsider_got"] == b""  # no handshake: the connection was closed
    assert OUTSIDER in swarm["results"]["origin"]["blocked_peers"]
    # the control: an allowed address gets the origin's handshake back
    assert swarm["insider_got"][1:20] == PSTR


def test_late_joiner_completes_with_the_web_seed_down(swarm):
    late = swarm["results"]["late"]
    assert late["complete"]
    assert late["bytes_by_source"]["web_seed"] == 0
    assert swarm["egress"]["late"] == swarm["egress"]["alone"]
    assert [e["event"] for e in late["events"]][0] == "web_seed_down"
    print(f"late joiner {LATE}: complete={late['complete']}, bytes by source "
          f"{late['bytes_by_source']}, banned {late['banned_peers']}, mirror down")


def test_web_seed_policy_others_take_nothing_from_the_mirror_while_peers_deliver(swarm):
    for name in ("host_b", "host_c"):
        r = swarm["results"][name]
        assert r["web_seed_after"] is None, (name, r["events"][:5])
        assert r["bytes_by_source"]["web_seed"] == 0
    assert swarm["results"]["origin"]["web_seed_after"] == 0.0  # the first: from the start


def test_web_seed_policy_falls_back_when_no_peer_delivers(swarm):
    size = sum(f.size for f in swarm["model"]["files"])
    r = swarm["results"]["alone"]
    assert r["complete"] and r["web_seed_after"] >= ALONE_FALLBACK, r["events"][:5]
    assert r["bytes_by_source"]["web_seed"] >= size - 4096, r["bytes_by_source"]
    assert size <= swarm["egress"]["alone"] - swarm["egress"]["hosts"] <= 1.5 * size


def test_bytes_the_lock_refuses_never_get_their_final_name(swarm):
    r = swarm["results"]["locked"]
    dest = swarm["tmp"] / "hosts" / "locked"
    assert r["complete"] is False
    assert r["files_rejected"] == ["model.safetensors"]
    assert "the lock pins" in [e for e in r["events"] if e["event"] == "rejected"][0]["why"]
    assert not (dest / "model.safetensors").exists()
    assert (dest / "config.json").exists()  # the files that verified are in place
    assert not (dest / ".gpufleet/manifest.json").exists()


def test_a_folder_verified_over_http_seeds_as_it_is(swarm):
    fresh = swarm["results"]["fresh"]
    assert fresh["complete"]
    assert set(fresh["bytes_by_peer"]) == {SEEDER}, fresh["bytes_by_peer"]
    _check_folder(swarm["tmp"] / "hosts" / "fresh", swarm["model"])
    assert swarm["results"]["seeder"]["payload_uploaded"] >= 4 << 20
