"""Planning and gate logic of playbooks/upgrade.yml (plugins/module_utils/gpufleet/upgrade.py),
and the modules vllm_probe, vllm_record and vllm_instances around it."""
import http.server
import json
import threading

import pytest
import requests

from gpufleet import upgrade
from helpers import run_module


# ----------------------------------------------------------------- batches
def test_canary_first_then_at_most_half_of_each_model():
    hosts = {f"h{i}": ["chat"] for i in range(1, 7)}
    plan = upgrade.plan_batches(hosts, canary=1, max_fraction=0.5)
    assert plan["batches"][0] == ["h1"]
    assert plan["sizes"] == [1, 3, 2]
    assert all(len(b) <= 3 for b in plan["batches"])


def test_two_instances_of_a_model_never_leave_together():
    hosts = {"a": ["chat"], "b": ["chat"], "c": ["embed"], "d": ["embed"], "e": []}
    plan = upgrade.plan_batches(hosts, canary=1, max_fraction=0.5)
    for batch in plan["batches"]:
        for model in ("chat", "embed"):
            assert sum(model in hosts[h] for h in batch) <= 1, batch
    assert sorted(h for b in plan["batches"] for h in b) == sorted(hosts)
    assert plan["batches"] == [["a"], ["b", "c", "e"], ["d"]]


def test_batch_size_caps_later_batches_and_single_instance_models_still_go():
    hosts = {"a": ["solo"], "b": [], "c": [], "d": []}
    plan = upgrade.plan_batches(hosts, canary=1, max_fraction=0.25, batch_size=2)
    assert plan["batches"] == [["a"], ["b", "c"], ["d"]]


@pytest.mark.parametrize("kw, what", [
    ({"canary": 0}, "upgrade_canary_hosts"), ({"canary": True}, "upgrade_canary_hosts"),
    ({"max_fraction": 0}, "upgrade_max_unavailable_fraction"),
    ({"max_fraction": 1.5}, "upgrade_max_unavailable_fraction"),
    ({"max_fraction": "x"}, "upgrade_max_unavailable_fraction"),
    ({"batch_size": -1}, "upgrade_batch_size"),
])
def test_bad_batch_settings_name_the_variable(kw, what):
    with pytest.raises(upgrade.UpgradeError, match=what):
        upgrade.plan_batches({"a": []}, **kw)


@pytest.mark.parametrize("installed, branch, version, change", [
    ("580.95.05", "580", "", False), ("580.95.05", "590", "", True),
    ("580.95.05", "580", "580.65.06", True), ("580.65.06", "580", "580.65.06", False),
    ("", "580", "", True),
])
def test_driver_change(installed, branch, version, change):
    assert upgrade.driver_change(installed, branch, version) is change


# ----------------------------------------------------------------- capacity gate
def _srv(backend, host, status="UP"):
    return {"backend": backend, "server": f"{host}_1", "host": host, "status": status}


def test_capacity_needs_another_server_up_per_model():
    servers = [_srv("chat", "a"), _srv("chat", "b"), _srv("embed", "a"), _srv("embed", "c", "DOWN")]
    verdict = upgrade.capacity_verdict(servers, "a")
    assert not verdict["ok"]
    assert any("embed: a is its last server in service" in r for r in verdict["reasons"])
    assert verdict["backends"]["chat"] == {"others_up": 1, "others": 1}
    assert upgrade.capacity_verdict(servers, "a", allow_downtime=True)["ok"]
    assert upgrade.capacity_verdict(servers, "b")["ok"]
    # a server already in maintenance does not count as capacity
    assert not upgrade.capacity_verdict([_srv("chat", "a"), _srv("chat", "b", "MAINT")], "a")["ok"]


def test_capacity_with_benchmark_figures():
    servers = [_srv("chat", "a"), _srv("chat", "b")]
    low = upgrade.capacity_verdict(servers, "a", knee_rps={"chat": 3.0}, load_rps={"chat": 5.0})
    assert not low["ok"] and "knee capacity 3.0 req/s is below the load" in " ".join(low["reasons"])
    assert upgrade.capacity_verdict(servers, "a", knee_rps={"chat": 9.0},
                                    load_rps={"chat": 5.0})["ok"]


# ----------------------------------------------------------------- probe gate
def test_percentile_nearest_rank():
    assert upgrade.percentile([5, 1, 3, 2, 4], 50) == 3
    assert upgrade.percentile([5, 1, 3, 2, 4], 95) == 5
    assert upgrade.percentile([7], 99) == 7


@pytest.mark.parametrize("after, ok", [
    ({"count": 5, "errors": 0, "error_rate": 0.0, "p95_ms": 150.0}, True),
    ({"count": 5, "errors": 0, "error_rate": 0.0, "p95_ms": 210.0}, True),    # 2.1x, +110 ms
    ({"count": 5, "errors": 0, "error_rate": 0.0, "p95_ms": 900.0}, False),   # 9x and +800
    ({"count": 5, "errors": 1, "error_rate": 0.2, "p95_ms": 100.0,
      "error_samples": ["503"]}, False),
    ({"count": 5, "errors": 5, "error_rate": 1.0, "error_samples": ["refused"]}, False),
])
def test_probe_verdict_thresholds(after, ok):
    before = {"count": 5, "errors": 0, "error_rate": 0.0, "p95_ms": 100.0}
    assert upgrade.probe_verdict(before, after, max_latency_ratio=2.0,
                                 max_latency_increase_ms=500)["ok"] is ok


def _probes(*figures):
    """probe() for probe_gate: hands out the given figures in turn, counting the calls."""
    calls = []

    def probe():
        calls.append(1)
        return figures[len(calls) - 1]
    return probe, calls


FAST = {"count": 3, "errors": 0, "error_rate": 0.0, "p95_ms": 120.0}
STALLED = {"count": 3, "errors": 0, "error_rate": 0.0, "p95_ms": 1400.0}
BROKEN = {"count": 3, "errors": 3, "error_rate": 1.0, "error_samples": ["503"]}
BEFORE = {"count": 3, "errors": 0, "error_rate": 0.0, "p95_ms": 100.0}


def test_probe_gate_measures_a_slow_probe_again_and_passes_when_it_recovers():
    probe, calls = _probes(STALLED, FAST)
    gate = upgrade.probe_gate(probe, BEFORE, attempts=2)
    assert gate["verdict"]["ok"] and len(calls) == 2 and len(gate["attempts"]) == 2
    assert gate["attempts"][0]["probe"]["p95_ms"] == 1400.0
    assert not gate["attempts"][0]["verdict"]["ok"]


def test_probe_gate_fails_when_every_probe_is_slow_and_names_each():
    probe, calls = _probes(STALLED, dict(STALLED, p95_ms=1600.0))
    gate = upgrade.probe_gate(probe, BEFORE, attempts=2)
    assert not gate["verdict"]["ok"] and len(calls) == 2
    assert "1600.0 ms after vs 100.0 ms before" in gate["summary"]
    assert "probe 2 of 2" in gate["summary"] and "1400.0 ms after" in gate["summary"]


def test_probe_gate_fails_at_once_on_errors_and_with_one_attempt():
    probe, calls = _probes(BROKEN, FAST)
    gate = upgrade.probe_gate(probe, BEFORE, attempts=3)
    assert not gate["verdict"]["ok"] and len(calls) == 1 and "503" in gate["summary"]
    probe, calls = _probes(STALLED, FAST)
    assert not upgrade.probe_gate(probe, BEFORE, attempts=1)["verdict"]["ok"]
    assert len(calls) == 1
    probe, calls = _probes(FAST, STALLED)
    assert upgrade.probe_gate(probe, BEFORE, attempts=2)["verdict"]["ok"] and len(calls) == 1


def test_failure_message_names_the_failed_items_of_a_loop():
    looped = {"msg": "One or more items failed", "results": [
        {"failed": False, "msg": "fine", "_ansible_item_label": "vllm-a"},
        {"failed": True, "msg": "probe gate failed for http://x: p95 latency 900 ms",
         "_ansible_item_label": "vllm-b", "item": {"name": "vllm-b"}},
        {"failed": True, "msg": "second", "item": {"name": "vllm-c"}}]}
    assert upgrade.failure_message(looped) == (
        "vllm-b: probe gate failed for http://x: p95 latency 900 ms; vllm-c: second")
    assert upgrade.failure_message({"msg": "plain"}) == "plain"
    assert upgrade.failure_message({}) == "" and upgrade.failure_message(None) == ""
    assert len(upgrade.failure_message({"msg": "x" * 5000}, limit=100)) == 100


def test_hosts_a_rollout_left_mid_change_come_first():
    hosts = {"a": ["m"], "b": ["m"], "c": ["m"], "d": ["m"]}
    assert upgrade.plan_batches(hosts)["batches"] == [["a"], ["b", "c"], ["d"]]
    assert upgrade.plan_batches(hosts, first=["c"])["batches"] == [["c"], ["a", "b"], ["d"]]
    assert upgrade.plan_batches(hosts, first=["d", "b"])["batches"] == [["b"], ["d", "a"], ["c"]]


def test_record_problem_says_why_a_rollback_could_not_run():
    assert "has no last-good record at /r.json" in upgrade.record_problem({}, False, "/r.json")
    record = {"image_ref": "vllm/vllm-openai:v0.32.0", "image_id": "sha256:abc"}
    assert "vllm/vllm-openai:v0.32.0 (sha256:abc), which is no longer on the host" in \
        upgrade.record_problem(record, False)
    assert upgrade.record_problem(record, True) == ""


def test_stop_message_keeps_a_gate_message_and_names_any_other_task():
    gate = {"msg": "UPGRADE STOPPED at h2, nothing was changed: the capacity gate refused it"}
    assert upgrade.stop_message(gate, "h2", "Capacity gate") == gate["msg"]
    other = {"msg": "template error while templating"}
    assert upgrade.stop_message(other, "h3", "List what changes on this host") == (
        'UPGRADE STOPPED at h3: "List what changes on this host" failed: template error while templating')
    assert upgrade.stop_message(None, "h4").startswith('UPGRADE STOPPED at h4: "unknown" failed')


def test_soak_verdict():
    quiet = {"h_1": {"hrsp_5xx": 0, "wretr": 0, "chkfail": 0}}
    assert upgrade.soak_verdict(quiet, {})["ok"]
    assert not upgrade.soak_verdict({"h_1": {"hrsp_5xx": 2}}, {})["ok"]
    assert upgrade.soak_verdict({"h_1": {"hrsp_5xx": 2}}, {}, max_5xx=2)["ok"]
    bad = upgrade.soak_verdict(quiet, {"h_1": ["DOWN"]})
    assert not bad["ok"] and "status DOWN" in bad["reasons"][0]
    # the shape vllm_gateway_stats returns
    listed = upgrade.soak_verdict([{"backend": "chat", "server": "h_1", "hrsp_5xx": 0, "wretr": 3}],
                                  [{"backend": "chat", "server": "h_1", "status": "DOWN 1/2", "at": 3}])
    assert not listed["ok"] and listed["reasons"] == [
        "chat/h_1: 3 retries during the soak window (limit 0)",
        "chat/h_1: status DOWN 1/2 during the soak window"]


def test_parse_metrics_and_idle_counts():
    text = ('# HELP vllm:num_requests_running x\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n')
    assert upgrade.idle_counts(upgrade.parse_metrics(text)) == (3, 1)
    assert upgrade.idle_counts(upgrade.parse_metrics("other 1\n")) is None


# ----------------------------------------------------------------- record and rollback
INSTANCES = [{"name": "vllm-m", "model": "org/m", "revision": "abc123", "settings_hash": "s1",
              "args_hash": "a1", "mounts": [{"source": "/srv/models/org/m", "target": "/models/org-m"}]}]
INPUTS = {"vllm_server_image": "vllm/vllm-openai:v0.20.0", "vllm_server_vllm_version": "0.32.0",
          "vllm_server_models": [{"name": "org/m", "path": "/srv/models/org/m"}],
          "vllm_server_port": 8000}


def test_record_keeps_the_image_by_id_and_model_commits():
    record = upgrade.build_record(INPUTS, "sha256:feed", INSTANCES, "580.95.05")
    assert record["inputs"]["vllm_server_image"] == "sha256:feed"
    assert record["image_ref"] == "vllm/vllm-openai:v0.20.0"
    assert record["models"] == [("/srv/models/org/m", "abc123")]
    # what vllm_server's preflight reads to skip an argument check proven on this host
    assert [i["args_hash"] for i in record["instances"]] == ["a1"]
    with pytest.raises(upgrade.UpgradeError, match="vllm_server_port"):
        upgrade.build_record({k: v for k, v in INPUTS.items() if k != "vllm_server_port"},
                             "sha256:feed", INSTANCES)


def test_rollback_vars_pin_image_models_and_driver():
    record = json.loads(json.dumps(upgrade.build_record(INPUTS, "sha256:feed", INSTANCES,
                                                        "580.95.05")))  # as read from disk
    fetch = [{"repo_id": "org/m", "revision": "main"}, {"repo_id": "org/other"}]
    out = upgrade.rollback_vars(record, fetch, "/srv/models", driver_changed=True)
    assert out["vllm_server_image"] == "sha256:feed" and out["vllm_server_image_pull"] == "never"
    assert out["model_fetch_models"] == [{"repo_id": "org/m", "revision": "abc123"},
                                         {"repo_id": "org/other"}]
    assert (out["nvidia_driver_branch"], out["nvidia_driver_version"]) == ("580", "580.95.05")
    assert "nvidia_driver_branch" not in upgrade.rollback_vars(record, fetch, "/srv/models")
    with pytest.raises(upgrade.UpgradeError, match="run site.yml once"):
        upgrade.rollback_vars({}, fetch, "/srv/models")


def test_rollback_fetches_only_the_folders_the_upgrade_changed():
    """A folder that still holds its recorded commit is not fetched again (the failed
    upgrade did not change it): no request to a mirror that may no longer serve it."""
    record = upgrade.build_record(INPUTS, "sha256:feed", INSTANCES)
    fetch = [{"repo_id": "org/m", "revision": "main"}, {"repo_id": "org/other"}]
    same = [{"mounts": [{"source": "/srv/models/org/m"}], "revision": "abc123"}]
    moved = [{"mounts": [{"source": "/srv/models/org/m"}], "revision": "def456"}]
    assert upgrade.rollback_vars(record, fetch, "/srv/models", False, same)[
        "model_fetch_models"] == [{"repo_id": "org/other"}]
    assert upgrade.rollback_vars(record, fetch, "/srv/models", False, moved)[
        "model_fetch_models"] == [{"repo_id": "org/m", "revision": "abc123"}, {"repo_id": "org/other"}]


def test_vllm_record_module_writes_reads_and_is_idempotent(tmp_path, monkeypatch):
    import vllm_record
    path = str(tmp_path / "sub" / "rec.json")
    rec = upgrade.build_record(INPUTS, "sha256:feed", INSTANCES)
    result, failed = run_module(vllm_record.main, {"path": path, "record": rec}, monkeypatch,
                                check_mode=True)
    assert not failed and result["changed"] and not (tmp_path / "sub").exists()
    result, _ = run_module(vllm_record.main, {"path": path, "record": rec}, monkeypatch)
    assert result["changed"] and oct((tmp_path / "sub" / "rec.json").stat().st_mode)[-3:] == "600"
    again, _ = run_module(vllm_record.main, {"path": path, "record": rec}, monkeypatch)
    assert not again["changed"]
    read, _ = run_module(vllm_record.main, {"path": path, "state": "read"}, monkeypatch)
    assert read["record"]["image_id"] == "sha256:feed" and not read["changed"]
    (tmp_path / "sub" / "rec.json").write_text("{broken")
    bad, failed = run_module(vllm_record.main, {"path": path, "state": "read"}, monkeypatch)
    assert failed and "cannot be read" in bad["msg"]


def _plan(host, ports):
    return {"host": host, "instances": [{"file_sd": {"targets": [f"127.0.0.1:{p}"], "labels": {
        "host": host, "container": f"vllm-{host}-{p}", "model": "m", "served_model_name": "m",
        "runner": "generate", "port": str(p)}}} for p in ports]}


def test_vllm_instances_refuses_a_list_others_may_write(tmp_path, monkeypatch):
    """#32 item 6: the gateway and Prometheus are built from it; control: 0644 passes."""
    import vllm_instances
    path = tmp_path / "instances.json"
    path.write_text("[]")
    path.chmod(0o666)
    result, failed = run_module(vllm_instances.main, {"path": str(path), "plans": [_plan("a", [1])]},
                                monkeypatch)
    assert failed and str(path) in result["msg"] and "write" in result["msg"]
    assert path.read_text() == "[]"
    path.chmod(0o644)
    result, failed = run_module(vllm_instances.main, {"path": str(path), "plans": [_plan("a", [1])]},
                                monkeypatch)
    assert not failed and result["changed"]


def test_vllm_instances_merges_and_changes_only_when_the_fleet_does(tmp_path, monkeypatch):
    import vllm_instances
    path = str(tmp_path / "instances.json")
    first, _ = run_module(vllm_instances.main, {"path": path, "plans": [
        _plan("a", [1]), _plan("b", [2])]}, monkeypatch)
    assert first["changed"] and len(first["instances"]) == 2
    # a --limit run of host a (or b failed before planning): b keeps its entry
    limited, _ = run_module(vllm_instances.main, {"path": path, "plans": [_plan("a", [3])]},
                            monkeypatch)
    assert [e["labels"]["port"] for e in limited["instances"]] == ["3", "2"]
    # planned with nothing to serve: its entries go
    gone, _ = run_module(vllm_instances.main, {"path": path, "plans": [_plan("b", [])]},
                         monkeypatch)
    assert [e["labels"]["host"] for e in gone["instances"]] == ["a"]
    run_module(vllm_instances.main, {"path": path, "plans": [_plan("b", [2])]}, monkeypatch)
    same, _ = run_module(vllm_instances.main, {"path": path, "plans": [_plan("a", [3])]},
                         monkeypatch)
    assert not same["changed"]
    assert json.loads(open(path).read()) == limited["instances"]
    bad, failed = run_module(vllm_instances.main, {"path": path, "plans": [{"instances": []}]},
                             monkeypatch)
    assert failed and "needs `host`" in bad["msg"]


# ----------------------------------------------------------------- vllm_probe
KEY = "probe-key-0123456789"


@pytest.fixture()
def fake_vllm():
    """A loopback HTTP server answering like vLLM: /metrics, /v1/completions."""
    state = {"running": 2, "fail": False, "metrics_polls": 0, "auth": set()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            state["metrics_polls"] += 1
            if state["metrics_polls"] >= 3:
                state["running"] = 0
            body = (f'vllm:num_requests_running{{model_name="m"}} {state["running"]}.0\n'
                    'vllm:num_requests_waiting{model_name="m"} 0.0\n').encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            state["auth"].add(self.headers.get("Authorization"))
            self.rfile.read(int(self.headers["Content-Length"]))
            code, body = (503, b'{"error": "x"}') if state["fail"] else (
                200, json.dumps({"choices": [{"text": "ok"}]}).encode())
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()


def test_vllm_probe_waits_idle_probes_and_gates(fake_vllm, monkeypatch):
    import vllm_probe
    url, state = fake_vllm
    args = {"url": url, "api_key": KEY, "served_model_name": "m", "wait_idle": True,
            "requests": 4, "idle_timeout": 30}
    result, failed = run_module(vllm_probe.main, args, monkeypatch)
    assert not failed and result["idle"]["polls"] == 3 and result["probe"]["count"] == 4
    assert result["probe"]["errors"] == 0 and state["auth"] == {f"Bearer {KEY}"}
    assert KEY not in json.dumps(result)
    state["fail"] = True
    gated, failed = run_module(vllm_probe.main, {"url": url, "api_key": KEY,
                                                 "served_model_name": "m", "requests": 3,
                                                 "baseline": result["probe"]}, monkeypatch)
    assert failed and "probe gate failed" in gated["msg"] and gated["probe"]["errors"] == 3
    assert len(gated["attempts"]) == 1  # an error fails at once: no second probe
    state["fail"] = False
    slow = dict(result["probe"], p95_ms=0.001, p50_ms=0.001)  # nothing is that fast
    gated, failed = run_module(vllm_probe.main, {"url": url, "api_key": KEY,
                                                 "served_model_name": "m", "requests": 2,
                                                 "baseline": slow, "max_latency_ratio": 1.0,
                                                 "max_latency_increase_ms": 0,
                                                 "attempts": 3}, monkeypatch)
    assert failed and len(gated["attempts"]) == 3 and "probe 3 of 3" in gated["msg"]


def test_vllm_probe_idle_timeout_and_bad_input(monkeypatch):
    import vllm_probe
    result, failed = run_module(vllm_probe.main, {"url": "http://127.0.0.1:9", "wait_idle": True,
                                                  "idle_timeout": 1}, monkeypatch)
    assert failed and "did not become idle within 1s" in result["msg"]
    result, failed = run_module(vllm_probe.main, {"url": "http://x", "max_error_rate": 2.0},
                                monkeypatch)
    assert failed and "max_error_rate must be a number from 0 to 1, not 2.0" in result["msg"]


def test_run_probe_counts_transport_errors():
    figures = upgrade.run_probe(requests.Session(), "http://127.0.0.1:9", "", "m", count=2,
                                timeout=2)
    assert figures["errors"] == 2 and figures["error_rate"] == 1.0 and "p95_ms" not in figures
