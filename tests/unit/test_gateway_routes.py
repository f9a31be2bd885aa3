"""What each model frontend of the gateway forwards (issue #32 item 1): the routes its
image serves (an instance's own /openapi.json) that vllm_gateway_routes names.

module_utils/gpufleet/gateway.py's openapi_routes (parsing, hostile documents refused),
route_plan (the intersection and its report), read_openapi (a bounded read from a
loopback HTTP server: key on 401, cap, deadline) and plan_routes (the explicit fallback to
the allowlist), vllm_gateway_plan's main() with `routes`, and the role's haproxy.cfg run by
the real HAProxy in front of two stand-in instances that serve vLLM 0.32.0's own documents
(tests/fixtures/vllm-openapi/SOURCES.md): the chat model's frontend answers 404 to
/v1/embeddings and the embedding model's to /v1/chat/completions.
"""
import http.server
import json
import pathlib
import socket
import threading
import time
import urllib.error
import urllib.request

import jinja2
import pytest
import yaml

from gpufleet import gateway
from helpers import run_module

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "vllm-openapi"
GENERATE = (FIXTURES / "openapi-0.32.0-generate.json").read_bytes()
POOLING = (FIXTURES / "openapi-0.32.0-pooling.json").read_bytes()
DEFAULTS = yaml.safe_load((ROOT / "roles" / "vllm_gateway" / "defaults" / "main.yml").read_text())
ALLOWLIST = DEFAULTS["vllm_gateway_routes"]
KEY = "k" * 24


# --- parsing ----------------------------------------------------------------------------
def test_vllms_own_documents_give_their_paths_and_methods():
    chat = gateway.openapi_routes(GENERATE)
    embed = gateway.openapi_routes(POOLING)
    assert len(chat) == 22 and len(embed) == 19
    assert chat["/v1/chat/completions"] == ["POST"] and chat["/v1/models"] == ["GET"]
    assert chat["/ping"] == ["GET", "POST"]
    assert "/v1/responses/{response_id}" in chat and "/v1/embeddings" not in chat
    assert "/v1/embeddings" in embed and "/v1/chat/completions" not in embed
    # the lab's route table (read from the running instances) is the two together
    lab = {path for _, path in yaml.safe_load(
        (ROOT / "molecule/vllm_gateway/vars/main.yml").read_text())["molgw_vllm_routes"]}
    assert {p.replace("{response_id}", "gpufleet-probe") for p in {*chat, *embed}} == lab


def test_fields_of_a_path_item_that_are_not_operations_are_not_routes():
    doc = {"openapi": "3.1.0", "paths": {
        "/a": {"summary": "s", "parameters": [], "get": {}, "servers": []},
        "/only-parameters": {"parameters": [{"name": "x"}], "description": "no operation"},
        "/b/{id}": {"delete": {}, "Post": {}}}}
    assert gateway.openapi_routes(json.dumps(doc)) == {"/a": ["GET"], "/b/{id}": ["DELETE", "POST"]}


@pytest.mark.parametrize("document, expect", [
    (b"<html>not found</html>", "is not JSON"),
    (b'{"port": 28101, "path": "/openapi.json"}', "has no `paths` object"),
    (b'{"openapi": "3.1.0", "paths": []}', "has no `paths` object"),
    (b'{"paths": {"/v1/models": {"get": {}}}}', "has no `openapi` version"),
    (b'[1, 2]', "has no `paths` object"),
    (json.dumps({"openapi": "3.1.0", "paths": {"/v1/models /metrics": {"get": {}}}}), "'/v1/models /metrics'"),
    (json.dumps({"openapi": "3.1.0", "paths": {"/x\nlisten evil": {"get": {}}}}), "printable ASCII"),
    (json.dumps({"openapi": "3.1.0", "paths": {"v1/models": {"get": {}}}}), "is not '/' then"),
    (json.dumps({"openapi": "3.1.0", "paths": {"/" + "a" * 2000: {"get": {}}}}), "at most 1024"),
    (json.dumps({"openapi": "3.1.0", "paths": {"/a": ["get"]}}), "not an object of operations"),
    (json.dumps({"openapi": "3.1.0", "paths": {f"/p{i}": {"get": {}} for i in range(5000)}}),
     "lists 5000 paths, more than 4096"),
    (b" " * (gateway.OPENAPI_MAX_BYTES + 1), "more than 8 MiB"),
])
def test_a_document_that_is_not_vllms_is_refused_with_what_was_wrong(document, expect):
    with pytest.raises(gateway.GatewayError) as exc:
        gateway.openapi_routes(document, "gpu-a:8000's /openapi.json")
    assert str(exc.value).startswith("gpu-a:8000's /openapi.json") and expect in str(exc.value)


# --- the intersection -------------------------------------------------------------------
def test_a_chat_model_forwards_only_the_listed_routes_it_serves():
    plan = gateway.route_plan(gateway.openapi_routes(GENERATE), ALLOWLIST, ["/health"])
    assert plan["routes"] == ["/detokenize", "/tokenize", "/v1/chat/completions", "/v1/completions",
                              "/v1/messages", "/v1/messages/count_tokens", "/v1/models", "/v1/responses"]
    # served, never forwarded: not listed, a path template, and not /health (keyless)
    assert "/v1/responses/{response_id}" in plan["closed"] and "/metrics" in plan["closed"]
    assert "/invocations" in plan["closed"] and "/health" not in plan["closed"]
    assert "/v1/embeddings" in plan["unserved"] and "/v1/chat/completions" not in plan["unserved"]
    assert set(plan["routes"]) | set(plan["unserved"]) == set(ALLOWLIST)


def test_a_pooling_model_forwards_embeddings_not_chat():
    plan = gateway.route_plan(gateway.openapi_routes(POOLING), ALLOWLIST, ["/health"])
    assert "/v1/embeddings" in plan["routes"] and "/v2/embed" in plan["routes"]
    assert "/v1/chat/completions" in plan["unserved"] and "/classify" in plan["unserved"]


def test_a_route_a_new_vllm_adds_stays_closed_until_listed():
    served = dict(gateway.openapi_routes(GENERATE), **{"/v1/brand-new": ["POST"]})
    assert "/v1/brand-new" in gateway.route_plan(served, ALLOWLIST)["closed"]
    assert "/v1/brand-new" in gateway.route_plan(served, ALLOWLIST + ["/v1/brand-new"])["routes"]


def _frontend(*ports):
    return {"name": "vllm_chat", "served_model_name": "chat", "port": 9000,
            "servers": [{"name": f"gpu_{p}", "address": "127.0.0.1", "port": p,
                         "endpoint": f"127.0.0.1:{p}"} for p in ports]}


def test_the_first_instance_that_gives_a_document_is_used():
    def read(server):
        if server["port"] == 1:
            raise gateway.GatewayError("http://127.0.0.1:1/openapi.json could not be read: refused")
        return GENERATE
    [planned] = gateway.plan_routes([_frontend(1, 2)], ALLOWLIST, ["/health"], read)
    assert planned["routes_source"] == "openapi" and planned["routes_from"] == "gpu_2"
    assert "/v1/embeddings" not in planned["routes"]
    assert "served but closed (not in vllm_gateway_routes): " in planned["routes_note"]
    assert "/v1/embeddings" in planned["routes_note"].split("listed but not served by this image: ")[1]


def test_no_readable_instance_forwards_the_allowlist_and_says_why():
    def read(server):
        return b'{"port": 1}' if server["port"] == 1 else gateway.read_openapi(
            dict(server, port=_closed_port()), timeout=2)
    [planned] = gateway.plan_routes([_frontend(1, 2)], ALLOWLIST, ["/health"], read)
    assert planned["routes"] == sorted(ALLOWLIST) and planned["routes_source"] == "allowlist"
    note = planned["routes_note"]
    assert note.startswith("chat: forwards the whole allowlist (vllm_gateway_routes), not checked")
    assert "127.0.0.1:1's /openapi.json is not an OpenAPI document" in note and "could not be read" in note
    [off] = gateway.plan_routes([_frontend(1)], ALLOWLIST, ["/health"], None)
    assert off["routes"] == sorted(ALLOWLIST) and "reading it is turned off" in off["routes_note"]


def test_an_image_that_serves_none_of_the_listed_routes_is_refused():
    with pytest.raises(gateway.GatewayError, match="serves none of vllm_gateway_routes"):
        gateway.plan_routes([_frontend(1)], ["/classify"], ["/health"], lambda server: GENERATE)


# --- the bounded read -------------------------------------------------------------------
def _closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Instance(http.server.BaseHTTPRequestHandler):
    """A stand-in vLLM instance: /openapi.json is self.server.document (401 without
    self.server.key when one is set); every other path echoes its port and path."""

    def _answer(self):
        srv = self.server
        if self.path == "/openapi.json" and srv.key and self.headers.get("Authorization") != f"Bearer {srv.key}":
            code, body = 401, b'{"error": "Unauthorized"}'
        elif self.path == "/openapi.json":
            if srv.drip:
                self.send_response(200)
                self.end_headers()
                for _ in range(50):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.1)
                return
            code, body = srv.status, srv.document
        elif self.path == "/health":
            code, body = 200, b""
        else:
            code, body = 200, json.dumps({"port": srv.server_port, "path": self.path}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def instance():
    servers = []

    def start(document=GENERATE, key="", status=200, drip=False):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Instance)
        server.daemon_threads = True
        server.document, server.key, server.status, server.drip = document, key, status, drip
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        port = server.server_port
        return {"name": f"gpu_{port}", "address": "127.0.0.1", "port": port, "endpoint": f"127.0.0.1:{port}"}
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_document_is_read_with_a_key_only_when_asked_for_one(instance):
    server = instance(key=KEY)
    assert gateway.read_openapi(server, ["x" * 16, KEY]) == GENERATE
    with pytest.raises(gateway.GatewayError, match="answered HTTP 401 with each key of vllm_gateway_api_keys"):
        gateway.read_openapi(server, ["x" * 16])


def test_over_https_the_instance_must_be_verified_and_a_missing_ca_file_is_named(instance, tmp_path):
    server = instance()
    with pytest.raises(gateway.GatewayError, match=f"https://127.0.0.1:{server['port']}/openapi.json was not "
                       f"read: the CA file {tmp_path}/none.crt cannot be used"):
        gateway.read_openapi(server, ca_file=str(tmp_path / "none.crt"))
    import ssl
    bundle = ssl.get_default_verify_paths().cafile  # Debian's CA bundle: any valid PEM file
    if bundle:  # with a CA file the read is https: a plain-HTTP instance does not answer it
        with pytest.raises(gateway.GatewayError, match=f"https://127.0.0.1:{server['port']}/openapi.json "
                           "could not be read"):
            gateway.read_openapi(server, ca_file=bundle)


def test_a_server_without_a_document_says_what_vllm_flag_does_that(instance):
    with pytest.raises(gateway.GatewayError, match=r"answered HTTP 404 \(a vLLM started with --disable-fastapi-docs"):
        gateway.read_openapi(instance(status=404))


def test_a_huge_or_dripping_document_is_cut_off_by_the_cap_and_the_deadline(instance):
    with pytest.raises(gateway.GatewayError, match=r"openapi.json sent more than 4 KiB \(the cap"):
        gateway.read_openapi(instance(), max_bytes=4096)
    # 50 bytes, one every 0.1 s: the document is not complete by the 1 s deadline
    with pytest.raises(gateway.GatewayError, match="did not answer in full within 1 s"):
        gateway.read_openapi(instance(drip=True), timeout=1)


# --- the module -------------------------------------------------------------------------
def _fleet(chat_port, embed_port):
    return [{"targets": [f"127.0.0.1:{port}"], "labels": {
        "host": host, "served_model_name": model, "model": model, "runner": runner,
        "port": str(port), "container": "vllm"}}
        for host, port, model, runner in (("gpu-a", chat_port, "chat", "generate"),
                                          ("gpu-b", embed_port, "embed", "pooling"))]


def test_the_plan_module_reads_each_models_routes_and_reports_them(instance, monkeypatch):
    import vllm_gateway_plan

    chat, embed = instance(key=KEY), instance(POOLING)
    result, failed = run_module(vllm_gateway_plan.main, {
        "instances": _fleet(chat["port"], embed["port"]),
        "frontends": [{"served_model_name": "chat", "port": 9000}, {"served_model_name": "embed", "port": 9001}],
        "metrics_port": 8405, "routes": ALLOWLIST, "keyless_paths": ["/health"], "api_keys": [KEY]},
        monkeypatch, check_mode=True)
    assert not failed and not result["changed"], result
    by_model = {f["served_model_name"]: f for f in result["frontends"]}
    assert "/v1/chat/completions" in by_model["chat"]["routes"] and "/v1/embeddings" not in by_model["chat"]["routes"]
    assert "/v1/embeddings" in by_model["embed"]["routes"] and "/v1/chat/completions" not in by_model["embed"]["routes"]
    assert [n.split(":")[0] for n in result["routes_notes"]] == ["chat", "embed"]
    assert KEY not in json.dumps(result)


def test_the_plan_module_without_a_serving_instance_forwards_the_allowlist_and_says_so(monkeypatch):
    import vllm_gateway_plan

    result, failed = run_module(vllm_gateway_plan.main, {
        "instances": _fleet(_closed_port(), _closed_port())[:1],
        "frontends": [{"served_model_name": "chat", "port": 9000}],
        "metrics_port": 8405, "routes": ALLOWLIST}, monkeypatch)
    assert not failed and result["frontends"][0]["routes"] == sorted(ALLOWLIST)
    assert "forwards the whole allowlist" in result["routes_notes"][0]
    # without `routes` the module plans no routes (its callers before this option)
    result, failed = run_module(vllm_gateway_plan.main, {
        "instances": _fleet(1, 2)[:1], "frontends": [{"served_model_name": "chat", "port": 9000}],
        "metrics_port": 8405}, monkeypatch)
    assert not failed and "routes" not in result["frontends"][0] and "routes_notes" not in result


# --- the real HAProxy -------------------------------------------------------------------
def _render(plan, tmp_path, metrics_port):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string((ROOT / "roles/vllm_gateway/templates/haproxy.cfg.j2").read_text()).render(
        dict(DEFAULTS, ansible_managed="test_gateway_routes.py", vllm_gateway_tls=False,
             vllm_gateway_stats_socket=str(tmp_path / "admin.sock"),
             vllm_gateway_server_state_file=str(tmp_path / "server-state"),
             vllm_gateway_api_keys_file=str(tmp_path / "api-keys"),
             vllm_gateway_metrics_port=metrics_port, __vllm_gateway_plan=plan))


def _status(port, path, key=KEY):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.parametrize("read_routes", [True, False], ids=["from-openapi", "control-allowlist-only"])
def test_haproxy_forwards_each_model_only_the_routes_its_image_serves(instance, tmp_path, read_routes):
    from helpers import haproxy_path, start_haproxy

    haproxy_path()
    chat, embed = instance(), instance(POOLING)
    fronts = {"chat": _closed_port(), "embed": _closed_port()}
    plan = gateway.plan_gateway(gateway.load_instances(_fleet(chat["port"], embed["port"])),
                                [{"served_model_name": m, "port": p} for m, p in fronts.items()], _closed_port())
    plan["frontends"] = gateway.plan_routes(plan["frontends"], ALLOWLIST, ["/health"],
                                            gateway.read_openapi if read_routes else None)
    text = _render(plan, tmp_path, _closed_port())
    (tmp_path / "api-keys").write_text(KEY + "\n")
    (tmp_path / "haproxy.cfg").write_text(text)
    proc = start_haproxy(tmp_path / "haproxy.cfg", tmp_path / "haproxy.log")
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", fronts["embed"]), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "haproxy.log").read_text()
                time.sleep(0.1)
        got = {(model, path): _status(port, path) for model, port in fronts.items()
               for path in ("/v1/chat/completions", "/v1/embeddings", "/tokenize", "/v1/models")}
        keyless = {model: _status(port, "/v1/models", key=None) for model, port in fronts.items()}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert keyless == {"chat": 401, "embed": 401}
    assert got[("chat", "/v1/chat/completions")] == 200 and got[("embed", "/v1/embeddings")] == 200
    assert got[("chat", "/tokenize")] == got[("embed", "/v1/models")] == 200
    if read_routes:
        assert got[("chat", "/v1/embeddings")] == 404 and got[("embed", "/v1/chat/completions")] == 404, got
        assert f"# chat: routes from /openapi.json of gpu-a_{chat['port']}" in text
    else:  # the control: the allowlist alone lets both through to a model that lacks them
        assert got[("chat", "/v1/embeddings")] == 200 and got[("embed", "/v1/chat/completions")] == 200, got
        assert "# chat: routes from vllm_gateway_routes alone" in text


# --- the role's preflight (one ansible-playbook run) ------------------------------------
def test_the_roles_preflight_says_what_each_frontend_forwards_and_logs_no_key(instance, tmp_path):
    """Check mode, at -vvv: the plan reads the chat instance's document (with the key, on
    its 401) and prints what the frontend forwards and what stays closed."""
    from helpers import run_playbook

    key = "sk-routes-" + "Q7" * 12
    chat = instance(key=key)
    (tmp_path / "vllm.json").write_text(json.dumps(_fleet(chat["port"], 1)[:1]))
    play = tmp_path / "play.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                    "    - name: Preflight\n      ansible.builtin.include_role:\n"
                    "        name: gpufleet.fleet.vllm_gateway\n        tasks_from: preflight\n")
    inventory = tmp_path / "hosts"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={ROOT / '.venv/bin/python'}\n")
    rc, _, failures, _, output = run_playbook(inventory, play, "localhost", {
        "vllm_gateway_instances_file": str(tmp_path / "vllm.json"), "vllm_gateway_api_keys": [key],
        "vllm_gateway_frontends": [{"served_model_name": "chat", "port": 9000}], "vllm_gateway_tls": False,
        "vllm_gateway_backend_tls": False},
        check=True, verbosity=3, with_output=True)
    assert rc == 0, failures
    assert (f"chat: forwards 8 routes its image serves (gpu-a_{chat['port']}'s /openapi.json); "
            "served but closed (not in vllm_gateway_routes): /generative_scoring, /invocations") in output
    assert "listed but not served by this image: /classify, /pooling, /rerank" in output
    assert key not in output
