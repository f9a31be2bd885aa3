"""playbooks/upgrade.yml's batch mechanics with real Ansible (issue #31 items 4 and 10).

The REAL playbook (its play keywords: serial from the plan, max_fail_percentage), the
REAL fleet_upgrade role (batches, gates, change, rollback, the kept stop message) and the
REAL filters run on local hosts. Only the role's collaborators are STAND-INS, written by
this test into a stand-in collection gpufleet.fleet in a temporary folder (found first
through ANSIBLE_COLLECTIONS_PATH; every other role, module and plugin in it is a link to
the real one): the preflight, model_fetch, vllm_server and vllm_gateway roles and the
vllm_record, vllm_probe and vllm_gateway_stats modules. Each
stand-in says one line per call (a debug task: "STANDIN-EVENT HOST EVENT", read back from
the run's output, so it costs the control node no module run), and fails where the
inventory tells it to (a compatibility refusal, a failing probe gate).

With `gateway=True` (the cases where requests are at stake: a gate failure in a two-host
batch, a controller killed after a drain with HAProxy reloaded while the host is out, two
runs at once) the gateway is REAL: Debian's HAProxy, run from roles/vllm_gateway's own
haproxy.cfg.j2 (front door, retries, health checks, server-state file), drained and
re-enabled by the role's real server_state entry point (community.general.haproxy) and
read by the real vllm_gateway_stats; the drain's idle wait and the probe gate are the real
vllm_probe. Only the vLLM instances are stand-ins (tests/load/standin_vllm.py: tiny
OpenAI-shaped servers, one per host, which the stand-in apply replaces with SIGKILL and a
new process, slower where the probe gate must fail). The load generator
(tests/load/loadgen.py) sends short completions and long streaming chats through HAProxy
for the whole run, and a control shows that a stream to a backend replaced in service is
counted as failed. These cases ran on the real lab until CI stop 39 (issue #31 item 11:
room in CI); the lab keeps the cases that need real vLLM (readiness, argument checks,
reboots, model revisions, the key rotation). The lab's one-host batches never reach what
this file proves for batches of several hosts.
"""
import contextlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]

from load.loadgen import Load  # noqa: E402

# About 20 ansible-playbook runs, 3-4 minutes on this 2-core machine: scripts/test.sh runs
# them beside Molecule (they need no docker).
pytestmark = pytest.mark.slow

# --- stand-ins ------------------------------------------------------------------------------
def _log(event, name=None):
    return {"name": name or f"Stand-in | {event}",
            "ansible.builtin.debug": {"msg": f"STANDIN-EVENT {{{{ inventory_hostname }}}} {event}"}}


_EVENT = re.compile(r'"msg": "STANDIN-EVENT (\S+) ([^"]+)"')


STANDIN_ROLES = {
    "preflight/tasks/main.yml": [
        _log("compat"),
        {"name": "Stand-in | GPU facts (driver 580, the branch asked for: no driver change)",
         "gpufleet.fleet.standin_gpu_facts": {}},
        {"name": "Stand-in | Refuse where told",
         "ansible.builtin.fail": {"msg": "driver 535 supports CUDA 12.2 only"},
         "when": "inventory_hostname in standin_compat_refuse"},
    ],
    "model_fetch/tasks/main.yml": [_log("fetch")],
    # upgrade.yml's last plays stop the p2p seeders of the model step (no event: they run
    # after every batch, on every host of the rollout)
    "model_fetch/tasks/p2p_stop.yml": [{"name": "Stand-in | Stop the p2p seeders",
                                         "ansible.builtin.debug": {"msg": "stand-in p2p_stop"}}],
    "vllm_server/tasks/plan.yml": [
        {"name": "Stand-in | Plan",
         "ansible.builtin.set_fact": {"vllm_server_plan": {
             "instances": "{{ [] if inventory_hostname in standin_serves_nothing else "
                          "[{'name': 'chat', 'action': 'keep' if inventory_hostname in standin_keep "
                          "or (standin_applied ~ '/' ~ inventory_hostname) is exists else 'replace', "
                          "'url': 'http://' ~ (('127.0.0.1:' ~ standin_ports[inventory_hostname]) if standin_gateway "
                          "else (inventory_hostname ~ '.invalid:8000')) ~ '/', "
                          "'served_model_name': 'chat', 'runner': 'generate'}] }}",
             "remove": []}}},
    ],
    # what apply changed stays changed: the next plan of the host says keep
    "vllm_server/tasks/apply.yml": [
        _log("apply"),
        # with the real gateway: the host's stand-in vLLM is replaced (SIGKILL, then a new
        # process: a request still on it is cut), slower where the probe gate must fail
        {"name": "Stand-in | Replace the host's stand-in vLLM",
         "ansible.builtin.command": "{{ standin_python }} {{ standin_vllm }} restart {{ standin_backends }} "
                                    "{{ inventory_hostname }}{{ ' --slow' if inventory_hostname in standin_probe_fail else '' }}",
         "changed_when": True, "when": "standin_gateway | bool"},
        {"name": "Stand-in | Remember the host runs the new containers",
         "ansible.builtin.shell": "touch {{ standin_applied }}/{{ inventory_hostname }}",
         "changed_when": False},
        {"name": "Stand-in | Kill the controller",
         "ansible.builtin.shell": "kill -KILL $(cat {{ standin_kill_pidfile }})",
         "changed_when": False,
         "when": "inventory_hostname ~ ' apply' == standin_kill_at"},
        # the host becomes unreachable (SSH to a port nothing listens on) from the next task
        {"name": "Stand-in | Lose the host",
         "ansible.builtin.set_fact": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1",
                                      "ansible_port": 9, "ansible_ssh_common_args": "-o ConnectTimeout=2"},
         "when": "inventory_hostname ~ ' apply' == standin_lose_at"},
    ],
    "vllm_server/tasks/record.yml": [_log("record")],
    "vllm_server/tasks/main.yml": [
        _log("rollback-deploy"),
        {"name": "Stand-in | Bring back the host's last good stand-in vLLM",
         "ansible.builtin.command": "{{ standin_python }} {{ standin_vllm }} restart {{ standin_backends }} "
                                    "{{ inventory_hostname }}",
         "changed_when": True, "when": "standin_gateway | bool"}],
    "vllm_gateway/tasks/server_state.yml": [
        _log("{{ vllm_gateway_server_state }}"),
        # with the real gateway: the role's own entry point (its defaults and vars are the
        # real role's, linked into this stand-in role by _fleet)
        {"name": "Stand-in | The real server_state entry point",
         "ansible.builtin.include_tasks": str(ROOT / "roles/vllm_gateway/tasks/server_state.yml"),
         "when": "standin_gateway | bool"},
        # the controller dies (SIGKILL) right after this host's drain, where the test says
        {"name": "Stand-in | Kill the controller",
         "ansible.builtin.shell": "kill -KILL $(cat {{ standin_kill_pidfile }})",
         "changed_when": False,
         "when": "inventory_hostname ~ ' ' ~ vllm_gateway_server_state == standin_kill_at"},
    ],
    "vllm_gateway/tasks/main.yml": [_log("gateway-config")],
    # the keys play before the first batch (a key rotation: docs/security.md)
    "vllm_gateway/tasks/keys.yml": [_log("gateway-keys-{{ vllm_gateway_keys_kept_only }}")],
}

# The stand-in modules read the test's settings from a JSON file; the probe knows its host
# by the URL the stand-in plan gives each host's instance.
STANDIN_MODULE = """#!/usr/bin/python
import json
from ansible.module_utils.basic import AnsibleModule

OPTIONS = %(options)r
CONFIG = json.load(open(%(config)r))


def main():
    module = AnsibleModule(argument_spec={k: {"type": "raw"} for k in OPTIONS},
                           supports_check_mode=True)
    p = module.params
%(body)s


main()
"""

MODULES = {
    # every server of the fleet UP, so the capacity gate lets each host go
    "vllm_gateway_stats": (["socket", "server_host", "watch_seconds"], """
    module.exit_json(changed=False, servers=[
        {"backend": "chat", "server": h + "_8000", "host": h, "status": "UP"}
        for h in CONFIG["hosts"]], host_servers=[], deltas=[], bad_statuses=[])
"""),
    "standin_gpu_facts": ([], """
    module.exit_json(changed=False, ansible_facts={"gpu": {"driver_version": "580.95.05"}})
"""),
    # the record's image is gone on the hosts the test names (its path ends in HOST.json)
    "vllm_record": (["path", "state", "record", "check_image"], """
    host = p["path"].rsplit("/", 1)[-1].split(".")[0]
    gone = host in CONFIG["image_gone"]
    module.exit_json(changed=False, image_present=not gone,
                     problem="its last-good record names the image vllm:old, which is no longer on the host" if gone else "",
                     record={
        "version": 1, "image_ref": "vllm:old", "image_id": "sha256:01d", "driver_version": "",
        "inputs": {"vllm_server_image": "sha256:01d", "vllm_server_vllm_version": "0.32.0",
                   "vllm_server_models": [], "vllm_server_port": 8000},
        "models": [], "instances": []})
"""),
    # the probe gate (after the change: no wait_idle) fails on the hosts the test names
    "vllm_probe": (["url", "api_key", "served_model_name", "runner", "wait_idle", "idle_timeout",
                    "requests", "max_tokens", "baseline", "max_latency_ratio",
                    "max_latency_increase_ms", "max_error_rate", "attempts", "ca_file"], """
    host = p["url"].split("//")[1].split(".")[0]
    if not p["wait_idle"] and host in CONFIG["probe_fail"]:
        module.fail_json(msg="p95 latency 900 ms against 100 ms before (9.0x, limit 2.0x)")
    module.exit_json(changed=False, probe={"p95_ms": 100})
"""),
}


# --- the real gateway (gateway=True) ---------------------------------------------------------
KEY = "stand-in-key"  # the stand-in fleet's API key (no secret: it opens loopback stand-ins)
STANDIN_VLLM = ROOT / "tests/load/standin_vllm.py"
_STARTED = []  # (kind, what) to stop after each test


@pytest.fixture(autouse=True)
def _stop_what_the_test_started():
    yield
    while _STARTED:
        kind, what = _STARTED.pop()
        if kind == "haproxy" and what.poll() is None:
            what.kill()
            what.wait(10)
        elif kind == "backends":
            subprocess.run([sys.executable, str(STANDIN_VLLM), "stop", str(what)], check=False)


def _free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _haproxy_config(tmp_path, servers, port, stats_port):
    """roles/vllm_gateway/templates/haproxy.cfg.j2 rendered with the role's defaults, one
    frontend for the model "chat" and paths under tmp_path: the gateway the role writes."""
    import jinja2
    defaults = yaml.safe_load((ROOT / "roles/vllm_gateway/defaults/main.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    text = env.from_string((ROOT / "roles/vllm_gateway/templates/haproxy.cfg.j2").read_text()).render(
        dict(defaults, ansible_managed="test_upgrade_orchestration.py",
             vllm_gateway_stats_socket=str(tmp_path / "admin.sock"),
             vllm_gateway_server_state_file=str(tmp_path / "server-state"),
             vllm_gateway_api_keys_file=str(tmp_path / "api-keys"),
             vllm_gateway_metrics_port=stats_port,
             vllm_gateway_tls=False,  # plain HTTP, as the lab's gateway (TLS: test_gateway_tls.py)
             # quicker health checks than the role's 2 s x 3 (each re-enable waits for UP)
             vllm_gateway_check_inter="300ms", vllm_gateway_check_rise=2, vllm_gateway_slowstart="1s",
             __vllm_gateway_plan={"frontends": [{"name": "chat", "served_model_name": "chat", "port": port,
                                                 "servers": servers, "routes": defaults["vllm_gateway_routes"],
                                                 "routes_source": "allowlist"}]}))
    (tmp_path / "api-keys").write_text(KEY + "\n")
    (tmp_path / "haproxy.cfg").write_text(text)
    return tmp_path / "haproxy.cfg"


def _start_gateway(tmp_path, hosts):
    """Stand-in vLLM on a free port per host, and HAProxy (master-worker, in the
    foreground) in front of them; returns {"url", "socket", "proc", "ports"}."""
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.path.exists(haproxy):
        pytest.skip("no haproxy (scripts/setup.sh installs Debian's)")
    backends = tmp_path / "backends"
    backends.mkdir()
    ports = {h: _free_port() for h in hosts}
    (backends / "backends.json").write_text(json.dumps({"key": KEY, "ports": ports}))
    _STARTED.append(("backends", backends))
    for host in hosts:
        subprocess.run([sys.executable, str(STANDIN_VLLM), "restart", str(backends), host], check=True)
    port = _free_port()
    config = _haproxy_config(tmp_path, [{"name": f"{h}_{p}", "endpoint": f"127.0.0.1:{p}"}
                                        for h, p in ports.items()], port, _free_port())
    subprocess.run([haproxy, "-c", "-q", "-f", str(config)], check=True)
    proc = subprocess.Popen([haproxy, "-W", "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=(tmp_path / "haproxy.log").open("w"))
    _STARTED.append(("haproxy", proc))
    gateway = {"url": f"http://127.0.0.1:{port}", "socket": tmp_path / "admin.sock", "proc": proc,
               "ports": ports}
    import time
    deadline = time.monotonic() + 30
    while set(_servers(gateway).values()) != {"UP"} or len(_servers(gateway)) != len(hosts):
        assert time.monotonic() < deadline, f"HAProxy's servers never all UP: {_servers(gateway)}"
        time.sleep(0.2)
    return gateway


def _servers(gateway):
    """{server: status} of the chat backend, from HAProxy's admin socket (show stat)."""
    import csv
    import io
    import socket
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(gateway["socket"]))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError:
        return {}
    rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
    return {r["svname"]: r["status"] for r in rows
            if r["pxname"] == "chat" and r["svname"] not in ("FRONTEND", "BACKEND")}


def _reload(gateway):
    """What haproxy.service's ExecReload does (the role's drop-in): check, save the
    servers' states (the role's own files/haproxy-save-state), then SIGUSR2 to the master."""
    import signal
    import time
    subprocess.run([sys.executable, str(ROOT / "roles/vllm_gateway/files/haproxy-save-state"),
                    str(gateway["socket"]), str(gateway["socket"].parent / "server-state")], check=True)
    gateway["proc"].send_signal(signal.SIGUSR2)
    time.sleep(3)  # the new worker reads the states and runs its first checks


@contextlib.contextmanager
def _loaded(gateway, totals):
    """Short completions (2 clients) and long streaming chats (1 client, 40 tokens, about
    2 s each) through the gateway for the whole block; their totals go into `totals`
    ({"short", "streams"}) and are printed."""
    short = Load(gateway["url"], KEY, "chat", clients=2, pause=0.1, max_seconds=900).start()
    streams = Load(gateway["url"], KEY, "chat", clients=1, stream=True, max_tokens=40,
                   max_seconds=900).start()
    try:
        yield totals
    finally:
        totals.update(short=short.stop(), streams=streams.stop())
        for kind, t in totals.items():
            print(f"\n[load] {kind} through HAProxy: sent {t['sent']}, failed {t['failed']} "
                  f"(ok {t['ok']}, {t['seconds']} s); first failures: {t['failures'][:3]}")


def _under_load(gateway, action):
    """action() under _loaded's load; returns (its result, the totals)."""
    with _loaded(gateway, {}) as totals:
        result = action()
    return result, totals


def _no_request_failed(totals):
    for kind, t in totals.items():
        assert t["failed"] == 0 and t["sent"] >= 5, (kind, t)


def _fleet(tmp_path, hosts, serves_nothing=(), compat_refuse=(), probe_fail=(), keep=(),
           fraction=0.5, play_keywords=None, kill_at="", image_gone=(), lose_at="", gateway=False):
    """Write the stand-ins, the fleet's instance list and the inventory; return a
    function that runs upgrade.yml (extra arguments are ansible-playbook's) and returns
    (rc, output, events). The rollout state and lock are real (plugins/modules/rollout_state.py,
    rollout_lock.py) under tmp_path: state/<host>.json and rollout.lock.

    The playbook calls gpufleet.fleet.<role or module>: the stand-ins live in a stand-in
    collection, tmp_path/ansible_collections/gpufleet/fleet, the only gpufleet.fleet on
    ANSIBLE_COLLECTIONS_PATH; what is not stood in there is a link to the real file."""
    collection = tmp_path / "ansible_collections" / "gpufleet" / "fleet"
    roles = collection / "roles"
    for rel, tasks in STANDIN_ROLES.items():
        path = roles / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(tasks, sort_keys=False))
    library = collection / "plugins" / "modules"
    library.mkdir(parents=True)
    for sub in ("filter", "action", "module_utils", "doc_fragments"):
        (collection / "plugins" / sub).symlink_to(ROOT / "plugins" / sub)
    for sub in ("playbooks", "meta"):
        (collection / sub).symlink_to(ROOT / sub)
    config = tmp_path / "standin.json"
    config.write_text(json.dumps({"hosts": list(hosts), "probe_fail": list(probe_fail),
                                  "image_gone": list(image_gone)}))
    for name, (options, body) in MODULES.items():
        if gateway and name in ("vllm_gateway_stats", "vllm_probe"):
            continue  # the real modules, against the real HAProxy and the stand-in vLLM
        (library / f"{name}.py").write_text(STANDIN_MODULE % {
            "options": options, "config": str(config), "body": body.strip("\n")})
    for real in sorted((ROOT / "plugins" / "modules").glob("*.py")):
        if not (library / real.name).exists():
            (library / real.name).symlink_to(real)
    for real in sorted((ROOT / "roles").iterdir()):
        if not (roles / real.name).exists():
            (roles / real.name).symlink_to(real)
    serving = [h for h in hosts if h not in serves_nothing]
    instances = [{"targets": [f"{h}:8000"], "labels": {"host": h, "served_model_name": "chat"}}
                 for h in serving]
    standin_gw = {"standin_gateway": gateway, "standin_probe_fail": list(probe_fail)}
    if gateway:
        # the real role's defaults and vars in the stand-in vllm_gateway role
        for sub in ("defaults", "vars"):
            (roles / "vllm_gateway" / sub).symlink_to(ROOT / "roles/vllm_gateway" / sub)
        run_gateway = _start_gateway(tmp_path, serving)
        standin_gw.update(
            standin_ports=run_gateway["ports"], standin_python=sys.executable,
            standin_vllm=str(STANDIN_VLLM), standin_backends=str(tmp_path / "backends"),
            vllm_gateway_stats_socket=str(run_gateway["socket"]),
            vllm_gateway_server_wait_interval=1, vllm_gateway_server_wait_retries=60,
            fleet_upgrade_probe_requests=3, fleet_upgrade_probe_attempts=1)
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    events = []  # every run's stand-in events, in the order the runs finished
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "applied").mkdir()
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "ansible_become": False}
    inventory = {"all": {
        "vars": {"standin_serves_nothing": list(serves_nothing),
                 "standin_compat_refuse": list(compat_refuse), "standin_keep": list(keep),
                 "standin_kill_at": kill_at, "standin_lose_at": lose_at, "standin_applied": str(tmp_path / "applied"), "standin_kill_pidfile": str(tmp_path / "controller.pid"),
                 "vllm_server_file_sd_path": str(tmp_path / "instances.json"),
                 "vllm_server_api_key": KEY, "vllm_server_record_path": str(tmp_path / "{{ inventory_hostname }}.json"),
                 "vllm_server_image": "sha256:01d", "vllm_server_vllm_version": "0.32.0",
                 "vllm_server_models": [], "vllm_server_port": 8000,
                 "fleet_upgrade_soak_seconds": 0, "fleet_upgrade_capacity_wait": 0,
                 "fleet_upgrade_max_unavailable_fraction": fraction,
                 "fleet_upgrade_state_path": str(tmp_path / "state" / "{{ inventory_hostname }}.json"),
                 "fleet_upgrade_lock_path": str(tmp_path / "rollout.lock"), **standin_gw},
        "children": {"gpu_hosts": {"hosts": {h: dict(local) for h in hosts}},
                     "gateways": {"hosts": {"gw": dict(local)}}}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    playbook = ROOT / "playbooks" / "upgrade.yml"
    playbook_text = None
    if play_keywords:  # a control: the same playbook with other keywords on the batch play
        plays = yaml.safe_load(playbook.read_text())
        batch_play, = [p for p in plays if p["name"] == "Upgrade | Roll each batch"]
        batch_play.update(play_keywords)
        # in this test's folder, never the checkout's playbooks/: a file there changes the
        # code digest of site.yml's state check for a lab run beside this test (CI stop 38)
        playbook = tmp_path / "upgrade-control.yml"
        playbook_text = yaml.safe_dump(plays, sort_keys=False)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(tmp_path),
               ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOWS="1",
               ANSIBLE_FORKS="10", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               # the stand-ins read no fact but the GPU's: the play's fact gathering stays minimal
               ANSIBLE_GATHER_SUBSET="!all,!min",
               # a killed run's output up to the kill holds its events
               PYTHONUNBUFFERED="1")

    def start(*args):
        """Start upgrade.yml; returns the process (its pid is where the kill hook looks)."""
        if playbook_text is not None:
            playbook.write_text(playbook_text)
        proc = subprocess.Popen([str(ROOT / ".venv/bin/ansible-playbook"), "-i",
                                 str(tmp_path / "inventory.yml"), str(playbook), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        (tmp_path / "controller.pid").write_text(str(proc.pid))
        return proc

    def finish(proc):
        out, _ = proc.communicate(timeout=300)
        events.extend(_EVENT.findall(out))
        return proc.returncode, out, events_so_far()

    def events_so_far():
        return list(events)

    def run(*args):
        return finish(start(*args))
    run.start, run.finish, run.events = start, finish, events_so_far
    run.gateway = run_gateway if gateway else None
    run.hosts = list(hosts)
    return run


def _state(tmp_path, host):
    path = tmp_path / "state" / f"{host}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _recap(output):
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"^(\S+)\s+:\s+ok=\d+.*?failed=(\d+)", output, re.M)}


def _of(events, host):
    return [e for h, e in events if h == host]


HOSTS = ["h1", "h2", "h3", "h4", "h5"]


def _check_gate_failure_in_a_two_host_batch(rc, out, events):
    """h2's probe gate fails in the batch [h2, h3]: h2 rolled back and back in service,
    h3 finished and back in service, the later batch untouched, the stop message printed,
    exit 2 and a recap that says which host failed."""
    assert "1. h1 (canary); 2. h2, h3; 3. h4, h5" in out, out
    assert _of(events, "h1") == ["compat", "disabled", "apply", "enabled", "record"], events
    assert _of(events, "h2") == ["compat", "disabled", "apply", "rollback-deploy", "enabled"], events
    assert _of(events, "h3") == ["compat", "disabled", "apply", "enabled", "record"], events
    assert _of(events, "h4") == [] and _of(events, "h5") == [], events
    assert 'UPGRADE STOPPED at h2: the gate "Probe gate (after, compared with before)" failed' in out, out
    # the stand-in probe's figures, or the real probe's against the slow stand-in vLLM
    assert re.search(r"p95 latency \d+(\.\d+)? ms (against \d+ ms before|after vs [\d.]+ ms "
                     r"before: more than)", out), out
    assert "rolled back to its last good state" in out
    assert rc == 2, out
    # h4 and h5 only planned (the first play); the gateway play at the end did not run
    # (gw ran only the keys play before the first batch: its recap says ok, not failed)
    assert _recap(out) == {"h1": 0, "h2": 1, "h3": 0, "h4": 0, "h5": 0, "gw": 0}, out
    assert _of(events, "gw") == ["gateway-keys-True"], events


def test_a_gate_failure_in_a_two_host_batch_rolls_back_that_host_and_finishes_the_other(tmp_path):
    """Item 10 (a), through the real HAProxy under load: h2's new stand-in vLLM answers
    1.5 s late, the real probe gate fails it, it is rolled back and re-enabled; h3 of the
    same batch finishes; no request fails and every server is UP at the end."""
    run = _fleet(tmp_path, HOSTS, probe_fail=["h2"], gateway=True)
    result, totals = _under_load(run.gateway, run)
    _check_gate_failure_in_a_two_host_batch(*result)
    print("[gate failure] " + re.search(r"UPGRADE STOPPED at h2[^\n]*", result[1]).group(0)[:300])
    print(f"[gate failure] exit {result[0]}; the gateway at the end: {_servers(run.gateway)}")
    assert set(_servers(run.gateway).values()) == {"UP"}, _servers(run.gateway)
    _no_request_failed(totals)


def test_control_a_backend_replaced_in_service_cuts_streams(tmp_path):
    """Control for the zeros of the gateway cases: the same HAProxy, stand-ins and load,
    but both hosts' stand-in vLLM replaced while in service (no drain, no idle wait), one
    after the other: the stream in flight on each is cut, and the load generator counts it."""
    import time
    run = _fleet(tmp_path, HOSTS[:2], gateway=True)

    def replace_in_service():
        time.sleep(2)
        for _ in range(3):
            for host in HOSTS[:2]:
                subprocess.run([sys.executable, str(STANDIN_VLLM), "restart",
                                str(tmp_path / "backends"), host], check=True)
                time.sleep(0.7)
    _, totals = _under_load(run.gateway, replace_in_service)
    assert totals["streams"]["failed"] > 0, totals
    assert any("cut mid-way" in f["why"] or "Error" in f["why"]
               for f in totals["streams"]["failures"]), totals


def test_control_the_old_play_keywords_strand_the_batch(tmp_path):
    """Control: upgrade.yml's former any_errors_fatal fails the check above (h2's rollback
    is cut short and h3 is failed into its own rescue or out of the play)."""
    run = _fleet(tmp_path, HOSTS, probe_fail=["h2"], play_keywords={"any_errors_fatal": True})
    rc, out, events = run()
    with pytest.raises(AssertionError):
        _check_gate_failure_in_a_two_host_batch(rc, out, events)
    # what the old shape did: h2 was never re-enabled, or h3 was never recorded
    assert "enabled" not in _of(events, "h2") or "record" not in _of(events, "h3"), events


def _check_refused_idle_host_shares_a_batch(rc, out, events):
    """h4 serves nothing and the compatibility gate refuses it, in a batch with serving
    hosts: it is left out, said so, and the others of its batch roll on; exit 0."""
    batch = re.search(r"\d+\. ([^;]*h4[^;]*)", out)
    assert batch and len(batch.group(1).split(", ")) >= 2, out
    assert "h4 serves nothing and the compatibility gate refused it" in out, out
    assert _of(events, "h4") == ["compat"], events
    for host in ("h1", "h2", "h3"):
        assert _of(events, host)[-2:] == ["enabled", "record"], (host, events)
    assert "UPGRADE STOPPED" not in out, out
    assert rc == 0, out


def test_a_refused_host_serving_nothing_shares_a_batch_with_serving_ones(tmp_path):
    """Item 10 (a), second half, through the real HAProxy under load."""
    run = _fleet(tmp_path, HOSTS[:4], serves_nothing=["h4"], compat_refuse=["h4"], fraction=1.0,
                 gateway=True)
    result, totals = _under_load(run.gateway, run)
    _check_refused_idle_host_shares_a_batch(*result)
    print(f"[refused host] exit {result[0]}; the gateway at the end: {_servers(run.gateway)}")
    assert set(_servers(run.gateway).values()) == {"UP"}, _servers(run.gateway)
    _no_request_failed(totals)


def test_control_the_old_play_keywords_stop_the_compatible_hosts(tmp_path):
    """Control: with any_errors_fatal the compatible hosts of h4's batch were stopped with
    the compatibility message and an empty reason (the README run of issue #31)."""
    run = _fleet(tmp_path, HOSTS[:4], serves_nothing=["h4"], compat_refuse=["h4"], fraction=1.0,
                 play_keywords={"any_errors_fatal": True})
    rc, out, events = run()
    with pytest.raises(AssertionError):
        _check_refused_idle_host_shares_a_batch(rc, out, events)
    assert rc != 0


# --- one rollout at a time (#31 item 3; a held lock and its take-over: the kill test below) -----
def test_a_limited_run_narrows_the_keys_first_and_releases_its_lock(tmp_path):
    """As the lab and the README's --limit runs do: the lock is released at the end. And a
    key rotation (#31 item 5, docs/security.md): in a run that holds the lock, the
    gateway's keys are narrowed before the first drain and written in full at the end.
    (Two runs of their own until CI stop 40: one run shows both.)"""
    run = _fleet(tmp_path, HOSTS[:3])
    rc, out, events = run("--limit", "h1,h2,gw")
    assert rc == 0, out
    assert _of(events, "h3") == [] and _of(events, "h2")[-1] == "record", events
    assert not (tmp_path / "rollout.lock").exists(), out
    assert _of(events, "gw") == ["gateway-keys-True", "gateway-config"], events
    assert events.index(("gw", "gateway-keys-True")) < events.index(("h1", "disabled")), events


def test_two_runs_started_at_once_one_runs_and_the_other_is_refused(tmp_path):
    """Item 10 (e), through the real HAProxy under load: two runs in the same second."""
    run = _fleet(tmp_path, HOSTS[:3], gateway=True)

    def both():
        first, second = run.start(), run.start()
        return [run.finish(first), run.finish(second)]
    results, totals = _under_load(run.gateway, both)
    codes = sorted(rc for rc, _, _ in results)
    assert codes[0] == 0 and codes[1] != 0, [out for _, out, _ in results]
    refused = next(out for rc, out, _ in results if rc != 0)
    assert "another rollout holds the fleet" in refused, refused
    events = run.events()
    # each host was drained once, by the run that held the lock
    assert all(_of(events, h).count("disabled") == 1 for h in HOSTS[:3]), events
    # the refused run did not touch the gateway's keys: only the lock holder did
    assert _of(events, "gw").count("gateway-keys-True") == 1, events
    assert not (tmp_path / "rollout.lock").exists()
    print(f"\n[two runs] exit codes {[rc for rc, _, _ in results]}; the refused run: "
          + re.search(r"another rollout holds the fleet[^\n]*", refused).group(0)[:200])
    assert set(_servers(run.gateway).values()) == {"UP"}, _servers(run.gateway)
    _no_request_failed(totals)


# --- a controller that dies mid-change (#31 items 1 and 2) ------------------------------------
@pytest.mark.parametrize("kill_at, left_at", [("h2 disabled", "draining"), ("h2 apply", "out_of_service")],
                         ids=["after-drain", "during-apply"])
def test_a_controller_killed_mid_change_is_resumed_by_the_next_run(tmp_path, kill_at, left_at):
    """Item 10 (b); after the drain also (d), through the real HAProxy under load: the host
    stays out (MAINT) with no run to re-enable it, through a reload of HAProxy (the role's
    save-state step, then SIGUSR2), until the next run resumes it."""
    after_drain = kill_at == "h2 disabled"
    # during the apply: three hosts are enough (h1 finished, h2 killed, h3 after it);
    # after the drain the refused reruns name all five
    run = _fleet(tmp_path, HOSTS if after_drain else HOSTS[:3], kill_at=kill_at, gateway=after_drain)
    totals = {}
    with _loaded(run.gateway, totals) if after_drain else contextlib.nullcontext():
        _killed_then_resumed(tmp_path, run, kill_at, left_at)
    if after_drain:
        _no_request_failed(totals)


def _killed_then_resumed(tmp_path, run, kill_at, left_at):
    rc, out, events = run()
    if run.gateway:
        port = run.gateway["ports"]["h2"]
        left = _servers(run.gateway)
        _reload(run.gateway)
        reloaded = _servers(run.gateway)
        print(f"\n[killed] the gateway after the kill: {left}; 3 s after a reload: {reloaded}")
        # h2 (and h3, if the batch's second drain ran before the kill) stays out through
        # the reload; the hosts the run had not drained (h4, h5) or had finished (h1) are UP
        out_before = {n for n, st in left.items() if st.startswith("MAINT")}
        assert f"h2_{port}" in out_before <= {n for n in left if n.startswith(("h2_", "h3_"))}, left
        assert {n for n, st in reloaded.items() if st.startswith("MAINT")} == out_before, (left, reloaded)
        assert {st for n, st in reloaded.items() if n not in out_before} == {"UP"}, reloaded
    assert rc == -9, out  # SIGKILL
    assert _state(tmp_path, "h1")["step"] == "recorded"
    left = _state(tmp_path, "h2")
    assert left["step"] == left_at, left
    mode = (tmp_path / "state" / "h2.json").stat().st_mode & 0o777
    assert mode == 0o600, oct(mode)
    print(f"[killed] left on h2: state/h2.json mode {mode:o}: {json.dumps(left)}")
    dead = json.loads((tmp_path / "rollout.lock").read_text())
    assert dead["rollout"] == left["rollout"]
    assert dead["holder"] and dead["scope"] == run.hosts and dead["started"]
    if kill_at == "h2 disabled":
        # the next run is refused by the dead run's lock, says who held it and how to take it
        # over, and a wrong id does not break it (nothing is drained meanwhile)
        rc, out, refused = run("-e", "standin_kill_at=")
        assert rc != 0 and (f"another rollout holds the fleet: rollout {dead['rollout']} by "
                            f"{dead['holder']}, started {dead['started']}, on h1, h2, h3, h4, h5") in out, out
        assert f"-e fleet_upgrade_break_lock={dead['rollout']}" in out, out
        rc, out, refused = run("-e", "standin_kill_at=", "-e", "fleet_upgrade_break_lock=19700101T000000Z-1")
        assert rc != 0 and "name that id to break it" in out, out
        assert refused == events, "a refused run drains nothing"
        assert json.loads((tmp_path / "rollout.lock").read_text()) == dead
    rc, out, _ = run("-e", "standin_kill_at=", "-e", f"fleet_upgrade_break_lock={dead['rollout']}")
    assert rc == 0, out
    assert f"taken over from rollout {dead['rollout']} of {dead['holder']}" in out, out
    assert f"h2 is held by rollout {dead['rollout']}: it was left at step '{left_at}'" in out, out
    plan = re.search(r"\d+ batches: 1\. (\S+) \(canary\)", out)
    assert plan and plan.group(1) in ("h2", "h3"), out  # a held host first
    assert f"resume rollout {dead['rollout']} (left at {left_at}" in out, out
    for host in run.hosts:
        assert _state(tmp_path, host).get("step") == "recorded", (host, _state(tmp_path, host))
    after_kill = run.events()[len(events):]
    assert _of(after_kill, "h2")[-2:] == ["enabled", "record"], after_kill
    assert not (tmp_path / "rollout.lock").exists()
    if run.gateway:
        print("[killed] the rerun: " + re.search(r"resume rollout [^)]+\)", out).group(0))
        assert set(_servers(run.gateway).values()) == {"UP"}, _servers(run.gateway)


def test_a_host_lost_mid_change_is_named_and_ends_the_rollout_after_its_batch(tmp_path):
    """SSH to h2 is lost during its apply, in the batch [h2, h3]: h3 finishes, the run names
    h2 with the last step written on it, the later batch [h4, h5] is untouched, the lock is
    released; the next run (h2 reachable again) resumes h2 first. Item 10 (c), through the
    real HAProxy under load: h2 stays out (MAINT) while it is lost, the others serve, and
    every server is UP after the resume."""
    run = _fleet(tmp_path, HOSTS, lose_at="h2 apply", gateway=True)
    with _loaded(run.gateway, {}) as totals:
        _lost_then_resumed(tmp_path, run)
    _no_request_failed(totals)


def _lost_then_resumed(tmp_path, run):
    rc, out, events = run()
    lost = _servers(run.gateway)
    stop = re.search(r"UPGRADE STOPPED after this batch: h2[^\n]*", out)
    print("\n[lost] " + (stop.group(0)[:300] if stop else "no stop message"))
    print(f"[lost] exit {rc}; the gateway while h2 is lost: {lost}")
    assert {n.split("_")[0] for n, st in lost.items() if st.startswith("MAINT")} == {"h2"}, lost
    assert rc != 0, out
    assert ("UPGRADE STOPPED after this batch: h2 became unreachable mid-change in rollout "
            in out and "the last step this run wrote on it: out_of_service" in out), out
    assert _of(events, "h3")[-2:] == ["enabled", "record"], events
    assert _of(events, "h4") == [] and _of(events, "h5") == [], events
    assert _state(tmp_path, "h2")["step"] == "out_of_service"
    assert not (tmp_path / "rollout.lock").exists(), out
    rc, out, _ = run("-e", "standin_lose_at=")
    assert rc == 0, out
    assert "resume rollout" in out and re.search(r"1\. h2 \(canary\)", out), out
    assert all(_state(tmp_path, h)["step"] == "recorded" for h in HOSTS)
    assert set(_servers(run.gateway).values()) == {"UP"}, _servers(run.gateway)


def test_control_without_the_state_a_rerun_leaves_the_applied_host_drained(tmp_path):
    """Control: the same kill during h2's apply, then a rerun that cannot see the state
    (the state file removed, as before this change): h2's plan says keep, so the rerun
    never re-enables it (the issue's report)."""
    run = _fleet(tmp_path, HOSTS[:3], kill_at="h2 apply")
    rc, _, events = run()
    assert rc == -9
    (tmp_path / "state" / "h2.json").unlink()
    (tmp_path / "state" / "h3.json").unlink(missing_ok=True)
    dead = json.loads((tmp_path / "rollout.lock").read_text())
    rc, out, _ = run("-e", "standin_kill_at=", "-e", f"fleet_upgrade_break_lock={dead['rollout']}")
    after_kill = run.events()[len(events):]
    assert "enabled" not in _of(after_kill, "h2"), after_kill
    assert "h2 (batch" in out and "nothing to change" in out


# --- the way back is checked before the drain (#31 item 7) ------------------------------------
def test_a_host_whose_record_names_an_image_gone_is_refused_before_the_drain(tmp_path):
    run = _fleet(tmp_path, HOSTS[:3], image_gone=["h1"])
    rc, out, events = run()
    assert rc == 2, out
    assert _of(events, "h1") == ["compat"], events  # never drained
    assert ("UPGRADE STOPPED at h1, nothing was changed (it still serves): its last-good record "
            "names the image vllm:old, which is no longer on the host") in out, out
    assert _of(events, "h2") == [] and _state(tmp_path, "h1") == {}
    assert not (tmp_path / "rollout.lock").exists(), "a stopped rollout releases the lock"


def test_control_with_downtime_allowed_the_same_host_is_changed(tmp_path):
    run = _fleet(tmp_path, HOSTS[:3], image_gone=["h1"])
    # on h1 alone (--limit): the refusal above is h1's, and so is this change
    rc, out, events = run("-e", "fleet_upgrade_allow_downtime=true", "--limit", "h1")
    assert rc == 0, out
    assert "no way back (its last-good record names the image vllm:old" in out
    assert _of(events, "h1") == ["compat", "disabled", "apply", "enabled", "record"], events
