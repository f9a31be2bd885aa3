"""Helpers for tests of module main() functions (ansible-core 2.19)."""
import json
import pathlib
import shutil
import subprocess

import pytest
from ansible.module_utils.testing import patch_module_args


class ModuleExit(Exception):
    def __init__(self, result, failed):
        super().__init__(result.get("msg", ""))
        self.result = result
        self.failed = failed


def run_module(main, args, monkeypatch, check_mode=False):
    """Run a module's main() with `args`; return (result dict, failed bool)."""
    from ansible.module_utils import basic

    def _exit(self, **kw):
        raise ModuleExit(kw, False)

    def _fail(self, msg, **kw):
        kw["msg"] = msg
        kw["failed"] = True
        raise ModuleExit(kw, True)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail)
    args = dict(args)
    if check_mode:
        args["_ansible_check_mode"] = True
    with patch_module_args(args):
        with pytest.raises(ModuleExit) as exc:
            main()
    # round-trip through JSON like Ansible does, so non-serialisable results fail here
    return json.loads(json.dumps(exc.value.result)), exc.value.failed


def run_playbook(inventory, playbook, host, extra_vars, check=False, timeout=900, verbosity=0,
                 with_output=False):
    """Run ansible-playbook with the json callback; return (rc, changed count of `host`,
    failure messages (task: msg, with failed loop items), names of changed tasks), and,
    with_output, its whole stdout and stderr last (to grep for secrets; -v x verbosity)."""
    import os
    import re
    import subprocess

    from conftest import ROOT

    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_FORCE_COLOR="0")
    args = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory), str(playbook),
            "-e", json.dumps(extra_vars)]
    if check:
        args.append("--check")
    if verbosity:
        args.append("-" + "v" * verbosity)
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    start = re.search(r"^\{", proc.stdout, re.M)  # profile_tasks may print lines first
    assert start, f"ansible-playbook printed no report: {proc.stdout}\n{proc.stderr}"
    report, _ = json.JSONDecoder().raw_decode(proc.stdout[start.start():])
    results = [(t["task"]["name"], res) for p in report["plays"] for t in p["tasks"]
               for res in t["hosts"].values()]
    failures = [f'{name}: {res.get("msg", "")} '
                + " ".join(str(i.get("msg", "")) for i in res.get("results", []) if i.get("failed"))
                + _failed_modules(res)
                for name, res in results if res.get("failed")]
    changed = [name for name, res in results if res.get("changed")]
    if with_output:
        return proc.returncode, report["stats"][host]["changed"], failures, changed, proc.stdout + proc.stderr
    return proc.returncode, report["stats"][host]["changed"], failures, changed


def run_role_preflight(tmp_path, role, extra_vars):
    """The role's preflight (include_role tasks_from: preflight) on localhost through
    run_playbook: (rc, failure messages, names of changed tasks)."""
    from conftest import ROOT

    play = tmp_path / "play.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                    "    - name: Preflight\n      ansible.builtin.include_role:\n"
                    f"        name: gpufleet.fleet.{role}\n        tasks_from: preflight\n")
    inventory = tmp_path / "hosts"
    inventory.write_text("localhost ansible_connection=local ansible_python_interpreter="
                         f"{ROOT / '.venv/bin/python'}\n")
    rc, _, failures, changed = run_playbook(inventory, play, "localhost", extra_vars)
    return rc, failures, changed


def _failed_modules(res):
    """Why each module of a failed fact gathering failed ("The following modules failed
    to execute: ansible.legacy.setup" says only which), so a failure in CI names it."""
    out = []
    for module, detail in (res.get("failed_modules") or {}).items():
        why = " ".join(str(detail.get(key, ""))[-400:] for key in
                       ("msg", "module_stderr", "module_stdout", "exception") if detail.get(key))
        out.append(f"[{module}: {why}]")
    return " ".join(out)


def sh(*args, check=True):
    """Run a command; return the CompletedProcess (text output captured)."""
    import subprocess

    return subprocess.run(args, capture_output=True, text=True, check=check)


def docker_answers():
    """True when a Docker engine answers here (`docker info`)."""
    import shutil
    import subprocess

    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def _wait_for_systemd(name, timeout=180):
    """Block until systemd in container `name` has booted ("running" or "degraded"), at
    most `timeout` seconds; then the first play meets a settled host (measured: about
    0.7 s after `docker run`, the first answer being "Failed to connect to bus")."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = sh("docker", "exec", name, "timeout", str(timeout), "systemctl",
                   "is-system-running", "--wait", check=False).stdout.strip()
        if state in ("running", "degraded"):
            return state
        time.sleep(0.5)
    return None


def debian_systemd_host(tmp_path_factory, prefix, playbook, extra_run_args=()):
    """Yield {"name", "work"}: a Debian 12 container running systemd (the offline base
    image) reached with the docker connection, and a work folder holding its inventory and
    `playbook`; the container is removed afterwards. Skips when the Docker engine is down;
    starts the lab's apt stand-in (127.0.0.1:8081) the host-stack roles install from."""
    import uuid

    from conftest import ROOT

    if not docker_answers():
        pytest.skip("docker engine not running (scripts/setup.sh starts it)")
    sh("bash", str(ROOT / "lab/apt/serve.sh"))
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    sh("docker", "run", "-d", "--name", name, "--network", "host", "--cap-add", "SYS_ADMIN",
       *extra_run_args, "--security-opt", "seccomp=unconfined",
       "--security-opt", "apparmor=unconfined", "--cgroupns", "host", "--tmpfs", "/run",
       "--tmpfs", "/run/lock", "--tmpfs", "/tmp:exec", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
       "--stop-signal", "SIGRTMIN+3", "gpufleet/debian:12", "/lib/systemd/systemd")
    try:
        # systemd in the container is still booting for a while after `docker run`; a
        # play that starts meanwhile can fail in fact gathering (CI, 2026-12-05, the
        # first play of test_hoststack_container_toolkit_lifecycle.py: "The following
        # modules failed to execute: ansible.legacy.setup"). Wait until boot is over
        # ("running" or "degraded"). Until systemd's bus is up, systemctl answers at once
        # ("Failed to connect to bus"), so ask again; --wait then blocks through boot.
        _wait_for_systemd(name)
        work = tmp_path_factory.mktemp(prefix)
        (work / "inventory.ini").write_text(
            f"{name} ansible_connection=community.docker.docker "
            "ansible_python_interpreter=/usr/bin/python3\n")
        (work / "site.yml").write_text(playbook)
        yield {"name": name, "work": work}
    finally:
        sh("docker", "rm", "-f", name, check=False)


# ---------------------------------------------------------------------------
# DeepSeek-V4: the tuner against vLLM's own KV cache planning
# ---------------------------------------------------------------------------
# The phrase of vLLM's own error the tuner's refusal must repeat, per kind of refusal
# (tests/differential/deepseek_v4_vllm.py records vLLM's messages).
DEEPSEEK_V4_REFUSALS = (
    ("No common block size for", "No common block size for {block_size}"),
    ("only supports fp8 kv-cache", "only supports fp8 kv-cache"),
)
# A tensor-parallel size vLLM refuses (tests/differential/families_vllm.py records its
# error): ModelConfig.verify_with_parallel_config ("Total number of attention heads
# (n) must be divisible by tensor parallel size (tp)"), and the KV-head split the
# model file's QKVParallelLinear asserts; the tuner's tune.tp_problem.
TP_REFUSALS = (
    ("must be divisible by tensor parallel size", "are not divisible by tensor parallel "
     "size {tp}"),
    # the model file's attention asserting the KV-head split (llama.py:151, 155, which
    # phi3.py reuses): kv heads % tp when tp < kv heads, else tp % kv heads
    ("assert self.total_num_kv_heads % tp_size == 0", "are not divisible by tensor "
     "parallel size {tp}"),
    ("assert tp_size % self.total_num_kv_heads == 0", "tensor parallel size {tp} is "
     "neither a divisor nor a multiple"),
)


def _layout_groups(t, layout, desc):
    """(layers, block size, bytes per block) of each KV cache group of a tuner layout;
    a layout of one page size lists only its groups' kinds, so the layers of each kind
    (desc["layer_kinds"]) are split as vLLM splits them (kv_memory._group_split)."""
    from gpufleet import kv_memory

    if "kv_cache_groups" in layout:
        return [(g["layers"], g["block_size"], g["page_bytes"])
                for g in layout["kv_cache_groups"]]
    kinds = desc["layer_kinds"]
    return [(layers, layout["block_size"], layers * layout["page_bytes"])
            for kind in dict.fromkeys(kinds)
            for layers in kv_memory._group_split(kinds.count(kind), layout["group_size"])]


def kv_plan_vs_vllm(recorded, refusals=()):
    """Compare gpufleet.tune with the JSON a tests/differential/ script printed
    (deepseek_v4_vllm.py, gemma4_vllm.py, families_vllm.py): vLLM's own KV cache plan
    per model and case. Returns (compared, refused, differences): numbers compared for equality,
    combinations both refused for the same reason (`refusals`: (vLLM's phrase, the
    tuner's), e.g. DEEPSEEK_V4_REFUSALS), and one line per mismatch. A case's own
    max_num_batched_tokens / async_scheduling win over the document's."""
    import re

    from gpufleet import model as m
    from gpufleet import tune as t
    from gpufleet import kv_memory

    root = pathlib.Path(__file__).resolve().parents[1]
    compared, refused, diffs = 0, 0, []
    for key, entry in recorded["models"].items():
        cfg = json.loads((root / entry["config"]).read_text())
        desc = m.describe_config(cfg, weights_bytes=1)
        # the scripts record the length vLLM serves without --max-model-len, which is
        # also the limit of its estimate (_estimate_max_model_len_from_groups)
        limit = t.default_max_len(desc)
        if limit != entry["derived_max_model_len"]:
            diffs.append(f"{key}: max_model_len from config {limit} != vLLM's "
                         f"{entry['derived_max_model_len']}")
        for case in entry["cases"]:
            where = (f"{key} {case.get('target', '')} tp={case['tp']} "
                     f"block={case['block_size']} kv={case['kv_cache_dtype']} "
                     f"len={case['max_model_len']}")
            error = case.get("error", "")
            mnbt = case.get("max_num_batched_tokens", recorded.get("max_num_batched_tokens"))
            try:
                problem = t.tp_problem(desc, case["tp"])
                if problem:
                    raise t.TuneError(problem)
                layout = kv_memory.kv_layout(desc, case["tp"], case["block_size"],
                                     case["kv_cache_dtype"],
                                     async_sched=case.get("async_scheduling",
                                                          recorded.get("async_scheduling")))
            except t.TuneError as exc:
                phrase = next((ours.format(**case) for theirs, ours in
                               refusals if theirs in error), None)
                if "bytes_per_block" in case or phrase is None:
                    diffs.append(f"{where}: the tuner refuses ({exc}), vLLM does not")
                elif phrase not in str(exc):
                    diffs.append(f"{where}: the tuner refuses with {exc!r}, not with "
                                 f"vLLM's reason {error!r}")
                else:
                    refused += 1
                continue
            if "bytes_per_block" not in case:
                diffs.append(f"{where}: vLLM refuses ({error}), the tuner does not")
                continue
            avail, length = case["available_bytes"], case["max_model_len"]
            num_blocks, _ = kv_memory.kv_tokens_from_bytes(layout, avail)
            ours = {"bytes_per_block": layout["bytes_per_block"],
                    "estimated_max_model_len": kv_memory.max_fitting_len(layout, avail, limit, mnbt),
                    "groups": _layout_groups(t, layout, desc)}
            theirs = {"bytes_per_block": case["bytes_per_block"],
                      "estimated_max_model_len": case["estimated_max_model_len"],
                      "groups": [(g["layers"], g["block_size"], g["page_bytes"])
                                 for g in case["groups"]]}
            if "num_blocks" in case:
                concurrency = kv_memory.max_concurrency(layout, num_blocks, length, mnbt)
                ours.update(num_blocks=num_blocks, max_concurrency=concurrency,
                            kv_cache_size_tokens=kv_memory.kv_cache_size_tokens(concurrency, length),
                            blocks_per_request=kv_memory.blocks_per_request(layout, length, mnbt))
                theirs.update({k: case[k] for k in ("num_blocks", "max_concurrency",
                                                    "kv_cache_size_tokens",
                                                    "blocks_per_request")})
            else:
                # vLLM: "... the estimated maximum model length is N. ..."
                found = re.search(r"estimated maximum model length is (\d+)", error)
                if "To serve at least one request" not in error or not found:
                    diffs.append(f"{where}: unexpected vLLM error {error!r}")
                    continue
                ours["fits"] = kv_memory.max_fitting_len(layout, avail, length, mnbt) >= length
                theirs["fits"] = False
                ours["estimate_in_error"] = kv_memory.max_fitting_len(layout, avail, length, mnbt)
                theirs["estimate_in_error"] = int(found.group(1))
            for name in theirs:
                compared += 1
                if ours[name] != theirs[name]:
                    diffs.append(f"{where}: {name} tuner {ours[name]!r} != vLLM "
                                 f"{theirs[name]!r}")
    return compared, refused, diffs


def pinning_lock(desc, repo_id="org/model"):
    """A lock (gpufleet.model_lock) pinning every Python file of a model description, as
    --trust-remote-code needs (issue #32 item 8): the folder's sha256 where the description
    has it, a placeholder for the modules auto_map names."""
    files = {path: digest or "0" * 64
             for path, digest in (desc.get("python_files") or {}).items()}
    return {"repo_id": repo_id, "commit": "0" * 40, "files": files or {"config.json": "0" * 64}}


def haproxy_path():
    """Debian's HAProxy, or the test is skipped (a skip fails under GPUFLEET_NO_SKIP)."""
    path = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not pathlib.Path(path).exists():
        pytest.skip("no haproxy (scripts/setup.sh installs Debian's)")
    return path


def start_haproxy(config, log):
    """HAProxy master-worker in the foreground on `config`, its messages to file `log`;
    the caller stops it (terminate, wait)."""
    return subprocess.Popen([haproxy_path(), "-W", "-db", "-f", str(config)],
                            stdout=subprocess.DEVNULL, stderr=pathlib.Path(log).open("w"))


def free_port():
    """A TCP port free on 127.0.0.1 now (the caller binds it soon after)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tls_server(tmp_path, name, body):
    """A stand-in HTTPS server on a free loopback port with the certificate ca_and_leaf
    wrote for `name` (tmp_path/<name>.crt, .key): GET answers 200 with body(path) (bytes),
    in a daemon thread. Returns the server (server_address[1] is its port; the caller
    stops it with shutdown())."""
    import http.server
    import ssl
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            data = body(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / f"{name}.crt", tmp_path / f"{name}.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def ca_and_leaf(tmp_path, name, dns=None, signer=None):
    """A CA (PEM file tmp_path/<name>-ca.crt) and a server certificate for 127.0.0.1 and the
    host name `dns` (default: name) it signed (<name>.crt, <name>.key); with signer (an
    earlier call's result), that CA signs it instead. Returns (CA key, CA name)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import datetime
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    if signer:
        ca_key, ca_name = signer
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns or name)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns or name),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    if not signer:
        (tmp_path / f"{name}-ca.crt").write_bytes(ca.public_bytes(pem))
    (tmp_path / f"{name}.crt").write_bytes(leaf.public_bytes(pem))
    (tmp_path / f"{name}.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    return ca_key, ca_name


def prometheus_config(tls):
    """roles/fleet_monitoring's prometheus.yml, rendered from its defaults (with
    __fleet_monitoring_tls as given) and parsed."""
    import importlib.util
    import pathlib

    import jinja2
    import yaml

    ROOT = pathlib.Path(__file__).resolve().parents[1]

    spec = importlib.util.spec_from_file_location("gpufleet_filters", ROOT / "plugins/filter/gpufleet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    role = ROOT / "roles" / "fleet_monitoring"
    variables = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    variables.update(ansible_managed="managed", __fleet_monitoring_tls=tls)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=False)
    env.filters.update({f"gpufleet.fleet.{name}": f for name, f in module.FilterModule().filters().items()})
    return yaml.safe_load(env.from_string((role / "templates" / "prometheus.yml.j2").read_text()).render(variables))
