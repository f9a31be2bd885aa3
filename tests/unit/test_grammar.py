"""module_utils/gpufleet/grammar.py: one grammar per input that reaches a generated
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
