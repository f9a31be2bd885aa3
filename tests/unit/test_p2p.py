"""gpufleet.p2p: the decisions of peer-to-peer fan-out (pure Python), and torrent making
with Debian's python3-libtorrent (/usr/bin/python3; skipped where it is not installed).
The swarm itself runs in tests/slow/test_p2p_loopback.py."""
import hashlib
import json
import os
import pathlib
import subprocess

import pytest

from gpufleet import hub, hub_client, hub_listing, hub_mirror, p2p, p2p_swarm, p2p_torrent
from hfstub.server import HubStub, Repo, git_blob_sha1  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
# the peer script imports gpufleet (plain Python, system python3 with libtorrent)
PEER_ENV = dict(os.environ, PYTHONPATH=str(ROOT / "plugins/module_utils"))
COMMIT = "a" * 40


def _rf(path, data, lfs=False):
    if lfs:
        return hub_listing.RepoFile(path, len(data), "sha256", hashlib.sha256(data).hexdigest())
    return hub_listing.RepoFile(path, len(data), "sha1", git_blob_sha1(data))


LISTING = [_rf("model.safetensors", b"w" * 100, lfs=True), _rf("config.json", b"{}"),
           _rf("README.md", b"")]


def _facts(**kw):
    facts = {"name": COMMIT, "private": True, "infohash": "1" * 40,
             "files": [("config.json", 2), ("model.safetensors", 100)]}
    return {**facts, **kw}


# ---------------------------------------------------------------- what a torrent holds

def test_piece_size_is_a_power_of_two_from_the_size_alone():
    assert p2p_torrent.piece_size(0) == p2p_torrent.MIN_PIECE
    assert p2p_torrent.piece_size(4 << 20) == 16 << 10
    assert p2p_torrent.piece_size(700 << 30) == p2p_torrent.MAX_PIECE
    for total in (1, 10 << 20, 3 << 30, 70 << 30):
        size = p2p_torrent.piece_size(total)
        assert size & (size - 1) == 0 and p2p_torrent.MIN_PIECE <= size <= p2p_torrent.MAX_PIECE
        assert size == p2p_torrent.piece_size(total)
    with pytest.raises(p2p.P2PError):
        p2p_torrent.piece_size(-1)


def test_torrent_files_sorted_under_the_commit_without_empty_files():
    root, files = p2p_torrent.torrent_files({"commit": COMMIT, "files": LISTING})
    assert root == COMMIT
    assert files == [("config.json", 2), ("model.safetensors", 100)]


@pytest.mark.parametrize("model, needle", [
    ({"commit": "main", "files": LISTING}, "not a commit sha"),
    ({"commit": COMMIT, "files": [_rf("../etc/passwd", b"x")]}, "unsafe path"),
    ({"commit": COMMIT, "files": [_rf(".gpufleet/manifest.json", b"x")]}, "state folder"),
    ({"commit": COMMIT, "files": [_rf("README.md", b"")]}, "no non-empty file"),
])
def test_torrent_files_refuses_bad_models(model, needle):
    with pytest.raises(hub.HubError, match=needle):
        p2p_torrent.torrent_files(model)


def test_check_torrent_accepts_the_listing_and_returns_what_it_carries():
    carried = p2p_torrent.check_torrent(_facts(), LISTING, COMMIT, "1" * 40)
    assert [f.path for f in carried] == ["config.json", "model.safetensors"]
    assert carried[1].algorithm == "sha256"  # the listing's hash rule, not the torrent's


@pytest.mark.parametrize("facts, infohash, needle", [
    (_facts(files=[("config.json", 2), ("model.safetensors", 100), ("evil.py", 5)]), None,
     "'evil.py', which the listing"),
    (_facts(files=[("config.json", 2), ("model.safetensors", 99)]), None, "99 bytes"),
    (_facts(files=[("config.json", 2)]), None, "lacks 'model.safetensors'"),
    (_facts(files=[("../../root/.ssh/authorized_keys", 2)]), None, "unsafe path"),
    (_facts(private=False), None, "not private"),
    (_facts(name="b" * 40), None, "another revision"),
    (_facts(), "2" * 40, "not the one the control node announced"),
])
def test_check_torrent_refuses(facts, infohash, needle):
    with pytest.raises(p2p.P2PError, match=needle):
        p2p_torrent.check_torrent(facts, LISTING, COMMIT, infohash)


def test_infohashes_in_plain_python():
    info = b"d6:lengthi3e4:name1:a12:piece lengthi16384e6:pieces0:7:privatei1ee"
    data = b"d8:announce0:4:info" + info + b"e"
    assert p2p_torrent.infohashes(data) == (hashlib.sha1(info).hexdigest(),
                                            hashlib.sha256(info).hexdigest())
    for bad in (b"", b"not bencode", b"d4:infod", b"d3:fooi1ee", b"d4:info99:abce"):
        with pytest.raises(p2p.P2PError):
            p2p_torrent.infohashes(bad)


# ---------------------------------------------------------------- the session

def test_allow_list_from_inventory_addresses():
    assert p2p_swarm.allow_list(["10.0.0.3", "10.0.0.2", "10.0.0.3", "fd00::1"], "10.0.0.1") == [
        "10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1"]


@pytest.mark.parametrize("peers, needle", [
    (["gpu-01.example"], "not an IP address"),
    (["10.0.0.0/8"], "not an IP address"),
    ([" 10.0.0.2"], "not an IP address"),
    (["0.0.0.0"], "unspecified"),
    (["224.0.0.1"], "multicast"),
    ([], "empty"),
])
def test_allow_list_refuses_what_is_not_a_host_address(peers, needle):
    with pytest.raises(p2p.P2PError, match=needle):
        p2p_swarm.allow_list(peers)


def test_ip_filter_blocks_everything_but_the_allowed_addresses():
    rules = p2p_swarm.ip_filter_rules(["10.0.0.2", "fd00::1"])
    assert rules[:2] == [("0.0.0.0", "255.255.255.255", True),
                         ("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", True)]
    assert rules[2:] == [("10.0.0.2", "10.0.0.2", False), ("fd00::1", "fd00::1", False)]


def test_settings_are_private_to_the_fleet():
    s = p2p_swarm.settings("10.0.0.2", 6881)
    for key in ("enable_dht", "enable_lsd", "enable_upnp", "enable_natpmp",
                "enable_incoming_utp", "enable_outgoing_utp"):
        assert s[key] is False, key
    assert s["listen_interfaces"] == "10.0.0.2:6881"
    assert s["outgoing_interfaces"] == "10.0.0.2"
    assert p2p_swarm.settings("fd00::2", 7000)["listen_interfaces"] == "[fd00::2]:7000"
    assert s["ban_web_seeds"] is True


@pytest.mark.parametrize("addr, port", [("0.0.0.0", 6881), ("::", 6881),
                                        ("10.0.0.2", 0), ("10.0.0.2", 70000)])
def test_settings_refuse_every_interface_and_bad_ports(addr, port):
    with pytest.raises(p2p.P2PError):
        p2p_swarm.settings(addr, port)


def test_web_seed_must_honour_range():
    url = "http://mirror:8090/org/m/resolve/"
    assert p2p_swarm.web_seed_verdict(url, 206, {"Content-Range": "bytes 0-0/651"}) is None
    olah = p2p_swarm.web_seed_verdict(url, 200, {"Content-Length": "651"})
    assert "ignores Range" in olah and "olah" in olah and "transport: http" in olah
    assert p2p_swarm.web_seed_verdict(url, 206, {}) is not None


@pytest.mark.parametrize("range_support", [True, False])
def test_probe_web_seed_refuses_a_server_that_ignores_range(range_support):
    with HubStub([Repo("lab/t", {"config.json": b"{}"})], range_support=range_support) as s:
        commit = s.repos["lab/t"].commit
        base = p2p_swarm.web_seed_url(s.url, "lab/t")
        if range_support:
            assert p2p_swarm.probe_web_seed(base, commit, "config.json") is None
        else:  # olah's behaviour: 200 and the whole file
            with pytest.raises(p2p.P2PError, match="ignores Range"):
                p2p_swarm.probe_web_seed(base, commit, "config.json")


def test_probe_web_seed_names_a_mirror_that_is_down():
    with pytest.raises(p2p.P2PError, match="did not answer"):
        p2p_swarm.probe_web_seed("http://127.0.0.1:9/lab/t/resolve/", "a" * 40, "config.json", 2)


def test_web_seed_url_is_the_site_mirrors_resolve_path():
    assert p2p_swarm.web_seed_url("http://10.0.0.1:8090/", "org/m") == \
        "http://10.0.0.1:8090/org/m/resolve/"
    with pytest.raises(p2p.P2PError):
        p2p_swarm.web_seed_url("file:///srv/models", "org/m")
    with pytest.raises(hub.HubError):
        p2p_swarm.web_seed_url("http://10.0.0.1:8090", "../m")


# ---------------------------------------------------------------- files

def test_verify_file_uses_hf_models_rule(tmp_path):
    data = b"hello"
    (tmp_path / "f").write_bytes(data)
    assert p2p.verify_file(tmp_path / "f", _rf("f", data)) is None
    assert p2p.verify_file(tmp_path / "f", _rf("f", data, lfs=True)) is None
    assert "sha1" in p2p.verify_file(tmp_path / "f", _rf("f", b"hellO"))
    pinned = hub_listing.RepoFile("f", 5, "sha1", git_blob_sha1(data), pinned="0" * 64)
    assert "the lock pins" in p2p.verify_file(tmp_path / "f", pinned)


def test_a_completed_file_not_yet_in_its_file_is_looked_at_again_after_a_flush(tmp_path):
    """libtorrent can count a piece as had while its bytes are still in its store buffer:
    the file is rejected only if it still fails after a flush and FLUSH_GRACE seconds."""
    data = b"the verified bytes"
    part = tmp_path / "f"
    part.write_bytes(b"\0" * len(data))  # not written yet
    flushes = []

    def flush():  # libtorrent writes its buffer out
        flushes.append(1)
        part.write_bytes(data)

    seen = {}
    f = _rf("f", data)
    assert p2p.check_completed(part, f, seen, 100.0, flush) == "retry"
    assert flushes == [1]
    assert p2p.check_completed(part, f, seen, 100.5, flush) == "retry"  # once a second
    assert p2p.check_completed(part, f, seen, 101.0, flush) is None
    assert flushes == [1]


def test_a_completed_file_that_stays_wrong_is_rejected_after_the_grace(tmp_path):
    part = tmp_path / "f"
    part.write_bytes(b"hellO")
    seen, f, flushes = {}, _rf("f", b"hello"), []
    looks = [p2p.check_completed(part, f, seen, 100.0 + t, lambda: flushes.append(1))
             for t in range(int(p2p.FLUSH_GRACE) + 1)]
    assert looks[:-1] == ["retry"] * int(p2p.FLUSH_GRACE)
    assert "sha1" in looks[-1] and "the listing gives" in looks[-1]
    assert len(flushes) == int(p2p.FLUSH_GRACE)
    # a grace of 0: rejected at the first look, as before
    assert "sha1" in p2p.check_completed(part, f, {}, 0.0, lambda: None, grace=0)


def test_place_file_links_into_place_and_refuses_links_in_dest(tmp_path):
    dest, part = tmp_path / "dest", tmp_path / "part"
    dest.mkdir()
    part.write_bytes(b"x")
    p2p.place_file(str(dest), str(part), _rf("sub/f", b"x"))
    assert (dest / "sub/f").read_bytes() == b"x"
    assert os.stat(dest / "sub/f").st_ino == os.stat(part).st_ino
    (dest / "evil").symlink_to(tmp_path)
    with pytest.raises(hub.UnsafePathError):
        p2p.place_file(str(dest), str(part), _rf("evil/f", b"x"))


def test_summary_names_banned_and_blocked_peers():
    carried = LISTING[:2]
    events = [{"event": "placed", "path": "config.json"},
              {"event": "banned", "peer": "10.0.0.6"}, {"event": "banned", "peer": "10.0.0.6"},
              {"event": "blocked", "peer": "192.0.2.9"}, {"event": "hash_failed"}]
    s = p2p.summary(events, carried)
    assert s["complete"] is False
    assert s["banned_peers"] == ["10.0.0.6"] and s["blocked_peers"] == ["192.0.2.9"]
    events.append({"event": "placed", "path": "model.safetensors"})
    assert p2p.summary(events, carried)["complete"] is True


def test_module_imports_without_libtorrent_and_says_what_to_install():
    try:
        import libtorrent  # noqa: F401
    except ImportError:
        with pytest.raises(p2p.P2PError, match="python3-libtorrent"):
            p2p_torrent.load_libtorrent()
    else:
        pytest.skip("libtorrent is importable here")


# ---------------------------------------------------------------- making (libtorrent)

def _sys_libtorrent():
    r = subprocess.run(["/usr/bin/python3", "-c", "import libtorrent"], capture_output=True)
    return r.returncode == 0


def _make(folder, out):
    r = subprocess.run(["/usr/bin/python3", str(ROOT / "tests/hfstub/p2ppeer.py"), "make",
                        str(folder), str(out)], capture_output=True, text=True, env=PEER_ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.skipif(not _sys_libtorrent(), reason="python3-libtorrent is not installed")
def test_two_makes_give_the_same_torrent_and_other_bytes_another(tmp_path):
    files = {"config.json": b'{"hidden_size": 64}', "model.safetensors": os.urandom(300 << 10),
             "README.md": b""}
    with HubStub([Repo("lab/t", files), Repo("lab/u", {**files, "config.json": b"{}"})]) as s:
        hub.sync_repo(hub_client.HubClient(s.url), "lab/t", "main", str(tmp_path / "t"))
        hub.sync_repo(hub_client.HubClient(s.url), "lab/u", "main", str(tmp_path / "u"))
    one = _make(tmp_path / "t", tmp_path / "1.torrent")
    os.utime(tmp_path / "t/.gpufleet/manifest.json")  # made again later: same bytes
    two = _make(tmp_path / "t", tmp_path / "2.torrent")
    assert (tmp_path / "1.torrent").read_bytes() == (tmp_path / "2.torrent").read_bytes()
    assert one == two
    model = hub_mirror.read_model_folder(str(tmp_path / "t"))
    assert one["private"] is True and one["name"] == model["commit"]
    assert one["files"] == [["config.json", 19], ["model.safetensors", 300 << 10]]
    data = (tmp_path / "1.torrent").read_bytes()
    assert b"creation date" not in data and b"created by" not in data
    assert p2p_torrent.infohashes(data) == (one["infohash"], one["infohash_v2"])  # no libtorrent
    p2p_torrent.check_torrent(one, model["files"], model["commit"], one["infohash"])
    other = _make(tmp_path / "u", tmp_path / "3.torrent")  # the control: other bytes
    assert other["infohash"] != one["infohash"]


@pytest.mark.skipif(not _sys_libtorrent(), reason="python3-libtorrent is not installed")
def test_make_refuses_a_folder_changed_since_it_was_verified(tmp_path):
    with HubStub([Repo("lab/t", {"config.json": b"{}", "w.bin": b"x" * 1000})]) as s:
        hub.sync_repo(hub_client.HubClient(s.url), "lab/t", "main", str(tmp_path / "t"))
    (tmp_path / "t/w.bin").write_bytes(b"y" * 1000)
    r = subprocess.run(["/usr/bin/python3", str(ROOT / "tests/hfstub/p2ppeer.py"), "make",
                        str(tmp_path / "t"), str(tmp_path / "x.torrent")],
                       capture_output=True, text=True, env=PEER_ENV)
    assert r.returncode != 0 and "changed since it was verified" in r.stderr
    assert not (tmp_path / "x.torrent").exists()
