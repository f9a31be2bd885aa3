"""gpufleet.p2p's fleet wiring (issue #35 item 4): model_fetch's preflight decisions, the
peers list, the seeding policy and its detached seeder, caps, check mode, and hub's
runner hook (disk check first, nothing to fetch: no swarm). hf_model's p2p options through
main(). Plain Python; the swarm itself runs in tests/slow/test_p2p_model_fetch.py."""
import os
import time

import pytest

import hf_model
from gpufleet import fetch_wait, hub, hub_client, hub_fetch, p2p, p2p_plan, p2p_seeder, p2p_swarm
from helpers import run_module
from hfstub.server import HubStub, Repo  # noqa: E402

from ansible_collections.gpufleet.fleet.plugins.filter import gpufleet as filters

FILES = {"config.json": b'{"hidden_size": 64}', "model.safetensors": os.urandom(1 << 16)}
ENDPOINT = "http://10.0.0.9:8090"


# ---------------------------------------------------------------- preflight

def test_settings_fine():
    assert p2p_plan.check_settings("p2p", "until_rollout_end", 0, 10 << 20, 6881) == []
    assert p2p_plan.check_settings("http", "never", 1, 0, 1024) == []


@pytest.mark.parametrize("args, named", [
    (("ftp", "never", 0, 0, 6881), "model_fetch_transport"),
    (("p2p", "sometimes", 0, 0, 6881), "model_fetch_p2p_seed"),
    (("p2p", "never", -1, 0, 6881), "model_fetch_p2p_upload_rate"),
    (("p2p", "never", 0, "10M", 6881), "model_fetch_p2p_download_rate"),
    (("p2p", "never", True, 0, 6881), "model_fetch_p2p_upload_rate"),
    (("p2p", "never", 0, 0, 0), "model_fetch_p2p_port"),
    (("p2p", "never", 0, 0, 70000), "model_fetch_p2p_port"),
])
def test_settings_refused_naming_the_variable(args, named):
    problems = p2p_plan.check_settings(*args)
    assert len(problems) == 1 and named in problems[0], problems


def test_a_model_entry_overrides_the_fleet_transport():
    got, problems = p2p_plan.model_transports(
        [{"repo_id": "a/b"}, {"repo_id": "c/d", "transport": "p2p"}], "http")
    assert got == {"a/b": "http", "c/d": "p2p"} and problems == []
    _, problems = p2p_plan.model_transports([{"repo_id": "c/d", "transport": "torrent"}], "http")
    assert "'c/d'" in problems[0] and "torrent" in problems[0]


def test_filter_joins_the_settings_and_the_models_problems():
    problems = filters.p2p_problems([{"repo_id": "c/d", "transport": "x"}], "p2p", "never",
                                    0, 0, 6881)
    assert len(problems) == 1
    assert len(filters.p2p_problems([], "p2p", "no", 0, 0, 0)) == 2


def test_one_port_per_model():
    assert [p2p_plan.model_port(6881, i) for i in range(3)] == [6881, 6882, 6883]
    with pytest.raises(p2p.P2PError, match="model_fetch_p2p_port"):
        p2p_plan.model_port(70000, 0)
    with pytest.raises(p2p.P2PError, match=r"model_fetch_p2p_port \+ 2"):
        p2p_plan.model_port(65534, 2)


# ---------------------------------------------------------------- the swarm's addresses

HOSTVARS = {"a": {"ansible_host": "10.0.0.1"},
            "b": {"ansible_host": "gpu-b.example", "model_fetch_p2p_address": "10.0.0.2"},
            "c": {"ansible_host": "fd00::3"}}


def test_fleet_addresses_by_the_reachable_address_rule():
    pairs, problems = p2p_plan.fleet_addresses(["a", "b", "c"], HOSTVARS)
    assert pairs == [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "fd00::3")]
    assert problems == []
    assert filters.p2p_fleet(["a"], HOSTVARS) == {"addresses": {"a": "10.0.0.1"},
                                                  "problems": []}


def test_a_host_known_by_name_only_is_refused_naming_it():
    pairs, problems = p2p_plan.fleet_addresses(["a", "d"], {**HOSTVARS, "d": {"ansible_host": "gpu-d"}})
    assert pairs == [("a", "10.0.0.1")]
    assert problems[0].startswith("d:") and "model_fetch_p2p_address" in problems[0]


def _opts(**kw):
    return {"listen": "10.0.0.1", "port": 7000, "peers": ["10.0.0.1", "10.0.0.2", "fd00::3"],
            "torrent": "/t", "infohash": "ab" * 20, **kw}


def test_peers_are_the_others_with_the_mirror_allowed():
    job = p2p_plan.peer_job(_opts(), "org/m", ENDPOINT)
    assert job["peers"] == ["10.0.0.2:7000", "[fd00::3]:7000"]  # not itself
    assert job["allow"] == ["10.0.0.1", "10.0.0.2", "10.0.0.9", "fd00::3"]
    assert job["web_seed"] == f"{ENDPOINT}/org/m/resolve/"


def test_without_web_seed_the_mirror_is_not_allowed():
    job = p2p_plan.peer_job(_opts(web_seed=False), "org/m", ENDPOINT)
    assert job["web_seed"] is None and "10.0.0.9" not in job["allow"]


def test_a_mirror_named_by_name_needs_its_address():
    with pytest.raises(p2p.P2PError, match="model_fetch_p2p_mirror_address"):
        p2p_plan.peer_job(_opts(), "org/m", "http://mirror.example:8090")
    job = p2p_plan.peer_job(_opts(mirror_address="10.0.0.9"), "org/m", "http://mirror.example:8090")
    assert "10.0.0.9" in job["allow"]


@pytest.mark.parametrize("kw, match", [
    ({"listen": "gpu-a"}, "p2p.listen"), ({"listen": "0.0.0.0"}, "unspecified"),
    ({"peers": ["10.0.0.0/24"]}, "p2p.listen / p2p.peers"),
    ({"upload_rate": -5}, "upload_rate")])
def test_bad_swarm_inputs_refused(kw, match):
    with pytest.raises((p2p.P2PError, ValueError), match=match):
        p2p_plan.peer_job(_opts(**kw), "org/m", ENDPOINT)


def test_caps_reach_the_session_settings():
    job = p2p_plan.peer_job(_opts(upload_rate=1 << 20, download_rate=2 << 20), "org/m", ENDPOINT)
    s = p2p_swarm.settings(job["listen"], job["port"], job["upload_rate"], job["download_rate"])
    assert (s["upload_rate_limit"], s["download_rate_limit"]) == (1 << 20, 2 << 20)


# ---------------------------------------------------------------- seeding policy

def test_seeding_policy():
    assert [p2p_plan.seeds_after_fetch(p) for p in p2p_plan.SEED_POLICIES] == [True, True, False]
    assert p2p_plan.stops_at_rollout_end("until_rollout_end")
    assert not p2p_plan.stops_at_rollout_end("forever")
    assert p2p_plan.stops_at_rollout_end("forever", force=True)
    with pytest.raises(p2p.P2PError):
        p2p_plan.seeds_after_fetch("sometimes")


def test_seeder_timeout_by_policy():
    result = {"path": "/d", "commit": "c" * 40,
              "files": [{"path": "a", "size": 1, "algorithm": "sha1", "digest": "d",
                         "status": "trusted"}]}
    job = {"seed": "until_rollout_end", "seed_max": 50}
    assert p2p_seeder.seeder_job(result, job)["timeout"] == 50
    assert p2p_seeder.seeder_job(result, dict(job, seed="forever"))["timeout"] == 0  # no limit
    assert p2p_seeder.seeder_job(result, job)["listing"][0] == {"path": "a", "size": 1,
                                                                "algorithm": "sha1", "digest": "d"}


@pytest.fixture
def fake_seeder(monkeypatch):
    """run_peer replaced (in the forked seeder too) by a loop that ends on the stop file."""
    def run_peer(job, log=None, progress=None):
        while not os.path.exists(job["stop_file"]):
            time.sleep(0.05)
        return {"events": []}
    monkeypatch.setattr(p2p, "run_peer", run_peer)


def _job(commit="c" * 40):
    return {"commit": commit, "infohash": "ab" * 20, "dest": "/d", "listen": "10.0.0.1",
            "port": 7000}


def _gone(pid, start):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and p2p_seeder._proc_start(pid) == start:
        time.sleep(0.05)
    return p2p_seeder._proc_start(pid) != start


def test_seeder_detached_found_again_and_stopped(tmp_path, fake_seeder):
    store = str(tmp_path)
    changed, state = p2p_seeder.ensure_seeder(store, _job(), "until_rollout_end")
    try:
        assert changed and state["running"] and state["policy"] == "until_rollout_end"
        assert os.getsid(state["pid"]) != os.getsid(0)  # its own session: outlives the task
        again = p2p_seeder.seeder_state(store)
        assert again["running"] and again["pid"] == state["pid"]
        # idempotent: the same commit is left seeding as it is
        assert p2p_seeder.ensure_seeder(store, _job(), "until_rollout_end") == (False, again)
        # check mode starts nothing, says a new commit would change it
        assert p2p_seeder.ensure_seeder(store, _job("d" * 40), "forever", check_mode=True) == (True, None)
        # another commit: the old seeder is stopped, a new one started
        changed, new = p2p_seeder.ensure_seeder(store, _job("d" * 40), "forever")
        assert changed and new["pid"] != state["pid"] and _gone(state["pid"], state["start"])
        stopped = p2p_seeder.stop_seeder(store)
        assert stopped["pid"] == new["pid"] and _gone(new["pid"], new["start"])
        assert p2p_seeder.seeder_state(store) is None
        assert sorted(os.listdir(store)) == [p2p_seeder.SEEDER_LOG]
        assert p2p_seeder.stop_seeder(store) is None  # nothing left to stop
    finally:
        for s in (state, p2p_seeder.seeder_state(store)):
            if s and p2p_seeder._proc_start(s["pid"]) == s["start"]:
                os.kill(s["pid"], 9)


def test_policy_never_starts_no_seeder(tmp_path, fake_seeder):
    assert p2p_seeder.ensure_seeder(str(tmp_path), _job(), "never") == (False, None)
    assert os.listdir(tmp_path) == []


def test_a_reused_pid_is_not_our_seeder(tmp_path):
    state_file, _, _ = p2p_seeder.seeder_paths(str(tmp_path))
    with open(state_file, "w") as fh:
        fh.write('{"pid": %d, "start": "1", "commit": "c"}' % os.getpid())
    assert p2p_seeder.seeder_state(str(tmp_path))["running"] is False
    assert p2p_seeder.stop_seeder(str(tmp_path)) is None and not os.path.exists(state_file)


# ---------------------------------------------------------------- check mode, progress

def test_check_plan_says_what_and_from_where():
    job = p2p_plan.peer_job(_opts(), "org/m", ENDPOINT)
    got = p2p_plan.check_plan({"bytes_to_download": 123}, job)
    assert got == {"transport": "p2p", "would_fetch_bytes": 123,
                   "from_peers": ["10.0.0.2:7000", "[fd00::3]:7000"],
                   "web_seed": f"{ENDPOINT}/org/m/resolve/", "web_seed_delay": 0,
                   "listen": "10.0.0.1:7000"}


def test_progress_shows_bytes_from_peers_and_from_the_web_seed(tmp_path):
    path = tmp_path / "progress.json"
    p2p._progress_writer(str(path), 3, 3 << 30)(1, 2 << 30, {"peers": 1 << 30,
                                                            "web_seed": 1 << 29})
    got = fetch_wait.read_progress(path.read_text())
    assert got["bytes_downloaded"] == 3 << 29
    line = fetch_wait.progress_line("org/m", got)
    assert line.endswith("(1.50 GiB downloaded: 1.00 GiB from peers, 0.50 GiB from the web seed)")
    # an http fetch's line is as before
    got.pop("bytes_from_peers")
    assert fetch_wait.progress_line("org/m", got).endswith("(1.50 GiB downloaded)")


# ---------------------------------------------------------------- hub's runner hook

@pytest.fixture
def stub():
    with HubStub([Repo("org/tiny", FILES)]) as s:
        yield s


def test_disk_check_refuses_before_the_swarm_starts(stub, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(hub_fetch.shutil, "disk_usage",
                        lambda path: type("U", (), {"free": 1000, "total": 1 << 30})())
    with pytest.raises(hub.DiskSpaceError):
        hub.sync_repo(hub_client.HubClient(stub.url), "org/tiny", "main", str(tmp_path / "d"),
                      runner=lambda *a, **k: calls.append(a))
    assert calls == [] and not (tmp_path / "d").exists()


def test_runner_brings_the_missing_bytes_and_not_when_none_are(stub, tmp_path):
    calls = []

    def runner(fetcher, plan, progress_path=None):  # stands in for the swarm
        calls.append(sorted(f.path for f, s in plan))
        client = hub_client.HubClient(stub.url)
        client.start()
        return fetcher.run(plan, progress_path=progress_path)

    dest = str(tmp_path / "d")
    res = hub.sync_repo(hub_client.HubClient(stub.url), "org/tiny", "main", dest, runner=runner)
    assert res["changed"] and calls == [sorted(FILES)]
    res = hub.sync_repo(hub_client.HubClient(stub.url), "org/tiny", "main", dest, runner=runner)
    assert not res["changed"] and len(calls) == 1  # verified: no swarm


# ---------------------------------------------------------------- hf_model's p2p options

def _margs(stub, dest, **p2p_opts):
    opts = {"listen": "127.0.0.1", "peers": ["127.0.0.2"], "port": 7000, **p2p_opts}
    return {"repo_id": "org/tiny", "dest": str(dest), "endpoint": stub.url,
            "transport": "p2p", **{f"p2p_{k}": v for k, v in opts.items()}}


def test_module_check_mode_says_what_from_where_and_writes_nothing(stub, tmp_path, monkeypatch):
    dest = tmp_path / "m" / "tiny"
    res, failed = run_module(hf_model.main, _margs(stub, dest), monkeypatch, check_mode=True)
    assert not failed and res["changed"] is True
    assert res["p2p"]["would_fetch_bytes"] == sum(len(v) for v in FILES.values())
    assert res["p2p"]["from_peers"] == ["127.0.0.2:7000"]
    assert res["p2p"]["web_seed"] == f"{stub.url}/org/tiny/resolve/"
    assert res["p2p"]["would_seed"] is True
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("opts, match", [
    ({}, "p2p_torrent is required"),
    ({"listen": "gpu-a", "torrent": "/t"}, "not an IP address")])
def test_module_refuses_before_fetching(stub, tmp_path, monkeypatch, opts, match):
    dest = tmp_path / "m" / "tiny"
    res, failed = run_module(hf_model.main, _margs(stub, dest, **opts), monkeypatch)
    assert failed and match in res["msg"] and "Nothing was fetched" in res["msg"]
    assert not (tmp_path / "m").exists()


def test_module_stop_with_no_seeder_changes_nothing(stub, tmp_path, monkeypatch):
    dest = tmp_path / "m" / "tiny"
    res, failed = run_module(hf_model.main, {"repo_id": "org/tiny", "dest": str(dest),
                                             "transport": "p2p", "p2p_stop": True},
                             monkeypatch)
    assert not failed and res["changed"] is False and res["p2p"] == {"stopped": None}


# ---------------------------------------------------------------- the web-seed policy

FLEET = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]


def test_only_the_first_hosts_use_the_web_seed_from_the_start():
    assert [p2p_swarm.web_seed_delay(h, FLEET) for h in FLEET] == [0, 30.0, 30.0, 30.0]
    assert [p2p_swarm.web_seed_delay(h, FLEET, 2, 5) for h in FLEET] == [0, 0, 5, 5]
    assert [p2p_swarm.web_seed_delay(h, FLEET, 0, 5) for h in FLEET] == [5] * 4  # none first
    assert [p2p_swarm.web_seed_delay(h, FLEET, 9, 5) for h in FLEET] == [0] * 4  # every host
    assert p2p_swarm.web_seed_delay("gpu-09", ["gpu-09"]) == 0  # a fleet of one
    # the order is the list's (the inventory's), not the names'
    assert p2p_swarm.web_seed_delay("gpu-04", FLEET[::-1]) == 0


@pytest.mark.parametrize("args, match", [
    (("gpu-01", FLEET, -1, 30), "model_fetch_p2p_web_seed_hosts"),
    (("gpu-01", FLEET, True, 30), "model_fetch_p2p_web_seed_hosts"),
    (("gpu-01", FLEET, "one", 30), "model_fetch_p2p_web_seed_hosts"),
    (("gpu-01", FLEET, "1.5", 30), "model_fetch_p2p_web_seed_hosts"),
    (("gpu-01", FLEET, 1, 0), "model_fetch_p2p_web_seed_fallback"),
    (("gpu-01", FLEET, 1, 86401), "model_fetch_p2p_web_seed_fallback"),
    (("gpu-01", FLEET, 1, "thirty"), "model_fetch_p2p_web_seed_fallback"),
    (("gpu-01", FLEET, 1, "nan"), "model_fetch_p2p_web_seed_fallback"),
    (("gpu-99", FLEET, 1, 30), "model_fetch_p2p_group")])
def test_web_seed_policy_refused_naming_the_variable(args, match):
    with pytest.raises(p2p.P2PError, match=match):
        p2p_swarm.web_seed_delay(*args)


def test_preflight_names_a_bad_web_seed_policy():
    problems = p2p_plan.check_settings("p2p", "never", 0, 0, 6881, -1, 30)
    assert len(problems) == 1 and "model_fetch_p2p_web_seed_hosts" in problems[0]
    assert filters.p2p_problems([], "p2p", "never", 0, 0, 6881, 1, 0)[0].startswith(
        "model_fetch_p2p_web_seed_fallback")


def test_filter_takes_extra_vars_as_strings():
    assert filters.p2p_web_seed_delay("gpu-03", FLEET, "2", "12.5") == 12.5
    assert filters.p2p_web_seed_delay("gpu-02", FLEET, "2", "12") == 0
    with pytest.raises(filters.AnsibleFilterError, match="model_fetch_p2p_web_seed_hosts"):
        filters.p2p_web_seed_delay("gpu-02", FLEET, "two", 30)


def test_preflight_takes_extra_vars_as_strings_as_the_filter_does():
    """-e gives strings: preflight (p2p_plan.check_settings) and the role's filter read
    them through the one rule (p2p_swarm.web_seed_delay, grammar.count), so what preflight
    passes the filter takes, and what one refuses the other refuses with the same words.
    (Until CI stop 44 preflight refused "2" that the filter took.)"""
    assert p2p_plan.check_settings("p2p", "never", "0", "1000", "6881", "2", "12.5") == []
    assert filters.p2p_web_seed_delay("gpu-03", FLEET, "2", "12.5") == 12.5
    refused = p2p_plan.check_settings("p2p", "never", "0", "1e3", "6881", "two", "-1")
    assert [p.split(" must ")[0] for p in refused] == [
        "model_fetch_p2p_web_seed_hosts", "model_fetch_p2p_download_rate"], refused
    with pytest.raises(filters.AnsibleFilterError) as err:
        filters.p2p_web_seed_delay("gpu-02", FLEET, "two", 30)
    assert str(err.value).rstrip(".") == refused[0]
    assert p2p_plan.check_settings("p2p", "never", 0, 0, 6881, 2, "0")[0].startswith(
        "model_fetch_p2p_web_seed_fallback must be a number of seconds above 0")


def test_gate_opens_only_after_peers_stall():
    gate = p2p_swarm.WebSeedGate(30, start=100.0)
    assert not gate.due(129.9)
    gate.peer_block(120.0)  # a peer delivered: the wait starts again
    assert not gate.due(149.9) and gate.opened_at is None
    assert gate.due(150.0) and gate.opened_at == 150.0
    assert not gate.due(200.0)  # once


def test_gate_of_a_first_host_is_open_from_the_start():
    gate = p2p_swarm.WebSeedGate(0, start=5.0)
    assert gate.opened_at == 5.0 and not gate.due(5.0) and not gate.due(99.0)


def test_peer_job_carries_the_policy_and_refuses_a_bad_one():
    assert p2p_plan.peer_job(_opts(web_seed_delay=30.0), "org/m", ENDPOINT)["web_seed_delay"] == 30.0
    assert p2p_plan.peer_job(_opts(), "org/m", ENDPOINT)["web_seed_delay"] == 0
    for bad in (-1, True, "30", 86401):
        with pytest.raises(p2p.P2PError, match="web_seed_delay"):
            p2p_plan.peer_job(_opts(web_seed_delay=bad), "org/m", ENDPOINT)


def test_summary_says_when_the_web_seed_was_added():
    events = [{"event": "placed", "path": "a"}]
    assert p2p.summary(events, ["a"])["web_seed_after"] is None
    events.append({"event": "web_seed_added", "after": 31.2, "why": "..."})
    assert p2p.summary(events, ["a"])["web_seed_after"] == 31.2


def test_report_names_the_policy_applied(tmp_path, fake_seeder):
    runner = p2p.Runner({})
    runner.result = dict(p2p.summary([{"event": "web_seed_added", "after": 30.5}], []),
                         events=[], bytes_by_source={"peers": 5, "web_seed": 7})
    job = dict(p2p_plan.peer_job(_opts(web_seed_delay=30), "org/m", ENDPOINT), dest=str(tmp_path))
    result = {"path": str(tmp_path), "commit": "c" * 40, "files": []}
    out, _changed = p2p_seeder.report(result, job, runner, str(tmp_path), "never")
    assert (out["web_seed_delay"], out["web_seed_after"], out["bytes_from_web_seed"]) == (30, 30.5, 7)
    out, _changed = p2p_seeder.report(result, dict(job, web_seed=None), runner, str(tmp_path), "never")
    assert out["web_seed_delay"] is None


def test_module_refuses_a_bad_web_seed_delay(stub, tmp_path, monkeypatch):
    res, failed = run_module(hf_model.main, _margs(stub, tmp_path / "m" / "t", torrent="/t",
                                                   web_seed_delay=-1), monkeypatch)
    assert failed and "p2p_web_seed_delay" in res["msg"]
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------- the partial area's end

def _partial(dest, commit="c" * 40):
    area = os.path.join(p2p.partial_root(dest), commit)
    os.makedirs(area)
    with open(os.path.join(area, "model.safetensors"), "wb") as fh:
        fh.write(b"x")
    return area


def test_stopping_the_seeder_removes_its_partial_area(tmp_path, fake_seeder):
    dest, store = str(tmp_path / "dest"), str(tmp_path / "store")
    os.makedirs(store)
    area = _partial(dest)
    other = _partial(dest, "d" * 40)  # another commit's area stays
    changed, state = p2p_seeder.ensure_seeder(store, dict(_job(), dest=dest), "until_rollout_end")
    try:
        assert changed and os.path.isdir(area)  # seeding from it
        assert p2p_seeder.stop_seeder(store)["pid"] == state["pid"]
        assert not os.path.exists(area) and os.path.isdir(other)
    finally:
        if p2p_seeder._proc_start(state["pid"]) == state["start"]:
            os.kill(state["pid"], 9)


def test_no_seeder_no_partial_area(tmp_path, fake_seeder):
    dest = str(tmp_path / "dest")
    _partial(dest)
    assert p2p_seeder.ensure_seeder(str(tmp_path), dict(_job(), dest=dest), "never") == (False, None)
    assert not os.path.exists(p2p.partial_root(dest))  # the root goes too, left empty
