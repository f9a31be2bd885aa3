"""Hostile-mirror suite: gpufleet.hub and hub_mirror against mirrors that lie, loop,
trickle, flood and redirect (docs/model-fetch.md, "A hostile or broken mirror").

Each attack is a real HTTP server on 127.0.0.1: tests/hfstub/server.py's HubStub (a
STAND-IN hub) or HostileServer (a STAND-IN hostile mirror whose answers each test
scripts; it records the Authorization headers it got and the body bytes it sent). Every
test sets small limits and must finish in seconds; `bounded` fails one that does not.
"""
import json
import os
import pathlib
import re
import threading
import time
import tracemalloc
import zlib

import pytest

import hf_model
from gpufleet import hub, hub_client, hub_fetch, hub_listing, hub_mirror
from helpers import run_module
from hfstub.faultproxy import FaultProxy  # noqa: E402
from hfstub.server import HostileServer, HubStub, Repo, git_blob_sha1  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKEN = "hf_hostileProbeTokenNeverLeaves7"
COMMIT = "c" * 40


def client(url, **kw):
    kw.setdefault("timeout", 1)
    kw.setdefault("retries", 2)
    kw.setdefault("backoff", 0.001)
    return hub_client.HubClient(url, **kw)


def api_routes(files, tree_headers=None):
    """HostileServer routes answering repo org/m's info and a one-page listing."""
    rows = [{"type": "file", "path": p, "size": len(d), "oid": git_blob_sha1(d)}
            for p, d in files.items()]
    return {"/api/models/org/m/revision/": lambda h: h.json({"sha": COMMIT}),
            "/api/models/org/m/tree/": lambda h: h.json(rows, tree_headers)}


def bounded(seconds, fn, *args, **kw):
    """Run fn in a thread; fail unless it returns or raises within `seconds`.
    Returns (result or None, exception or None, seconds taken)."""
    box = {}

    def target():
        try:
            box["result"] = fn(*args, **kw)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t0 = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: not bounded"
    return box.get("result"), box.get("error"), time.monotonic() - t0


def trickle(data, step=1, pause=0.05):
    """A route sending data's Content-Length, then `step` bytes every `pause` s."""
    def route(h):
        h.answer(200, b"", length=len(data))
        for i in range(0, len(data), step):
            time.sleep(pause)
            h.write(data[i:i + step])
    return route


# ---------------------------------------------------------------- 1. token and origin

def test_next_page_on_another_origin_is_refused_and_gets_no_token(tmp_path):
    with HostileServer({"/": lambda h: h.json([])}) as other:
        link = f'<{other.url}/api/models/org/m/tree/{COMMIT}?cursor=1>; rel="next"'
        with HostileServer(api_routes({"config.json": b"{}"}, {"Link": link})) as mirror:
            with pytest.raises(hub.HubError, match="not on the endpoint") as exc:
                hub.sync_repo(client(mirror.url, token=TOKEN), "org/m", "main",
                              tmp_path / "d")
        assert f"Bearer {TOKEN}" in mirror.seen_auth  # the endpoint got it ...
        assert other.log == []  # ... the other origin was not even contacted
    assert other.url.split("//")[1] in str(exc.value) and TOKEN not in str(exc.value)
    assert not (tmp_path / "d").exists()


def test_redirect_to_another_origin_never_carries_the_token(tmp_path):
    data = b"weights " * 1000
    with HostileServer({"/blob": lambda h: h.answer(200, data)}) as cdn:
        routes = api_routes({"model.bin": data})
        routes["/org/m/resolve/"] = lambda h: h.answer(302, b"", {"Location": f"{cdn.url}/blob"})
        with HostileServer(routes) as mirror:
            hub.sync_repo(client(mirror.url, token=TOKEN), "org/m", "main", tmp_path)
        assert set(mirror.seen_auth) == {f"Bearer {TOKEN}"}
        assert cdn.seen_auth == [None]
    assert (tmp_path / "model.bin").read_bytes() == data


# ---------------------------------------------------------------- 2. bounded time

@pytest.mark.parametrize("mirror", ["416 with Content-Range", "bare 416"])
def test_file_served_shorter_than_listed_fails_fast_as_short(tmp_path, mirror):
    """The probe's endless loop: a short copy, answered 416 on resume."""
    name = "model.safetensors"
    data = os.urandom(200_000)
    short = data[:150_000]
    if mirror == "416 with Content-Range":
        server = HubStub([Repo("org/m", {name: data})], corrupt={name: short})
        repo = "org/m"
    else:
        def resolve(h):
            if h.headers.get("Range"):
                return h.answer(416)
            h.answer(200, short)
        routes = api_routes({name: data})
        routes["/org/m/resolve/"] = resolve
        server, repo = HostileServer(routes), "org/m"
    with server as s:
        _, err, took = bounded(20, hub.sync_repo, client(s.url, retries=3), repo, "main",
                               tmp_path)
    assert isinstance(err, hub.HubError), err
    assert "copy is short" in str(err) and "150000 of the 200000 bytes" in str(err)
    assert took < 10
    assert not (tmp_path / name).exists()


def test_trickling_mirror_is_cut_by_min_rate(tmp_path):
    """1 byte every 50 ms passes a 1 s between-bytes timeout forever; min_rate cuts it."""
    data = b"x" * 1000
    routes = api_routes({"config.json": data})
    routes["/org/m/resolve/"] = trickle(data)
    with HostileServer(routes) as s:
        _, err, took = bounded(15, hub.sync_repo, client(s.url, timeout=0.5, retries=1,
                                                         min_rate=200), "org/m", "main",
                               tmp_path)
    assert isinstance(err, hub.HubError) and "below min_rate" in str(err), err
    assert "gave up" in str(err) and took < 8
    assert not (tmp_path / "config.json").exists()


def test_deadline_stops_the_whole_fetch(tmp_path):
    data = os.urandom(100_000)
    routes = api_routes({"model.bin": data})
    routes["/org/m/resolve/"] = trickle(data, step=100, pause=0.05)  # 2 kB/s: 50 s
    with HostileServer(routes) as s:
        _, err, took = bounded(15, hub.sync_repo, client(s.url, min_rate=0, deadline=1.5),
                               "org/m", "main", tmp_path)
    assert isinstance(err, hub.HubError) and "deadline (1.5 s)" in str(err), err
    assert took < 5
    kept = list((tmp_path / ".gpufleet/incomplete").iterdir())
    assert kept and 0 < kept[0].stat().st_size < len(data)  # kept for the next run


def test_requests_per_file_are_bounded(tmp_path):
    """Each answer brings 100 new bytes then drops: progress every time, so only
    max_file_attempts stops it (it would take 100 requests)."""
    data = os.urandom(10_000)

    def dribble(h):
        m = re.match(r"bytes=(\d+)-", h.headers.get("Range") or "")
        start = int(m.group(1)) if m else 0
        headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
        h.close_connection = True
        h.answer(206 if start else 200, data[start:start + 100], headers,
                 length=len(data) - start)

    routes = api_routes({"model.bin": data})
    routes["/org/m/resolve/"] = dribble
    with HostileServer(routes) as s:
        _, err, _ = bounded(15, hub.sync_repo, client(s.url, max_file_attempts=5), "org/m",
                            "main", tmp_path)
        resolves = [p for p, _ in s.log if "/resolve/" in p]
    assert isinstance(err, hub.HubError) and "max_file_attempts" in str(err), err
    assert len(resolves) == 5


def test_retries_across_the_fetch_are_bounded(tmp_path):
    with HubStub([Repo("org/m", {"a.json": b"{}"})]) as s, \
            FaultProxy(s.url, rate=1.0, kinds=["500"]) as p:
        _, err, _ = bounded(15, hub.sync_repo, client(p.url, retries=10, max_total_retries=2),
                            "org/m", "main", tmp_path)
        assert p.injected["500"] == 3
    assert isinstance(err, hub.HubError) and "max_total_retries" in str(err), err


# ---------------------------------------------------------------- 3. writes outside

@pytest.mark.parametrize("link", ["sub", ".gpufleet"])
def test_symlink_inside_dest_is_never_written_through(tmp_path, link):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / link).symlink_to(outside)
    files = {"config.json": b"{}", "sub/weights.bin": b"w" * 100}
    with HubStub([Repo("org/m", files)]) as s:
        with pytest.raises(hub.HubError, match="is a symbolic link inside"):
            hub.sync_repo(client(s.url), "org/m", "main", dest)
        assert not s.requests_for("/resolve/")
    assert list(outside.iterdir()) == []


def test_symlink_at_a_final_name_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious, not ours")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "config.json").symlink_to(victim)
    with HubStub([Repo("org/m", {"config.json": b'{"a": 1}'})]) as s:
        res = hub.sync_repo(client(s.url), "org/m", "main", dest)
    assert victim.read_bytes() == b"precious, not ours"
    assert not (dest / "config.json").is_symlink()
    assert (dest / "config.json").read_bytes() == b'{"a": 1}'
    assert [q["got"] for q in res["quarantined"]] == ["a symbolic link"]


@pytest.mark.parametrize("rev", ["../../x", 'main"', "ma in", "main\nx", "/abs", "a\\b",
                                 "v1..v2", "tab\tx", "a//b"])
def test_unsafe_revision_is_refused_before_any_request(tmp_path, rev):
    with HubStub([Repo("org/m", {"a.json": b"{}"})]) as s:
        with pytest.raises(hub.HubError, match="unsafe revision"):
            hub.sync_repo(client(s.url), "org/m", rev, tmp_path / "d")
        assert s.log == []
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("name", ['a"b.json', "a b.json", "a\nb.json", "a\x7fb", "\u2028x"])
def test_unsafe_listed_names_are_refused(name):
    with pytest.raises(hub.HubError, match="unsafe path"):
        hub_listing.parse_tree([{"type": "file", "path": name, "size": 1, "oid": "a" * 40}])


@pytest.fixture
def fetched(tmp_path):
    folder = tmp_path / "models" / "tiny"
    with HubStub([Repo("lab/tiny", {"config.json": b"{}"})]) as s:
        hub.sync_repo(client(s.url), "lab/tiny", "main", folder)
    return folder


def _set_manifest(folder, **kw):
    m = folder / ".gpufleet/manifest.json"
    m.write_text(json.dumps(dict(json.loads(m.read_text()), **kw)))


@pytest.mark.parametrize("rev", ["../../../../../../../escape", 'main" 1;\n"evil/x',
                                 "v1/../../../../../../../escape"])
def test_site_mirror_refuses_unsafe_revision_and_writes_nothing(fetched, tmp_path, rev):
    _set_manifest(fetched, revision=rev)
    site = tmp_path / "site"
    with pytest.raises(hub.HubError, match="unsafe revision"):
        hub_mirror.build_site(site, [{"path": str(fetched)}])
    assert not (tmp_path / "escape").exists() and not site.exists()


def test_site_mirror_never_writes_through_a_link_in_its_root(fetched, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    site = tmp_path / "site"
    site.mkdir()
    (site / "nginx").symlink_to(outside)
    with pytest.raises(hub.HubError, match="is a symbolic link inside"):
        hub_mirror.build_site(site, [{"path": str(fetched)}])
    assert list(outside.iterdir()) == []


# ---------------------------------------------------------------- 4. bounded resources

def test_endless_api_answer_is_cut_at_max_api_bytes(tmp_path):
    def endless(h):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        h.write(b"[")
        chunk = b"0," * (32 << 10)
        for _ in range(1024):  # 64 MiB, "endless" next to the 100 kB cap
            h.write(chunk)

    with HostileServer({"/api/models/org/m/revision/": endless}) as s:
        c = client(s.url, max_api_bytes=100_000, retries=0)
        _, err, took = bounded(15, hub.sync_repo, c, "org/m", "main", tmp_path / "d")
        time.sleep(0.2)  # let the server notice the closed connection
        sent = s.sent
    assert isinstance(err, hub.HubError), err
    assert "more than 100000 bytes (max_api_bytes)" in str(err) and s.url[7:] in str(err)
    assert c.api_bytes == 100_001  # the cap plus the one byte that proves it is exceeded
    assert sent < 32 << 20  # stopped reading early: most of the 64 MiB never went out
    assert took < 5 and not (tmp_path / "d").exists()


def test_gzip_bomb_listing_is_cut_at_max_api_bytes_decompressed(tmp_path):
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    zero = bytes(1 << 20)
    bomb = b"".join(z.compress(zero) for _ in range(128)) + z.flush()  # 128 MiB inflated
    assert len(bomb) < 1 << 20
    routes = api_routes({})
    routes["/api/models/org/m/tree/"] = lambda h: h.answer(
        200, bomb, {"Content-Encoding": "gzip", "Content-Type": "application/json"})
    with HostileServer(routes) as s:
        c = client(s.url, max_api_bytes=1_000_000, retries=0)
        tracemalloc.start()
        try:
            with pytest.raises(hub.HubError, match=r"max_api_bytes"):
                hub.sync_repo(c, "org/m", "main", tmp_path / "d")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert c.api_bytes < 1_000_100  # repo info + the capped listing, decompressed
    assert peak < 24 << 20, f"peak {peak} bytes"


def test_listing_with_too_many_entries_is_refused_before_writing(tmp_path):
    files = {f"f{i:03d}.txt": b"" for i in range(150)}
    with HubStub([Repo("org/m", files)], page_size=50) as s:
        with pytest.raises(hub.HubError, match=r"more than 100 entries \(max_listing_entries\)"):
            hub.sync_repo(client(s.url, max_listing_entries=100), "org/m", "main",
                          tmp_path / "d")
        assert not s.requests_for("/resolve/")
    assert not (tmp_path / "d").exists()


def test_free_inodes_are_checked_with_free_bytes(tmp_path, monkeypatch):
    real = os.statvfs

    def few_inodes(path):
        st = real(path)
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, st.f_bfree,
                                  st.f_bavail, 1000, 80, 80, st.f_flag, st.f_namemax))

    monkeypatch.setattr(hub_fetch.os, "statvfs", few_inodes)
    files = {f"d/f{i:02d}.txt": b"" for i in range(40)}  # 40 files + 1 folder + margin > 80
    with HubStub([Repo("org/m", files)]) as s:
        with pytest.raises(hub.DiskSpaceError, match="80 free inodes; this fetch creates 41"):
            hub.sync_repo(client(s.url), "org/m", "main", tmp_path / "d")
        assert not s.requests_for("/resolve/")
    assert not (tmp_path / "d").exists()


# ---------------------------------------------------------------- 5. transport errors

def _attack_routes(attack):
    ok_info = {"/api/models/org/m/revision/": lambda h: h.json({"sha": COMMIT})}
    if attack == "Link to ftp://":
        return {**ok_info, "/api/models/org/m/tree/": lambda h: h.json(
            [], {"Link": '<ftp://127.0.0.1/tree?cursor=1>; rel="next"'})}
    if attack == "redirect loop":
        return {"/api/models/": lambda h: h.answer(302, b"", {"Location": h.path})}
    if attack == "redirect to ftp://":
        return {"/api/models/": lambda h: h.answer(302, b"", {"Location": "ftp://127.0.0.1/x"})}
    if attack == "deeply nested JSON":
        return {"/api/models/": lambda h: h.answer(200, b"[" * 200_000 + b"]" * 200_000)}
    if attack == "unknown Content-Encoding":
        return {"/api/models/": lambda h: h.answer(200, b"\x8b\x00junk",
                                                    {"Content-Encoding": "br"})}
    if attack == "listing rows not objects":
        return {**ok_info, "/api/models/org/m/tree/": lambda h: h.json([1, "x"])}
    raise AssertionError(attack)


@pytest.mark.parametrize("attack,message", [
    ("Link to ftp://", "is not on the endpoint"),
    ("redirect loop", "redirect loop"),
    ("redirect to ftp://", "not an http(s) URL; refusing to follow it"),
    ("deeply nested JSON", "nested too deeply"),
    ("unknown Content-Encoding", "Content-Encoding 'br'"),
    ("listing rows not objects", "not an object"),
])
def test_transport_attacks_fail_with_a_clear_message(tmp_path, attack, message):
    with HostileServer(_attack_routes(attack)) as s:
        endpoint = s.url.replace("http://", "http://probe:s3cret@")  # credentials in the URL
        _, err, took = bounded(15, hub.sync_repo, client(endpoint), "org/m", "main",
                               tmp_path / "d")
    assert isinstance(err, hub.HubError), repr(err)  # not a traceback
    assert message in str(err), str(err)
    assert "s3cret" not in str(err)
    if attack != "listing rows not objects":
        assert s.url[7:] in str(err)  # names the URL (host:port)
    assert took < 10


def test_connection_refused_names_the_url(tmp_path):
    with HostileServer() as s:
        url = s.url  # closed once the block ends: nothing listens there any more
    _, err, _ = bounded(15, hub.sync_repo, client(url, retries=1), "org/m", "main", tmp_path)
    assert isinstance(err, hub.HubError) and url[7:] in str(err) and "gave up" in str(err)


# ---------------------------------------------------------------- module and docs

def test_module_passes_the_limits_on(tmp_path, monkeypatch):
    files = {f"f{i}.txt": b"" for i in range(5)}
    with HubStub([Repo("org/m", files)]) as s:
        res, failed = run_module(hf_model.main, {"repo_id": "org/m", "dest": str(tmp_path / "d"),
                                                 "endpoint": s.url, "max_listing_entries": 3},
                                 monkeypatch)
    assert failed and "max_listing_entries" in res["msg"], res
    res, failed = run_module(hf_model.main, {"repo_id": "org/m", "dest": str(tmp_path / "d"),
                                             "endpoint": "http://127.0.0.1:9",
                                             "max_api_bytes": 0}, monkeypatch)
    assert failed and "max_api_bytes must be a whole number of bytes from 1 to" in res["msg"]


def test_token_docs_name_the_safe_forms():
    import yaml

    token = " ".join(yaml.safe_load(hf_model.DOCUMENTATION)["options"]["token"]["description"])
    guide = (ROOT / "docs/model-fetch.md").read_text()
    for text in (token, guide):
        assert "vault" in text and "HF_TOKEN" in text and "ad-hoc" in text
