"""Every option of every module in plugins/modules/ is typed and ranged (issue #32 item 9).

For each module the argument_spec is read from the module itself (AnsibleModule.__init__
is made to raise with it), a baseline of valid options is taken from BASELINES below, and
then each option in turn is fed, with the other options at the baseline:

- a value of the wrong type (str: a dict, int/float: 'x', list: a dict, dict: a list,
  bool: 'maybe', path: a list, raw: a dict),
- an empty value ('' / [] / {}),
- -1, 0, NaN and a huge value (10**18),
- for str, path and raw options a 10 MB string; for lists an empty item ('' / {} / []),
  and for lists of strings a 10 MB item.

Each case must end within BUDGET seconds (signal.setitimer; a longer one is taken for an
unbounded loop) in exit_json or fail_json, never in another exception (a traceback), and
a fail_json message must say what was wrong in words: no raw Python error (RAW_ERRORS)
and no echo of a huge value (at most MAX_MESSAGE characters).

Nothing outside tmp_path is written or reached: every case runs in check mode with the
working directory in tmp_path; every path of a baseline is under tmp_path (files are only
read from tests/fixtures/); the network is closed except loopback (network_guard: a
connection or a name lookup elsewhere raises OSError, and is counted). STAND-INS, each
real software on loopback or a fake of one call, named where it is defined:

- StubVllm: vLLM's OpenAI server on 127.0.0.1 (/health, /v1/models, /metrics,
  /v1/completions, /v1/embeddings), for vllm_ready and vllm_probe.
- tests/hfstub/server.py HubStub: a Hugging Face hub on 127.0.0.1, for hf_model (and to
  fetch the folder hf_mirror_index publishes).
- stats_socket: HAProxy's stats socket (a Unix socket in tmp_path answering `show stat`
  with tests/fixtures/haproxy/show-stat-2.6.12.csv), for vllm_gateway_stats.
- apt_repo: a file:// apt repository in tmp_path (a Packages index), for
  nvidia_repo_info and nvidia_driver_plan (trusted: no key, no gpg).
- FakeDocker: docker.from_env() for every module that talks to the Docker engine
  (cuda_compat with image, vllm_args_check, vllm_image_version, vllm_park, vllm_bench, vllm_serve_plan,
  vllm_ready with container, vllm_record with check_image): vllm_args_check starts a
  container even in check mode; the others would reach the host's engine.
- host_state._run: systemctl and docker answer "not installed" (rc 127), so host_state
  asks nothing of this host's services and containers.

Skipped: model_fetch_wait, a documentation stub whose main() only says it runs as an
action on the controller (its options are checked by gpufleet.fetch_wait.wait_options,
tests/unit/test_fetch_wait.py).

Run with -s to print the table: module, options fed, cases, passed, connections the
network guard refused (an option set to '' falls back to a public default, e.g. hf_model's
endpoint or NVIDIA's repository), and the slowest case in seconds.

Two kinds of text are not counted as raw errors: AnsibleModule's own refusals (choices,
type conversion), which quote the value whole before any module code runs (ANSIBLE_OWN),
and vllm_ready's "last: ValueError: /v1/models lists [...]" (the readiness loop names the
kind of the last failed poll, and says in words what it was).

Found at a1b538a, before options.check and the fixes beside it: 88 of 1991 cases failed
in 18 of 21 modules: 6 tracebacks (KeyError in vllm_bench_report and vllm_serve_plan,
OSError in hf_model and hf_mirror_index, NaN and OverflowError in vllm_gateway_stats),
7 cases past the budget (hf_model's 10 MB patterns, vllm_gateway_stats' watch_seconds,
vllm_probe's requests and idle_timeout, vllm_ready's timeout and warmup_requests), 4 raw
errors (NaN and OverflowError as request timeouts) and 71 messages echoing 10 MB.
"""
from __future__ import annotations

import errno
import http.server
import importlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import threading
import time
import traceback

import pytest

from conftest import FIXTURES, ROOT
from helpers import run_module
from hfstub.server import HubStub, Repo  # noqa: E402

BUDGET = 20.0        # seconds a case may take; more is an unbounded loop
MAX_MESSAGE = 16384  # characters of a fail_json message; more echoes a huge value
HUGE_INT = 10 ** 18
HUGE_STR = "x" * (10 * 1024 * 1024)
NAN = float("nan")

# What a message says when a Python error reached the user instead of words.
RAW_ERRORS = re.compile("|".join([
    r"object has no attribute", r"unsupported operand", r"division by zero",
    r"not subscriptable", r"object is not iterable", r"invalid literal for int",
    r"Traceback", r"KeyError", r"NoneType", r"not supported between instances",
    r"cannot convert float NaN", r"unhashable type", r"positional argument",
    r"expected str, bytes or os\.PathLike", r"must be real number",
    r"cannot be interpreted as an integer", r"can't multiply sequence",
    r"can only concatenate", r"index out of range", r"too large to convert",
    r"doesn't fit", r"timestamp too large", r"OverflowError", r"TypeError",
    r"Invalid value NaN",
]))

# AnsibleModule's own argument checks (choices, type conversion) quote the value whole;
# they are Ansible's messages, not the modules'.
ANSIBLE_OWN = re.compile(r"value of \S+ must be one (or more )?of: |argument '\S+' is of type ")

SKIPPED = {"model_fetch_wait": "documentation stub: runs only as an action on the "
                               "controller (plugins/action/model_fetch_wait.py)"}
MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py"))


# ------------------------------------------------------------------ the cases
WRONG = {"str": {"a": 1}, "path": ["a"], "int": "x", "float": "x", "list": {"a": 1},
         "dict": [1], "bool": "maybe", "raw": {"a": [1]}}
EMPTY = {"str": "", "path": "", "int": "", "float": "", "list": [], "dict": {}, "bool": "",
         "raw": ""}
EMPTY_ITEM = {"str": "", "dict": {}, "list": [], "int": "", "float": "", "path": ""}


def cases(spec):
    """(label, value) of each case for an option of argument_spec `spec`."""
    kind = spec.get("type", "str")
    out = [("wrong type", WRONG[kind]), ("empty", EMPTY[kind]), ("-1", -1), ("0", 0),
           ("NaN", NAN), ("huge", HUGE_INT)]
    if kind in ("str", "path", "raw"):
        out.append(("10 MB", HUGE_STR))
    if kind == "list":
        out.append(("empty item", [EMPTY_ITEM[spec.get("elements", "str")]]))
        if spec.get("elements", "str") in ("str", "path"):
            out.append(("10 MB item", [HUGE_STR]))
    return out


class _SpecSeen(Exception):
    pass


def argument_spec(module, monkeypatch):
    """(argument_spec, the other keyword arguments) the module gives AnsibleModule."""
    from ansible.module_utils import basic

    def capture(self, argument_spec, **kwargs):
        raise _SpecSeen(argument_spec, kwargs)

    with monkeypatch.context() as m:
        m.setattr(basic.AnsibleModule, "__init__", capture)
        with pytest.raises(_SpecSeen) as seen:
            module.main()
    return seen.value.args


# ------------------------------------------------------------------ budget and verdict
class _Budget(BaseException):
    """Raised by SIGALRM in the main thread: not an Exception, so no module catches it."""


def run_case(main, args, monkeypatch, check_mode=True):
    """('exit' | 'fail' | 'budget' | 'exception', result dict or text, seconds)."""
    def alarm(signum, frame):
        raise _Budget()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, BUDGET)
    start = time.monotonic()
    try:
        try:
            result, failed = run_module(main, args, monkeypatch, check_mode=check_mode)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return ("fail" if failed else "exit"), result, time.monotonic() - start
    except _Budget:
        return "budget", f"still running after {BUDGET:g} s", time.monotonic() - start
    except KeyboardInterrupt:
        raise
    except BaseException:  # a traceback, or main() returning without exit_json/fail_json
        return "exception", traceback.format_exc(limit=-4), time.monotonic() - start
    finally:
        signal.signal(signal.SIGALRM, old)


def problem(outcome, result):
    """Why a case's outcome is a hole, or None."""
    if outcome == "budget":
        return result
    if outcome == "exception":
        return "traceback: " + result.strip().splitlines()[-1][:300]
    if outcome == "fail":
        msg = result.get("msg")
        if not isinstance(msg, str) or not msg.strip():
            return f"fail_json without a message: {msg!r:.200}"
        raw = RAW_ERRORS.search(msg)
        if raw:
            return f"raw Python error ({raw.group(0)!r}): {msg[:300]}"
        if len(msg) > MAX_MESSAGE and not ANSIBLE_OWN.match(msg):
            return f"message of {len(msg)} characters: {msg[:200]}..."
    return None


def shown(value):
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} chars)"


# ------------------------------------------------------------------ network guard
@pytest.fixture
def network_guard(monkeypatch, tmp_path):
    """Only loopback and Unix sockets under tmp_path: anything else raises OSError and is
    recorded in the returned list."""
    attempts = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def allowed(family, address):
        if family == socket.AF_UNIX:
            path = address.decode() if isinstance(address, bytes) else str(address)
            return not os.path.isabs(path) or path.startswith(str(tmp_path))
        try:
            return ipaddress.ip_address(str(address[0]).split("%")[0]).is_loopback
        except ValueError:
            return False

    def connect(self, address):
        if not allowed(self.family, address):
            attempts.append(repr(address)[:100])
            raise OSError(errno.ENETUNREACH, "network closed by test_module_inputs")
        return real_connect(self, address)

    def connect_ex(self, address):
        if not allowed(self.family, address):
            attempts.append(repr(address)[:100])
            return errno.ENETUNREACH
        return real_connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in (None, "localhost"):
            try:
                ipaddress.ip_address(str(name).strip("[]").split("%")[0])
            except ValueError:
                attempts.append(f"name lookup {str(name)[:80]}")
                raise socket.gaierror(socket.EAI_NONAME, "name lookup closed by "
                                                         "test_module_inputs") from None
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return attempts


# ------------------------------------------------------------------ stand-ins
class StubVllm(http.server.BaseHTTPRequestHandler):
    """STAND-IN for vLLM's OpenAI server on loopback: ready, idle, serving model "m"."""

    def log_message(self, *args):
        pass

    def _send(self, code, body, kind="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, "")
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
        elif self.path == "/metrics":
            self._send(200, 'vllm:num_requests_running{model_name="m"} 0.0\n'
                            'vllm:num_requests_waiting{model_name="m"} 0.0\n', "text/plain")
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/completions":
            self._send(200, {"choices": [{"text": " world", "index": 0}],
                             "usage": {"prompt_tokens": 2, "completion_tokens": 1}})
        elif self.path == "/v1/embeddings":
            self._send(200, {"data": [{"embedding": [0.1, 0.2], "index": 0}]})
        else:
            self._send(404, {"error": "not found"})


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that hung up (a 10 MB header answered 431): not this test's output


@pytest.fixture(scope="module")
def vllm_url():
    server = _QuietServer(("127.0.0.1", 0), StubVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


HUB_FILES = {"config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}',
             "model.safetensors": b"\0" * 4096}


@pytest.fixture(scope="module")
def hub_stub():
    with HubStub([Repo("org/tiny", HUB_FILES)]) as stub:
        yield stub


@pytest.fixture(scope="module")
def fetched_model(hub_stub, tmp_path_factory):
    """A model folder fetched and verified by gpufleet.hub from the stand-in hub."""
    from gpufleet import hub, hub_client

    folder = tmp_path_factory.mktemp("fetched") / "tiny"
    hub.sync_repo(hub_client.HubClient(hub_stub.url), "org/tiny", "main", folder)
    return folder


@pytest.fixture
def stats_socket(tmp_path):
    """STAND-IN for HAProxy's stats socket: each connection gets the captured `show stat`."""
    path = str(tmp_path / "admin.sock")
    text = (FIXTURES / "haproxy" / "show-stat-2.6.12.csv").read_bytes()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(100)
                conn.sendall(text)

    threading.Thread(target=serve, daemon=True).start()
    yield path
    server.close()


def apt_repo(tmp_path):
    """A file:// apt repository (its Packages index) with NVIDIA's driver packages."""
    folder = tmp_path / "apt"
    folder.mkdir(exist_ok=True)
    names = ["nvidia-open", "nvidia-driver", "nvidia-driver-cuda", "nvidia-kernel-open-dkms",
             "nvidia-kernel-dkms", "cuda-drivers", "cuda-drivers-580", "nvidia-open-580",
             "nvidia-driver-580", "nvidia-fabricmanager", "nvidia-fabricmanager-580",
             "nvidia-driver-pinning-580", "cuda-toolkit-12-8", "nvidia-container-toolkit"]
    (folder / "Packages").write_text("".join(
        f"Package: {name}\nVersion: 580.95.05-1\nArchitecture: amd64\n\n" for name in names))
    return f"file://{folder}/"


class FakeContainer:
    """A docker SDK container (stand-in): running, with `attrs` as docker inspect gives."""

    def __init__(self, name, attrs=None, status="running"):
        self.name, self.status, self.labels = name, status, {}
        self.attrs = attrs or {"State": {"Status": status}, "RestartCount": 0,
                               "Image": "sha256:" + "ab" * 32,
                               "NetworkSettings": {"Ports": {}}}

    def reload(self):
        pass

    def logs(self, **kwargs):
        return b"INFO loading\n"

    def wait(self, timeout=None):
        return {"StatusCode": 1}

    def stop(self, timeout=None):
        self.status = "exited"

    def start(self):
        self.status = "running"

    def rename(self, name):
        self.name = name

    def remove(self, force=False):
        pass

    def get_archive(self, path):
        import docker.errors
        raise docker.errors.NotFound(path)


class FakeDocker:
    """STAND-IN for docker.from_env(): containers (get, list, run) and images (get) of an
    engine holding the serving container "vllm-smol" (as tests/unit/test_bench_run.py),
    a container "vllm-m" and the CUDA image "nvidia/cuda:12.4.1"; run() returns a container
    that exited 1 with the log of a vLLM that accepted its arguments and found no model
    (or, for vllm_image_version's python3 probe, exited 0 printing "vllm 0.32.0+cpu")."""

    def __init__(self):
        self.containers, self.images, self.api = _Containers(), _Images(), None


class _Containers:
    def get(self, name):
        import docker.errors
        if name == "vllm-smol":
            return FakeContainer(name, _serving_attrs())
        if name == "vllm-m":
            return FakeContainer(name)
        raise docker.errors.NotFound(f"No such container: {str(name)[:80]}")

    def list(self, all=False, filters=None):
        return []

    def run(self, image, **kwargs):
        container = FakeContainer(kwargs.get("name") or "run", status="exited")
        if (kwargs.get("entrypoint") or [""])[0] == "python3":  # vllm_image_version's probe
            container.logs = lambda **kw: b"vllm 0.32.0+cpu\n"
            container.wait = lambda timeout=None: {"StatusCode": 0}
            return container
        log = (FIXTURES / "serve" / "args-accepted-no-model.log").read_bytes()
        container.logs = lambda **kw: log
        return container


class _Images:
    def get(self, name):
        import docker.errors
        if name in ("nvidia/cuda:12.4.1", "sha256:" + "ab" * 32):
            image = FakeContainer(name)
            image.attrs = {"Config": {"Env": ["CUDA_VERSION=12.4.1",
                                              "NVIDIA_REQUIRE_CUDA=cuda>=12.4"],
                                      "Labels": {}}}
            return image
        raise docker.errors.ImageNotFound(f"No such image: {str(name)[:80]}")


def _serving_attrs():
    return {"Name": "/vllm-smol", "Image": "sha256:" + "ab" * 32,
            "Config": {"Image": "gpufleet/vllm-cpu:lab",
                       "Cmd": ["/models/smol", "--max-model-len", "4096", "--served-model-name",
                               "smol", "--host", "127.0.0.1", "--port", "18000"],
                       "Env": ["PATH=/usr/bin", "OMP_NUM_THREADS=1"]},
            "HostConfig": {"NetworkMode": "host", "DeviceRequests": None, "Runtime": "runc"},
            "Mounts": [{"Type": "bind", "Source": "/srv/models/smol",
                        "Destination": "/models/smol", "RW": False}],
            "State": {"Status": "running"}, "RestartCount": 0}


# ------------------------------------------------------------------ baselines
LLAMA = json.loads((FIXTURES / "models" / "llama-3.1-8b" / "config.json").read_text())
H100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
        "compute_capability": "9.0"}
BENCH_RESULT = json.loads((FIXTURES / "bench" / "serve-c8-1000x512.json").read_text())


def _file_sd(host="gpu1", port=8000, model="m"):
    return {"targets": [f"127.0.0.1:{port}"],
            "labels": {"host": host, "container": f"vllm-{host}", "model": model,
                       "served_model_name": model, "runner": "generate", "port": str(port)}}


def _bench_points():
    from gpufleet import bench_gpu, bench_results

    data = dict(BENCH_RESULT, instance="h1:8000")
    return [{"instance": "h1:8000", "host": "h1", "status": "ok", "result": data,
             "row": bench_results.point_from_result(data), "error": None, "log_tail": "",
             "gpu": bench_gpu.summarise_gpu_samples([], None, None), "command": ["bench"]}]


def _model_dir(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    shutil.copy(FIXTURES / "models" / "llama-3.1-8b" / "config.json", folder / "config.json")
    return folder


# module -> [(variant, baseline(ctx) -> options)]; ctx: tmp_path and the stand-ins.
BASELINES = {
    "cuda_compat": [
        ("cuda_version", lambda c: {"driver_version": "550.54.15", "cuda_version": "12.4",
                                    "compute_capabilities": ["9.0"]}),
        ("image", lambda c: {"driver_branch": "580", "image": "nvidia/cuda:12.4.1"}),
    ],
    "gpu_facts": [
        ("pci", lambda c: {"sources": ["pci"], "sysfs_root": str(c["tmp"] / "sys"),
                           "nvidia_smi_path": str(c["tmp"] / "nvidia-smi")}),
        ("xml", lambda c: {"nvidia_smi_xml": str(FIXTURES / "nvidia-smi" /
                                                 "netdata-rtx-3060.xml")}),
    ],
    "hf_mirror_index": [
        ("folder", lambda c: {"root": str(c["tmp"] / "site"),
                              "models": [{"path": str(c["fetched_model"]),
                                          "repo_id": "org/tiny"}]}),
    ],
    "hf_model": [
        ("stub hub", lambda c: {"repo_id": "org/tiny", "dest": str(c["tmp"] / "tiny"),
                                "endpoint": c["hub_stub"].url, "timeout": 5, "retries": 0,
                                "deadline": 15}),
        ("nothing listens", lambda c: {"repo_id": "org/tiny", "dest": str(c["tmp"] / "tiny"),
                                       "endpoint": "http://127.0.0.1:9", "timeout": 1,
                                       "retries": 0, "deadline": 5}),
    ],
    "hf_model_lock": [
        ("stub hub", lambda c: {"repo_id": "org/tiny", "endpoint": c["hub_stub"].url,
                                "path": str(c["tmp"] / "tiny.lock.yml"), "timeout": 5,
                                "retries": 0}),
    ],
    "host_state": [
        ("check", lambda c: {"state": "check", "path": str(c["tmp"] / "host-state.json"),
                             "inputs_digest": "a" * 64, "published": {},
                             "nvidia_smi_xml": str(FIXTURES / "nvidia-smi" /
                                                   "netdata-rtx-3060.xml"),
                             "rollout_state_path": str(c["tmp"] / "rollout-state.json")}),
        ("record", lambda c: {"state": "record", "path": str(c["tmp"] / "host-state.json"),
                              "inputs_digest": "a" * 64, "published": {"k": "v"},
                              "nvidia_smi_xml": str(FIXTURES / "nvidia-smi" /
                                                    "netdata-rtx-3060.xml"),
                              "rollout_state_path": str(c["tmp"] / "rollout-state.json")}),
    ],
    "nvidia_driver_plan": [
        ("file repo", lambda c: {"branch": "580", "distribution": "Debian",
                                 "distribution_version": "12", "architecture": "x86_64",
                                 "repo_url": apt_repo(c["tmp"]), "trusted": True,
                                 "sysfs_root": str(c["tmp"] / "sys"), "timeout": 2,
                                 "devices": [{"compute_capability": "9.0",
                                              "name": "NVIDIA H100"}]}),
    ],
    "nvidia_repo_info": [
        ("file repo", lambda c: {"component": "cuda", "distribution": "Debian",
                                 "distribution_version": "12", "architecture": "x86_64",
                                 "repo_url": apt_repo(c["tmp"]), "trusted": True,
                                 "packages": ["nvidia-open"], "setting": "cuda_toolkit_repo_url",
                                 "timeout": 2}),
    ],
    "rollout_lock": [
        ("present", lambda c: {"path": str(c["tmp"] / "rollout.lock"), "state": "present",
                               "rollout": "r1", "holder": "ctl", "scope": ["h1"]}),
    ],
    "rollout_state": [
        ("present", lambda c: {"path": str(c["tmp"] / "rollout-state.json"),
                               "state": "present", "rollout": "r1", "step": "draining"}),
    ],
    "vllm_args_check": [
        ("fake docker", lambda c: {"image": "gpufleet/vllm-cpu:lab", "name": "vllm-m-check",
                                   "command": ["/models/m", "--max-model-len", "4096"],
                                   "env": {"A": "1"}, "timeout": 30}),
    ],
    "vllm_image_version": [
        ("fake docker", lambda c: {"image": "gpufleet/vllm-cpu:lab", "name": "vllm-version-check",
                                   "timeout": 30}),
    ],
    "vllm_bench": [
        ("plan", lambda c: {"container": "vllm-smol", "target": "127.0.0.1:18000",
                            "served_model_name": "smol", "concurrency": [1, 2],
                            "pairs": [[32, 16]]}),
        ("point", lambda c: {"container": "vllm-smol", "target": "127.0.0.1:18000",
                             "served_model_name": "smol",
                             "point": {"input_len": 32, "output_len": 16, "concurrency": 2,
                                       "num_prompts": 4}}),
    ],
    "vllm_bench_report": [
        ("one point", lambda c: {"output_dir": str(c["tmp"] / "bench"),
                                 "run_id": "20261202T170000Z", "points": _bench_points(),
                                 "instances": [{"instance": "h1:8000", "host": "h1",
                                                "container": "vllm-m", "model": "Org/M",
                                                "served_model_name": "Org/M",
                                                "image": "vllm/vllm-openai:v0.32.0",
                                                "settings": {"tensor_parallel_size": 1},
                                                "max_model_len": 4096, "notes": [],
                                                "gpu_facts": {"present": False}}],
                                 "matrix": {"preset": "lab"}}),
    ],
    "vllm_gateway_plan": [
        ("fleet", lambda c: {"instances": [_file_sd("gpu1", 8000), _file_sd("gpu2", 8000)],
                             "frontends": [{"served_model_name": "m", "port": 9000}],
                             "metrics_port": 8405}),
    ],
    "vllm_gateway_stats": [
        ("watch", lambda c: {"socket": c["stats_socket"], "server_host": "lab-h200",
                             "watch_seconds": 1, "interval": 1.0}),
    ],
    "vllm_instances": [
        ("one host", lambda c: {"path": str(c["tmp"] / "instances.json"),
                                "plans": [{"host": "gpu1",
                                           "instances": [{"file_sd": _file_sd()}]}]}),
    ],
    "vllm_park": [
        ("parked", lambda c: {"name": "vllm-m", "state": "parked", "stop_timeout": 60}),
    ],
    "vllm_probe": [
        ("stub vllm", lambda c: {"url": c["vllm_url"], "served_model_name": "m",
                                 "wait_idle": True, "idle_timeout": 2, "requests": 2,
                                 "request_timeout": 5, "attempts": 2,
                                 "baseline": {"count": 2, "errors": 0, "error_rate": 0.0,
                                              "p50_ms": 5.0, "p95_ms": 6.0, "max_ms": 6.0}}),
        ("nothing listens", lambda c: {"url": "http://127.0.0.1:9", "served_model_name": "m",
                                       "wait_idle": True, "idle_timeout": 1, "requests": 1,
                                       "request_timeout": 1}),
    ],
    "vllm_ready": [
        ("stub vllm", lambda c: {"url": c["vllm_url"], "served_model_name": "m", "timeout": 2,
                                 "interval": 1, "request_timeout": 5, "warmup_requests": 1,
                                 "container": "vllm-m"}),
        ("nothing listens", lambda c: {"url": "http://127.0.0.1:9", "served_model_name": "m",
                                       "timeout": 1, "interval": 1, "request_timeout": 1}),
    ],
    "vllm_record": [
        ("present", lambda c: {"path": str(c["tmp"] / "vllm-last-good.json"),
                               "state": "present",
                               "record": {"version": 2, "image_id": "sha256:" + "ab" * 32}}),
        ("read", lambda c: {"path": str(c["tmp"] / "vllm-last-good.json"), "state": "read",
                            "check_image": True}),
    ],
    "vllm_serve_plan": [
        ("one model", lambda c: {"models": [{"name": "m", "path": str(_model_dir(c["tmp"]))}],
                                 "tunes": [{"args": ["--tensor-parallel-size", "1"],
                                            "settings": {"tensor_parallel_size": 1,
                                                         "runner": "generate", "docker": {},
                                                         "env": {}}}],
                                 "image": "img:1", "image_id": "sha256:aa", "port": 8000,
                                 "gpu_runtime": "none", "host_name": "gpu1",
                                 "check_ports": False}),
    ],
    "vllm_tune": [
        ("config", lambda c: {"model_config": LLAMA, "weights_bytes": 16 * 2 ** 30,
                              "gpus": [H100]}),
        ("path", lambda c: {"model_path": str(_model_dir(c["tmp"])),
                            "weights_bytes": 16 * 2 ** 30, "gpu_facts": {"devices": [H100]}}),
    ],
}

# What a module's stand-ins need (fixtures by name), beyond tmp_path.
NEEDS = {"hf_model": ["hub_stub"], "hf_model_lock": ["hub_stub"], "hf_mirror_index": ["fetched_model"],
         "vllm_probe": ["vllm_url"], "vllm_ready": ["vllm_url"],
         "vllm_gateway_stats": ["stats_socket"]}

TABLE = []


@pytest.fixture(scope="module", autouse=True)
def print_table():
    yield
    if not TABLE:
        return
    width = max(len(row[0]) for row in TABLE)
    lines = [f"{'module':<{width}}  options  cases  passed  network blocked  slowest",
             *(f"{m:<{width}}  {o:>7}  {c:>5}  {p:>6}  {n:>15}  {s:>6.1f}s"
               for m, o, c, p, n, s in TABLE)]
    print("\n" + "\n".join(lines))


def test_every_module_has_a_baseline():
    assert set(MODULES) - set(SKIPPED) == set(BASELINES)


@pytest.mark.parametrize("name", [m for m in MODULES if m not in SKIPPED])
def test_every_option_is_typed_and_ranged(name, request, tmp_path, monkeypatch,
                                          network_guard):
    import docker

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(docker, "from_env", lambda *a, **kw: FakeDocker())
    module = importlib.import_module(name)
    if name == "host_state":
        monkeypatch.setattr(module, "_run", lambda mod: lambda argv: (127, ""))
    ctx = {"tmp": tmp_path}
    for fixture in NEEDS.get(name, []):
        ctx[fixture] = request.getfixturevalue(fixture)
    (tmp_path / "sys").mkdir()
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")  # never run: sources pci
    (tmp_path / "nvidia-smi").chmod(0o755)
    spec, _ = argument_spec(module, monkeypatch)

    holes, count, slowest = [], 0, 0.0
    for variant, baseline in BASELINES[name]:
        base = baseline(ctx)
        outcome, result, seconds = run_case(module.main, base, monkeypatch)
        expected = "fail" if variant == "nothing listens" else "exit"
        assert outcome == expected, f"{name} baseline {variant}: {outcome}: {result}"
        for option in sorted(spec):
            for label, value in cases(spec[option]):
                count += 1
                outcome, result, seconds = run_case(module.main, dict(base, **{option: value}),
                                                    monkeypatch)
                slowest = max(slowest, seconds)
                why = problem(outcome, result)
                if why:
                    holes.append(f"{name} [{variant}] {option}={shown(value)} ({label}): {why}")
    TABLE.append((name, len(spec), count, count - len(holes), len(network_guard), slowest))
    assert not holes, f"{len(holes)} of {count} cases:\n" + "\n".join(holes)

