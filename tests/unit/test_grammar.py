"""plugins/module_utils/gpufleet/grammar.py: one grammar per input that reaches a generated
configuration (issue #32 item 3), at every boundary that takes it: serve.plan and
registry_entry (the fleet's list of serving instances), gateway.load_instances and
plan_gateway (haproxy.cfg). The HAProxy configuration is rendered from the role's own
template with the role's defaults: hostile values are refused before it; the control
renders what they would have made without the checks."""
import json
import math
import pathlib

import jinja2
import pytest
import yaml

from gpufleet import gateway, grammar, serve

ROOT = pathlib.Path(__file__).resolve().parents[2]

# A newline and HAProxy syntax: a new backend that sends the model's traffic elsewhere.
INJECT = "chat\nbackend evil\n    server x 10.0.0.66:80"
HOSTILE_TEXT = [INJECT, "a b", "a#b", "a'b", 'a"b', "a\tb", "a\rb", "", "-flag", "x" * 300,
                "a;b", "a{b}", "$(id)", "a\x00b"]
WRONG_TYPES = [None, 1.5, math.nan, True, [], {}, b"bytes"]


@pytest.mark.parametrize("name", ["HuggingFaceTB/SmolLM2-135M-Instruct", "molecule/tiny-chat",
                                  "sentence-transformers/all-MiniLM-L6-v2", "gpufleet/tiny-gemma4",
                                  "llama3:8b", "org/model@main", "a+b.c_d-e", "m"])
def test_real_served_names_pass(name):
    assert grammar.served_model_name(name) == name


@pytest.mark.parametrize("value", HOSTILE_TEXT + WRONG_TYPES, ids=repr)
def test_hostile_served_names_are_refused_with_the_rule(value):
    with pytest.raises(grammar.GrammarError) as exc:
        grammar.served_model_name(value, "served_model_name of m")
    assert "served_model_name of m" in str(exc.value) and len(str(exc.value)) < 400


@pytest.mark.parametrize("value", ["lab-h200", "gpufleet-fleet-01", "gpu_7", "node1.dc.example.org",
                                   "h1"])
def test_real_host_names_pass(value):
    assert grammar.host_name(value) == value


@pytest.mark.parametrize("value", HOSTILE_TEXT + ["a..b", ".a", "-a", "a-", "a" * 64, "x." * 130]
                         + WRONG_TYPES, ids=repr)
def test_hostile_host_names_are_refused(value):
    with pytest.raises(grammar.GrammarError):
        grammar.host_name(value)


@pytest.mark.parametrize("value, out", [("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("[::1]", "::1"),
                                        ("10.1.2.3", "10.1.2.3"), ("gpu-1.example.org", "gpu-1.example.org")])
def test_addresses(value, out):
    assert grammar.address(value) == out


@pytest.mark.parametrize("value", HOSTILE_TEXT + ["127.0.0.1 backend", "1.2.3.4:80"] + WRONG_TYPES, ids=repr)
def test_hostile_addresses_are_refused(value):
    with pytest.raises(grammar.GrammarError):
        grammar.address(value)


@pytest.mark.parametrize("value", [0, -1, 65536, 10**12, "80 ", "8o", "", None, 1.5, math.nan, True,
                                   "1\nbind :1"], ids=repr)
def test_bad_ports_are_refused(value):
    with pytest.raises(grammar.GrammarError, match="1-65535"):
        grammar.port(value)


def test_good_ports():
    assert grammar.port(8000) == 8000 and grammar.port("65535") == 65535


# --- one port rule --------------------------------------------------------------------------
# The bound of a TCP port written as a number (65535, 65536, 2 ** 16, 1 << 16; not 0xffff,
# which plugins/module_utils/gpufleet/gpu.py uses as a mask of PCI ids).
_PORT_BOUND = r"(?<![\w.])(?:6553[56]|2\s*\*\*\s*16|1\s*<<\s*16)(?![\w.])"
# Where code, templates and role files live; the prose of docs/ and README may say the rule.
_CODE = ("plugins", "roles", "playbooks", "site.yml", "lab", "scripts", "molecule",
         "inventories")
_CODE_SUFFIXES = (".py", ".yml", ".yaml", ".j2", ".sh", ".cfg", ".ini")


def _port_bound_copies(root):
    """'path:line: text' for every port bound written outside grammar.port."""
    import re

    found = []
    for top in _CODE:
        path = root / top
        for f in [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []:
            if not f.is_file() or f.suffix not in _CODE_SUFFIXES or f == root / "plugins/module_utils/gpufleet/grammar.py":
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if re.search(_PORT_BOUND, line):
                    found.append(f"{f.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_the_port_rule_is_written_once():
    """grammar.port is the one rule of what a TCP port is: serve, gateway, bench and the
    lab call it, roles check ports with it (gpufleet_bad_inputs) and keep argument_spec
    type int. A second copy of the bound is found here."""
    assert (ROOT / "plugins/module_utils/gpufleet/grammar.py").read_text().count("65536") == 1
    assert _port_bound_copies(ROOT) == []


def test_control_a_second_copy_of_the_port_rule_is_found(tmp_path):
    """The scan above finds the copies the code had before grammar.port was the only one."""
    for rel, line in (("plugins/module_utils/gpufleet/gateway.py", "    if not 0 < port < 65536:"),
                      ("roles/r/tasks/preflight.yml", "    that: r_port | int <= 65535"),
                      ("lab/fleet.py", "    if port_base + n >= 1 << 16:"),
                      ("playbooks/templates/x.j2", "{% if port < 2 ** 16 %}")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# a file\n{line}\n")
    (tmp_path / "plugins/module_utils/gpufleet/grammar.py").write_text("if not 0 < int(text) < 65536:\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/x.md").write_text("a port is 1-65535\n")  # prose: not a copy
    assert sorted(_port_bound_copies(tmp_path)) == [
        "lab/fleet.py:2: if port_base + n >= 1 << 16:",
        "playbooks/templates/x.j2:2: {% if port < 2 ** 16 %}",
        "plugins/module_utils/gpufleet/gateway.py:2: if not 0 < port < 65536:",
        "roles/r/tasks/preflight.yml:2: that: r_port | int <= 65535"]


# Values at and around the rule's edges, of every type an inventory or a file gives.
_PORT_CASES = [1, 8000, "8000", 65535, "65535", 0, 65536, "65536", -1, "-1", " 80", "80 ",
               "8o", "", "1\nbind :1", True, None, 1.5, "80.5"]


@pytest.mark.parametrize("value", _PORT_CASES, ids=repr)
def test_every_use_of_a_port_agrees_with_grammar_port(value):
    """serve (a model's port), gateway (a frontend's port, the metrics port, a server
    name, an instance's target), bench (a target) and a role's preflight (check_inputs)
    accept exactly the ports grammar.port accepts, as the same number."""
    from gpufleet import bench

    def outcome(call):
        try:
            return call()
        except ValueError:
            return "refused"

    try:
        expected = grammar.port(value)
    except grammar.GrammarError:
        expected = "refused"
    target = f"10.0.0.1:{value}"
    uses = {
        "serve": outcome(lambda: serve._tcp_port(value, "port")),
        "gateway server name": outcome(lambda: int(gateway.server_name("h", value).rpartition("_")[2])),
        "gateway metrics port": outcome(lambda: gateway.plan_gateway(
            gateway.load_instances([_entry(port=8000)]), [{"served_model_name": "chat", "port": 9000}],
            value) and int(value)),
        "check_inputs": "refused" if grammar.check_inputs({"p": ["port", value]}) else int(value),
    }
    if isinstance(value, (int, str)) and not isinstance(value, bool):  # what a target can hold
        uses["gateway target"] = outcome(lambda: gateway.load_instances([_entry(port=value)])[0]["port"])
        uses["bench target"] = outcome(lambda: bench.split_target(target)[1])
    assert uses == dict.fromkeys(uses, expected)


# --- at the boundaries --------------------------------------------------------------------
def _entry(address="127.0.0.1", served="chat", host="gpu-a", port=8000):
    return {"targets": [f"{address}:{port}"],
            "labels": {"host": host, "container": "vllm-chat", "model": "m", "served_model_name": served,
                       "runner": "generate", "port": str(port)}}


@pytest.mark.parametrize("entry, said", [
    (_entry(served=INJECT), "label served_model_name"),
    (_entry(address="127.0.0.1\nbackend evil\n    server x 10.0.0.66"), "the target's address"),
    (_entry(host="gpu-a\nlisten x"), "label host"),
    (_entry(served="chat #x"), "label served_model_name"),
])
def test_the_gateway_refuses_a_hostile_instance_list(entry, said):
    with pytest.raises(gateway.GatewayError, match=said):
        gateway.load_instances(json.dumps([entry]))


def test_the_gateway_refuses_a_hostile_frontend():
    instances = gateway.load_instances([_entry()])
    with pytest.raises(gateway.GatewayError, match="vllm_gateway_frontends\\[0\\] served_model_name"):
        gateway.plan_gateway(instances, [{"served_model_name": INJECT, "port": 9000}], 9100)


def test_the_serve_plan_refuses_a_hostile_served_name():
    with pytest.raises(serve.PlanError, match="served_model_name of model 'm'"):
        serve.plan_instances({"name": "m", "path": "/p", "served_model_name": INJECT},
                             {"args": [], "settings": {}}, image="img:1", image_id="sha256:aa",
                             container_prefix="vllm-", default_port=8000, gpu_indexes=[0],
                             gpu_runtime="nvidia", allow_replicas=False)


@pytest.mark.parametrize("address, host, served", [
    ("127.0.0.1\nbackend evil", "gpu-a", "chat"), ("127.0.0.1", "gpu-a\n- targets: [x]", "chat"),
    ("127.0.0.1", "gpu-a", INJECT)])
def test_the_fleet_list_never_takes_a_hostile_entry(address, host, served):
    with pytest.raises(serve.PlanError):
        serve.registry_entry({"name": "vllm-chat", "model": "m", "served_model_name": served,
                              "runner": "generate", "port": 8000}, host, address)


# --- the rendered haproxy.cfg ---------------------------------------------------------------
def _render(plan):
    role = ROOT / "roles" / "vllm_gateway"
    variables = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    plan = dict(plan, frontends=gateway.plan_routes(plan["frontends"], variables["vllm_gateway_routes"]))
    variables.update(ansible_managed="managed", __vllm_gateway_plan=plan)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string((role / "templates" / "haproxy.cfg.j2").read_text()).render(variables)


def _sections(text):
    return [line for line in text.splitlines()
            if line.split(" ", 1)[0] in ("global", "defaults", "frontend", "backend", "listen")]


def test_a_clean_plan_renders_one_frontend_and_one_backend_per_model():
    plan = gateway.plan_gateway(gateway.load_instances([_entry(), _entry(port=8001, host="gpu-b")]),
                                [{"served_model_name": "chat", "port": 9000}], 9100)
    assert _sections(_render(plan)) == ["global", "defaults", "frontend stats", "frontend vllm_chat",
                                        "backend vllm_chat"]


def test_control_without_the_checks_a_hostile_name_adds_a_backend(monkeypatch):
    """What the checks prevent: the same hostile instance list, loaded with the grammar
    checks switched off, renders a configuration with a backend nobody asked for."""
    monkeypatch.setattr(gateway, "_checked", lambda check, value, what: value)
    plan = gateway.plan_gateway(gateway.load_instances([_entry(served=INJECT)]),
                                [{"served_model_name": INJECT, "port": 9000}], 9100)
    assert "backend evil" in _sections(_render(plan))


# --- durations, paths, numbers: the Prometheus role's inputs ----------------------------------
@pytest.mark.parametrize("value", ["15s", "1m", "1h30m", "15d", "500ms", "2w", "1y", "90s"])
def test_real_durations_pass(value):
    assert grammar.duration(value) == value


@pytest.mark.parametrize("value", ["", "0s", "m", "1x", "2m3h", "1.5m", "-1m", " 1m", "1m\n",
                                   "1m\n  - alert: Evil", "15d --web.enable-admin-api", *WRONG_TYPES])
def test_hostile_durations_are_refused(value):
    with pytest.raises(grammar.GrammarError, match="duration|must be a string"):
        grammar.duration(value)


@pytest.mark.parametrize("value", ["/etc/prometheus", "/srv/hf-mirror", "/var/lib/gpu-fleet_1/a.b@c+d"])
def test_real_config_paths_pass(value):
    assert grammar.config_path(value) == value


@pytest.mark.parametrize("value", ["etc/prometheus", "/etc/../root", "/a b", "/a;b", "/a\nb",
                                   "/a'b", "/a$b", "/a#b", "/a{b}", "", "/" + "a" * 5000, *WRONG_TYPES])
def test_hostile_config_paths_are_refused(value):
    with pytest.raises(grammar.GrammarError):
        grammar.config_path(value)


@pytest.mark.parametrize("value,ok", [(0.9, True), ("0.5", True), (1, True), (0, False),
                                      (1.01, False), (math.nan, False), (math.inf, False),
                                      ("0.9 or vector(1)", False), (True, False), (None, False)])
def test_fractions(value, ok):
    if ok:
        assert 0 < grammar.fraction(value) <= 1
    else:
        with pytest.raises(grammar.GrammarError):
            grammar.fraction(value)


@pytest.mark.parametrize("value,ok", [(0, True), ("5", True), (-1, False), ("0 or vector(1)", False),
                                      (1.5, False), (True, False), ("", False)])
def test_counts(value, ok):
    if ok:
        assert grammar.count(value) == int(value)
    else:
        with pytest.raises(grammar.GrammarError):
            grammar.count(value)


def test_check_inputs_names_each_bad_value_and_refuses_a_bad_spec():
    errors = grammar.check_inputs({"a": ["duration", "5m"], "b": ["config_path", "/x\ny"],
                                   "c": ["count", "0 or vector(1)"], "d": ["port", 80]})
    assert len(errors) == 2 and errors[0].startswith("b ") and errors[1].startswith("c ")
    assert grammar.check_inputs({}) == []
    for bad in ({"a": ["no-such-kind", 1]}, {"a": "5m"}, ["duration", "5m"]):
        with pytest.raises(grammar.GrammarError):
            grammar.check_inputs(bad)


MONITORING = ROOT / "roles" / "fleet_monitoring"
# One hostile value per input the role writes: a new alert rule, a new scrape job, a new
# rule file, another Prometheus flag on the ARGS line, PromQL after a threshold.
HOSTILE_MONITORING = {
    "fleet_monitoring_alert_instance_down_for": "1m\n      - alert: Evil\n        expr: vector(1)",
    "fleet_monitoring_alert_kv_cache_for": "5m\n  - name: evil",
    "fleet_monitoring_alert_requests_waiting_for": "5m #",
    "fleet_monitoring_alert_gateway_empty_for": "",
    "fleet_monitoring_scrape_interval": "15s\n  - job_name: evil",
    "fleet_monitoring_evaluation_interval": "0s",
    "fleet_monitoring_retention": "15d --web.enable-admin-api --web.enable-lifecycle",
    "fleet_monitoring_config_dir": "/etc/prometheus/rules.yml\n  - /tmp/evil",
    "fleet_monitoring_tls_ca_path": "/etc/prometheus/ca.crt\n  - job_name: evil",
    "fleet_monitoring_alert_kv_cache_usage": "0.9 or vector(1)",
    "fleet_monitoring_alert_requests_waiting": "0 or vector(1)",
    "fleet_monitoring_port": "9090 --web.enable-admin-api",
}


def _render_rules(overrides):
    variables = yaml.safe_load((MONITORING / "defaults" / "main.yml").read_text())
    variables.update(overrides, ansible_managed="managed")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string((MONITORING / "templates" / "gpufleet-rules.yml.j2").read_text()).render(variables)


def test_control_a_hostile_duration_adds_an_alert_rule():
    """What the preflight prevents: the rules template rendered with one hostile duration
    holds an alert nobody asked for (and still parses as YAML)."""
    clean = yaml.safe_load(_render_rules({}))
    hostile = yaml.safe_load(_render_rules({k: v for k, v in HOSTILE_MONITORING.items()
                                            if k == "fleet_monitoring_alert_instance_down_for"}))
    alerts = [[r["alert"] for r in g["rules"]] for g in (clean, hostile) for g in g["groups"]]
    assert "Evil" not in sum(alerts[:2], []) and "Evil" in sum(alerts[2:], [])


def _preflight(tmp_path, role, extra):
    from helpers import run_role_preflight

    return run_role_preflight(tmp_path, role, extra)


def test_the_monitoring_preflight_refuses_every_hostile_input_before_any_change(tmp_path):
    """fleet_monitoring's preflight: all hostile values at once are refused, each variable
    named; the role's defaults pass the same check."""
    instances = tmp_path / "vllm.json"
    instances.write_text("[]")
    rc, failures, changed = _preflight(tmp_path, "fleet_monitoring", dict(
        HOSTILE_MONITORING, fleet_monitoring_instances_file=str(instances)))
    assert rc != 0 and changed == [] and len(failures) == 1, failures
    for name in HOSTILE_MONITORING:
        assert f"{name} " in failures[0], (name, failures[0])
    assert "Nothing was changed" in failures[0]
    rc, failures, _ = _preflight(tmp_path, "fleet_monitoring",
                                 {"fleet_monitoring_instances_file": str(instances)})
    assert not any(f.startswith("gpufleet.fleet.fleet_monitoring : Fleet monitoring | Check the inputs") for f in failures), failures


# One hostile value per setting vllm_gateway writes into haproxy.cfg: a new section, a new
# directive, an ACL that matches everything, a socket elsewhere.
HOSTILE_GATEWAY = {
    "vllm_gateway_timeout_client": "30m\nlisten evil\n    bind :8080",
    "vllm_gateway_timeout_server": "30m # ",
    "vllm_gateway_timeout_connect": "5s\n    stats enable",
    "vllm_gateway_timeout_http_request": "",
    "vllm_gateway_timeout_queue": "1 minute",
    "vllm_gateway_timeout_check": "5s;",
    "vllm_gateway_check_inter": "2s rise 0",
    "vllm_gateway_slowstart": "60s\n",
    "vllm_gateway_check_fall": "2 rise 1",
    "vllm_gateway_check_rise": -1,
    "vllm_gateway_retries": "2\n    option httpclose",
    "vllm_gateway_redispatch_interval": "1\nlisten x",
    "vllm_gateway_balance": "leastconn\n    http-request allow",
    "vllm_gateway_retry_on": "all-retryable-errors #",
    "vllm_gateway_health_check_path": "/health HTTP/1.1\\r\\nHost: x",
    "vllm_gateway_health_check_status": "200 || 1",
    "vllm_gateway_metrics_port": 0,
    "vllm_gateway_bind_address": "127.0.0.1:80\nlisten y",
    "vllm_gateway_stats_socket": "/run/haproxy/admin.sock mode 666 level admin\n",
    "vllm_gateway_server_state_file": "relative/state",
    "vllm_gateway_config_path": "/etc/haproxy/../passwd",
    "vllm_gateway_api_keys_file": "/etc/haproxy/keys\n    acl k always_true",
    "vllm_gateway_tls_pem_path": "/etc/haproxy/certs/fleet.pem crt /tmp/other.pem",
    "vllm_gateway_tls_ca_path": "/etc/haproxy/ca.crt\n    listen z",
    "vllm_gateway_tls_min_version": "TLSv1.0\n    ssl-default-bind-options ssl-max-ver SSLv3",
    "vllm_gateway_tls_hsts_max_age": "1\"\n    listen h",
    "vllm_gateway_tls_cert_days": "397\nlisten d",
}


def test_control_a_hostile_timeout_adds_a_listen_section(monkeypatch):
    """What the gateway's preflight prevents: haproxy.cfg rendered from the role's template
    with one hostile timeout holds a `listen` section nobody asked for."""
    plan = gateway.plan_gateway(gateway.load_instances([_entry()]),
                                [{"served_model_name": "chat", "port": 9000}], 9100)
    role = ROOT / "roles" / "vllm_gateway"
    variables = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    plan = dict(plan, frontends=gateway.plan_routes(plan["frontends"], variables["vllm_gateway_routes"]))
    variables.update(ansible_managed="managed", __vllm_gateway_plan=plan,
                     vllm_gateway_timeout_client=HOSTILE_GATEWAY["vllm_gateway_timeout_client"])
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    text = env.from_string((role / "templates" / "haproxy.cfg.j2").read_text()).render(variables)
    assert "listen evil" in _sections(text) and "listen evil" not in _sections(_render(plan))


def test_the_gateway_preflight_refuses_every_hostile_input_before_any_change(tmp_path):
    """vllm_gateway's preflight: all hostile values at once are refused in its first task,
    each variable named; hostile routes and keyless paths in the next; the defaults (with a
    key and a frontend) pass both."""
    base = {"vllm_gateway_instances_file": str(tmp_path / "vllm.json"),
            "vllm_gateway_frontends": [{"served_model_name": "chat", "port": 9000}],
            "vllm_gateway_api_keys": ["k" * 16]}
    rc, failures, changed = _preflight(tmp_path, "vllm_gateway", dict(base, **HOSTILE_GATEWAY))
    assert rc != 0 and changed == [] and len(failures) == 1, failures
    assert failures[0].startswith("gpufleet.fleet.vllm_gateway : VLLM gateway | Check the inputs"), failures
    for name in HOSTILE_GATEWAY:
        assert f"{name} " in failures[0], (name, failures[0])
    rc, failures, _ = _preflight(tmp_path, "vllm_gateway", dict(
        base, vllm_gateway_routes=["/v1/models", "/v1/models acl"], vllm_gateway_keyless_paths=["/health\n"]))
    assert rc != 0 and len(failures) == 1 and "Check the routes" in failures[0], failures
    assert "vllm_gateway_routes: '/v1/models acl' is not a URL path" in failures[0], failures
    assert "vllm_gateway_keyless_paths: '/health\\n' is not a URL path" in failures[0], failures
    rc, failures, _ = _preflight(tmp_path, "vllm_gateway", base)
    assert not any("Check the inputs" in f or "Check the routes" in f for f in failures), failures


def test_the_site_mirror_preflight_refuses_a_hostile_root_and_port(tmp_path):
    """hf_site_mirror writes its root into nginx's configuration (include, root): a root
    holding ';' and a directive, and a port holding one, are refused in its first task."""
    models = [{"path": str(tmp_path / "m")}]
    rc, failures, changed = _preflight(tmp_path, "hf_site_mirror", {
        "hf_site_mirror_models": models, "hf_site_mirror_root": "/srv/hf;\n    include /etc/shadow",
        "hf_site_mirror_port": "8090; listen 80"})
    assert rc != 0 and changed == [] and len(failures) == 1, failures
    assert "hf_site_mirror_root '/srv/hf;" in failures[0] and "hf_site_mirror_port '8090; listen 80' is not a TCP port" in failures[0]
    rc, failures, _ = _preflight(tmp_path, "hf_site_mirror", {"hf_site_mirror_models": models})
    assert not any("Check the inputs" in f for f in failures), failures


@pytest.mark.parametrize("kind, good, bad", [
    (grammar.haproxy_time, ["5s", "30m", "100", "250ms", "10us", "1d"],
     ["", "5 s", "5sec", "-1s", "1.5s", "30m\nlisten x", "5s #", "1 minute"]),
    (grammar.keywords, ["leastconn", "random(2)", "conn-failure empty-response 503", "hdr(host)"],
     ["", "a  b", " leastconn", "leastconn\n    http-request allow", "all #", "a;b", "x" * 257]),
    (grammar.url_path, ["/health", "/v1/chat/completions", "/", "/a-b_c.d~e"],
     ["", "health", "/a b", "/a?b", "/a%20b", "/a#b", "/a\n", "/" + "a" * 256]),
    (grammar.integer, [0, 1, -1, "42", "-3"], ["", "1.5", "1e3", "1\nlisten x", True, None, 1.0]),
])
def test_haproxy_kinds(kind, good, bad):
    """The kinds vllm_gateway's preflight checks: each real value passes, each hostile or
    malformed one is refused with a GrammarError that names it."""
    for value in good:
        kind(value, "v")
    for value in bad + WRONG_TYPES[:2]:
        with pytest.raises(grammar.GrammarError, match="^v "):
            kind(value, "v")
