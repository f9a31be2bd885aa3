"""Gateway logic (plugins/module_utils/gpufleet/gateway.py) and the vllm_gateway_plan /
vllm_gateway_stats modules' main().

`show stat` texts under tests/fixtures/haproxy/ are REAL answers of Debian 12's haproxy
2.6.12 captured on this machine (SOURCES.md says how).

Stand-in: vllm_gateway_stats' main() reads a Unix socket served by a thread here that
answers every connection with one of those captured `show stat` texts, as HAProxy's
stats socket does (one command per connection, then it closes).
"""
import json
import pathlib
import socket
import threading

import pytest

from gpufleet import gateway, upgrade
from helpers import run_module

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "haproxy"
STAT = (FIXTURES / "show-stat-2.6.12.csv").read_text()
STAT_LATER = (FIXTURES / "show-stat-2.6.12-later.csv").read_text()


def _entry(host, port, model, address="127.0.0.1", **labels):
    base = {"host": host, "container": f"vllm-{host}", "model": model,
            "served_model_name": model, "runner": "generate", "port": str(port)}
    base.update(labels)
    return {"targets": [f"{address}:{port}"], "labels": base}


FLEET = [_entry("lab-h200", 18000, "HuggingFaceTB/SmolLM2-135M-Instruct"),
         _entry("lab-a100", 18100, "sentence-transformers/all-MiniLM-L6-v2", runner="pooling"),
         _entry("lab-b200", 18000, "HuggingFaceTB/SmolLM2-135M-Instruct", address="10.0.0.7")]
FRONTENDS = [{"served_model_name": "HuggingFaceTB/SmolLM2-135M-Instruct", "port": 9000},
             {"served_model_name": "sentence-transformers/all-MiniLM-L6-v2", "port": 9001}]


# ----------------------------------------------------------------- names
@pytest.mark.parametrize("host, port, name", [
    ("lab-h200", 18000, "lab-h200_18000"),
    ("gpu01.dc1.example.com", "8000", "gpu01.dc1.example.com_8000"),
    ("gpu 01/rack#3", 8001, "gpu_01_rack_3_8001"),
    ("10.0.0.7", 8000, "10.0.0.7_8000"),
])
def test_server_name_is_host_and_port_in_haproxy_chars(host, port, name):
    assert gateway.server_name(host, port) == name
    assert gateway.NAME_RE.match(name)
    assert gateway.host_of_server(name) == gateway.safe_name(host)


@pytest.mark.parametrize("port", [0, 65536, -1])
def test_server_name_refuses_a_non_port(port):
    with pytest.raises(gateway.GatewayError, match="not a TCP port"):
        gateway.server_name("h", port)


@pytest.mark.parametrize("name, host", [
    ("lab-h200_18000", "lab-h200"), ("lab_1_18000", "lab_1"), ("lab-h200", None),
    ("_18000", None), ("lab_x", None)])
def test_host_of_server(name, host):
    assert gateway.host_of_server(name) == host


def test_backend_name():
    assert gateway.backend_name("HuggingFaceTB/SmolLM2-135M-Instruct") == \
        "vllm_HuggingFaceTB_SmolLM2-135M-Instruct"


# ----------------------------------------------------------------- instances
def test_load_instances_reads_the_vllm_server_format():
    instances = gateway.load_instances(json.dumps(FLEET))
    assert instances[0] == {
        "host": "lab-h200", "address": "127.0.0.1", "port": 18000, "target": "127.0.0.1:18000",
        "served_model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "runner": "generate",
        "container": "vllm-lab-h200", "scheme": "http", "server": "lab-h200_18000"}
    assert gateway.load_instances(FLEET) == instances  # parsed list or JSON text


def test_load_instances_ipv6_target():
    [instance] = gateway.load_instances([_entry("h", 8000, "m", address="[fd00::7]")])
    assert instance["address"] == "fd00::7"


@pytest.mark.parametrize("data, message", [
    ("", "is empty"),
    ("  \n", "is empty"),
    ("{not json", "is not JSON"),
    ('{"targets": []}', "must be a JSON list"),
    (["x"], "entry 0 is not an object"),
    ([{"targets": [], "labels": {}}], "entry 0: targets must be a non-empty list"),
    ([{"targets": ["127.0.0.1:1"]}], "entry 0: labels must be an object"),
    ([{"targets": ["127.0.0.1:18000"], "labels": {"host": "h", "port": "18000"}}],
     r"entry 0 \(127.0.0.1:18000\) has no label served_model_name"),
    ([_entry("h", 18000, "m")] + [{"targets": ["127.0.0.1"], "labels": _entry("h", 1, "m")["labels"]}],
     "entry 1: target '127.0.0.1' is not ADDRESS:PORT"),
    ([{"targets": ["127.0.0.1:18001"], "labels": _entry("h", 18000, "m")["labels"]}],
     "label port 18000 differs from the target's port"),
    ([_entry("h", 70000, "m")], "is not ADDRESS:PORT"),
])
def test_load_instances_refuses_malformed_entries(data, message):
    with pytest.raises(gateway.GatewayError, match=message):
        gateway.load_instances(data if isinstance(data, str) else json.dumps(data))


# ----------------------------------------------------------------- plan
def test_plan_groups_instances_by_served_model_name():
    plan = gateway.plan_gateway(gateway.load_instances(FLEET), FRONTENDS, 8405)
    chat, embed = plan["frontends"]
    assert chat["name"] == "vllm_HuggingFaceTB_SmolLM2-135M-Instruct"
    assert chat["port"] == 9000
    assert [s["name"] for s in chat["servers"]] == ["lab-b200_18000", "lab-h200_18000"]
    assert [s["endpoint"] for s in chat["servers"]] == ["10.0.0.7:18000", "127.0.0.1:18000"]
    assert [s["name"] for s in embed["servers"]] == ["lab-a100_18100"]
    assert plan["unserved"] == []


def test_plan_is_stable_whatever_the_file_order():
    one = gateway.plan_gateway(gateway.load_instances(FLEET), FRONTENDS, 8405)
    other = gateway.plan_gateway(gateway.load_instances(FLEET[::-1]), FRONTENDS, 8405)
    assert one == other


def test_plan_lists_models_no_frontend_takes():
    plan = gateway.plan_gateway(gateway.load_instances(FLEET), FRONTENDS[:1], 8405)
    assert plan["unserved"] == ["sentence-transformers/all-MiniLM-L6-v2"]


@pytest.mark.parametrize("frontends, metrics_port, message", [
    ([], 8405, "vllm_gateway_frontends is empty"),
    (FRONTENDS + [{"served_model_name": "Qwen/Qwen3-8B", "port": 9002}], 8405,
     r"no instance serves Qwen/Qwen3-8B \(vllm_gateway_frontends\[2\]\): the instances file "
     "lists HuggingFaceTB/SmolLM2-135M-Instruct, sentence-transformers/all-MiniLM-L6-v2; "
     "serve it with vllm_server first or remove the frontend"),
    ([FRONTENDS[0], dict(FRONTENDS[1], port=9000)], 8405,
     "port 9000 of the frontend for sentence-transformers/all-MiniLM-L6-v2 is already taken "
     "by the frontend for HuggingFaceTB/SmolLM2-135M-Instruct"),
    ([dict(FRONTENDS[0], port=8405)], 8405,
     "port 8405 of the frontend for HuggingFaceTB/SmolLM2-135M-Instruct is already taken by "
     r"the metrics/stats frontend \(vllm_gateway_metrics_port\)"),
    ([FRONTENDS[0], dict(FRONTENDS[0], port=9005)], 8405, "is listed twice"),
    ([{"port": 9000}], 8405, r"vllm_gateway_frontends\[0\] needs served_model_name and port"),
    ([dict(FRONTENDS[0], port="http")], 8405, "'http' is not a TCP port"),
    ([dict(FRONTENDS[0], port=0)], 8405, "0 is not a TCP port"),
    (FRONTENDS, 70000, "vllm_gateway_metrics_port 70000 is not a TCP port: use a whole number 1-65535"),
])
def test_plan_refuses(frontends, metrics_port, message):
    with pytest.raises(gateway.GatewayError, match=message):
        gateway.plan_gateway(gateway.load_instances(FLEET), frontends, metrics_port)


def test_plan_refuses_two_models_with_one_haproxy_name():
    fleet = [_entry("a", 1, "org/m"), _entry("b", 2, "org_m")]
    frontends = [{"served_model_name": "org/m", "port": 9000},
                 {"served_model_name": "org_m", "port": 9001}]
    with pytest.raises(gateway.GatewayError, match="org_m and org/m both make the HAProxy "
                       "name vllm_org_m"):
        gateway.plan_gateway(gateway.load_instances(fleet), frontends, 8405)


def test_plan_refuses_one_instance_listed_twice():
    fleet = [_entry("a", 18000, "m"), _entry("a", 18000, "m", address="10.0.0.1")]
    with pytest.raises(gateway.GatewayError, match="both make server a_18000"):
        gateway.plan_gateway(gateway.load_instances(fleet),
                             [{"served_model_name": "m", "port": 9000}], 8405)


# ----------------------------------------------------------------- show stat (real)
def test_parse_show_stat_real_capture():
    rows = gateway.parse_show_stat(STAT)
    assert [(r["pxname"], r["svname"]) for r in rows][:3] == [
        ("stats", "FRONTEND"), ("vllm_molecule_tiny", "FRONTEND"), ("vllm_molecule_embed", "FRONTEND")]
    assert len(rows) == 10
    assert rows[0]["eresp"] is None  # empty for a frontend


def test_servers_of_the_real_capture():
    by_name = {(s["backend"], s["server"]): s for s in gateway.servers(gateway.parse_show_stat(STAT))}
    assert len(by_name) == 5
    assert by_name["vllm_molecule_tiny", "gpu-a_28181"] == {
        "backend": "vllm_molecule_tiny", "server": "gpu-a_28181", "host": "gpu-a", "status": "UP",
        "scur": 0, "hrsp_5xx": 1, "eresp": 0, "wretr": 0, "wredis": 0, "chkfail": 0}
    assert by_name["vllm_molecule_tiny", "gpu-b_28182"]["status"] == "MAINT"
    assert by_name["vllm_molecule_tiny", "gpu-c_28189"]["status"] == "DOWN"
    assert by_name["vllm_molecule_tiny", "gpu-c_28189"]["chkfail"] == 1
    assert by_name["vllm_molecule_embed", "gpu-a_28183"]["status"] == "DRAIN"


def test_backends_count_servers_up():
    assert gateway.backends(gateway.parse_show_stat(STAT)) == {
        "vllm_molecule_tiny": {"status": "UP", "scur": 0, "servers": 3, "up": 1},
        "vllm_molecule_embed": {"status": "UP", "scur": 0, "servers": 2, "up": 1}}


@pytest.mark.parametrize("host, servers, others_up", [
    ("gpu-a", ["gpu-a_28181", "gpu-a_28183"], {"vllm_molecule_tiny": 0, "vllm_molecule_embed": 1}),
    ("gpu-b", ["gpu-b_28182", "gpu-b_28184"], {"vllm_molecule_tiny": 1, "vllm_molecule_embed": 0}),
    ("gpu-c", ["gpu-c_28189"], {"vllm_molecule_tiny": 1}),
    ("gpu", [], {}),  # a prefix of a host is not that host
])
def test_host_view(host, servers, others_up):
    view = gateway.host_view(gateway.parse_show_stat(STAT), host)
    assert [s["server"] for s in view["servers"]] == servers
    assert view["others_up"] == others_up


@pytest.mark.parametrize("text", ["", "Unknown command.\n", "pxname,svname\n"])
def test_parse_show_stat_refuses_other_answers(text):
    with pytest.raises(gateway.GatewayError, match="not a show stat answer"):
        gateway.parse_show_stat(text)


@pytest.mark.parametrize("status, bad", [
    ("UP", False), ("DRAIN", False), ("MAINT", False), ("MAINT (via b/s)", False),
    ("UP 1/2", False), ("UP 2/3", False),
    ("DOWN", True), ("DOWN 1/3", True), ("NOLB", True), ("no check", True), ("", True)])
def test_bad_status(status, bad):
    assert gateway._bad_status(status) is bad


def test_watch_a_server_leaving_maintenance_is_not_a_failure():
    """Real captures (lab-gw, HAProxy 2.6.12): a server set from MAINT to ready shows
    "UP 1/2" with no failed check until its next check passes. The soak window right
    after re-enabling a host sees exactly this; it must pass (it failed the image-change
    rollout here once, and its rollback then dropped 8 requests)."""
    answers = iter([(FIXTURES / "show-stat-2.6.12-left-maint.csv").read_text(),
                    (FIXTURES / "show-stat-2.6.12-left-maint-later.csv").read_text()])
    result = gateway.watch(lambda: next(answers), 1, host="lab-a100", sleep=lambda s: None)
    assert result["bad_statuses"] == []
    assert [d["chkfail"] for d in result["deltas"]] == [0]
    assert upgrade.soak_verdict(result["deltas"], result["bad_statuses"])["ok"]
    # a failed check while UP is still caught, by its counter
    failed = [dict(result["deltas"][0], chkfail=1)]
    verdict = upgrade.soak_verdict(failed, [])
    assert not verdict["ok"] and "1 failed health checks" in verdict["reasons"][0]


def test_watch_deltas_between_two_real_captures():
    answers = iter([STAT, STAT_LATER])
    slept = []
    result = gateway.watch(lambda: next(answers), 1, host="gpu-a", sleep=slept.append)
    assert slept == [1.0]
    assert result["samples"] == 2
    assert result["bad_statuses"] == []
    assert result["deltas"] == [
        {"backend": "vllm_molecule_embed", "server": "gpu-a_28183", "scur_max": 0,
         "hrsp_5xx": 0, "eresp": 0, "wretr": 0, "wredis": 0, "chkfail": 0},
        {"backend": "vllm_molecule_tiny", "server": "gpu-a_28181", "scur_max": 0,
         "hrsp_5xx": 4, "eresp": 0, "wretr": 0, "wredis": 0, "chkfail": 0}]


def test_watch_reports_a_down_server_of_the_host():
    answers = iter([STAT] * 3)
    result = gateway.watch(lambda: next(answers), 2, host="gpu-c", sleep=lambda s: None)
    assert result["samples"] == 3
    assert result["bad_statuses"] == [
        {"backend": "vllm_molecule_tiny", "server": "gpu-c_28189", "status": "DOWN", "at": at}
        for at in (0.0, 1.0, 2.0)]


# ----------------------------------------------------------------- modules' main()
def test_plan_module(monkeypatch):
    import vllm_gateway_plan

    result, failed = run_module(vllm_gateway_plan.main, {
        "instances": json.dumps(FLEET), "frontends": FRONTENDS, "metrics_port": 8405},
        monkeypatch, check_mode=True)
    assert not failed and not result["changed"]
    assert result["instances"] == 3
    assert [f["name"] for f in result["frontends"]] == [
        "vllm_HuggingFaceTB_SmolLM2-135M-Instruct", "vllm_sentence-transformers_all-MiniLM-L6-v2"]


def test_plan_module_fails_with_the_reason(monkeypatch):
    import vllm_gateway_plan

    result, failed = run_module(vllm_gateway_plan.main, {
        "instances": FLEET, "frontends": [{"served_model_name": "absent/model", "port": 9000}],
        "metrics_port": 8405}, monkeypatch)
    assert failed
    assert result["msg"].startswith("no instance serves absent/model")
    assert result["msg"].endswith("Nothing was changed.")


@pytest.fixture
def stats_socket(tmp_path):
    """A stand-in for HAProxy's stats socket: each connection gets the next captured
    `show stat` text (the last one repeats), then the socket closes."""
    path = str(tmp_path / "admin.sock")
    answers = [STAT]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    commands = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                commands.append(conn.recv(100))
                conn.sendall((answers.pop(0) if len(answers) > 1 else answers[0]).encode())

    threading.Thread(target=serve, daemon=True).start()
    yield {"path": path, "answers": answers, "commands": commands}
    server.close()


def test_stats_module_reads_the_socket(monkeypatch, stats_socket):
    import vllm_gateway_stats

    result, failed = run_module(vllm_gateway_stats.main, {
        "socket": stats_socket["path"], "server_host": "gpu-a"}, monkeypatch, check_mode=True)
    assert not failed and not result["changed"]
    assert stats_socket["commands"] == [b"show stat\n"]
    assert len(result["servers"]) == 5
    assert [s["server"] for s in result["host_servers"]] == ["gpu-a_28181", "gpu-a_28183"]
    assert result["others_up"] == {"vllm_molecule_tiny": 0, "vllm_molecule_embed": 1}
    assert "deltas" not in result


def test_stats_module_watches(monkeypatch, stats_socket):
    import vllm_gateway_stats

    stats_socket["answers"][:] = [STAT, STAT_LATER]
    result, failed = run_module(vllm_gateway_stats.main, {
        "socket": stats_socket["path"], "server_host": "gpu-a", "watch_seconds": 1,
        "interval": 0.1}, monkeypatch)
    assert not failed
    assert result["samples"] == 11
    assert sum(d["hrsp_5xx"] for d in result["deltas"]) == 4
    assert [s["status"] for s in result["host_servers"]] == ["UP", "UP"]


def test_stats_module_without_haproxy(monkeypatch, tmp_path):
    import vllm_gateway_stats

    result, failed = run_module(vllm_gateway_stats.main, {"socket": str(tmp_path / "none.sock")},
                                monkeypatch)
    assert failed
    assert "cannot read HAProxy's stats socket" in result["msg"]
    assert "vllm_gateway_stats_socket" in result["msg"]
