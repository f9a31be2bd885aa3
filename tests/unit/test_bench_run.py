"""Running the benchmark: the pure helpers gpufleet.bench adds for it (plan, argv, env,
container inspection, GPU samples, knee facts) and plugins/modules/vllm_bench.py's main() with a
fake docker client (stand-in for the Docker engine: it records what would run and answers
with the saved results of tests/fixtures/bench)."""
import io
import json
import tarfile

import pytest
from docker import errors as docker_errors

import vllm_bench
from conftest import FIXTURES
from gpufleet import bench as b
from gpufleet import bench_analysis, bench_gpu, bench_results
from helpers import run_module

FIXTURE = FIXTURES / "bench" / "serve-c8-1000x512.json"
NO_SERVER = FIXTURES / "bench" / "lab-vllm-0.32-no-server-c2-32x16.json"
KEY = "sk-test-secret-123"


# ---------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------

def test_plan_adds_prompts_and_clips():
    plan = b.bench_plan([1, 4, 8], [(1000, 512), (4000, 512)], max_model_len=2048, min_prompts=50)
    assert [(p["input_len"], p["concurrency"], p["num_prompts"]) for p in plan["points"]] == [
        (1000, 1, 50), (1000, 4, 50), (1000, 8, 80), (1536, 1, 50), (1536, 4, 50), (1536, 8, 80)]
    assert len(plan["notes"]) == 1 and "(4000, 512)" in plan["notes"][0]
    unknown = b.bench_plan([1], [(10, 10)], None, 5)
    assert "max_model_len unknown" in unknown["notes"][0]


def test_presets_are_the_constants():
    assert b.PRESETS["lab"] == {"concurrency": b.LAB_CONCURRENCY, "pairs": b.LAB_PAIRS}
    assert b.PRESETS["default"]["pairs"] == b.DEFAULT_PAIRS


def test_percentile_flags():
    assert b.percentile_flags(["50", 90, 99]) == b.BENCH_SERVE_FLAGS
    assert b.percentile_flags([99, 95, 50, 90])[-1] == "50,90,95,99"
    with pytest.raises(b.BenchError, match="lack 90"):
        b.percentile_flags([50, 99])
    with pytest.raises(b.BenchError):
        b.percentile_flags([50, 90, 99, 100])


def test_command_has_every_flag_and_metadata_last():
    argv = b.bench_serve_command({"input_len": 32, "output_len": 16, "concurrency": 2,
                                  "num_prompts": 20}, host="127.0.0.1", port=18000,
                                 model="m", tokenizer="/models/m", instance="h:18000",
                                 result_dir="/tmp/r", result_filename="r.json")
    flags = dict(zip(argv, argv[1:]))
    assert argv[:2] == ["bench", "serve"]
    assert flags["--random-input-len"] == "32" and flags["--random-output-len"] == "16"
    assert flags["--num-prompts"] == "20" and flags["--max-concurrency"] == "2"
    assert flags["--dataset-name"] == "random" and "--ignore-eos" in argv
    assert argv[-4:] == ["--metadata", "instance=h:18000", "input_len=32", "output_len=16"]
    for flag in b.BENCH_SERVE_FLAGS:
        assert flag in argv


def serving_attrs(max_len="1024", name="vllm-smol", env=None):
    return {"Name": "/" + name, "Image": "sha256:" + "ab" * 32,
            "Config": {"Image": "gpufleet/vllm-cpu:lab",
                       "Cmd": ["/models/smol", "--max-model-len", max_len, "--max-num-seqs", "256",
                               "--dtype", "float32", "--served-model-name", "smol", "--host",
                               "127.0.0.1", "--port", "18000"],
                       "Env": env or ["PATH=/opt/venv/bin:/usr/bin", "VLLM_API_KEY=" + KEY,
                                      "VLLM_CPU_OMP_THREADS_BIND=nobind", "HF_TOKEN=hf_x",
                                      "OMP_NUM_THREADS=1"]},
            "HostConfig": {"NetworkMode": "host", "DeviceRequests": None, "Runtime": "runc"},
            "Mounts": [{"Type": "bind", "Source": "/srv/models/smol", "Destination": "/models/smol",
                        "RW": False}]}


def test_instance_from_inspect():
    info = b.instance_from_inspect(serving_attrs())
    assert info["max_model_len"] == 1024 and info["model_path"] == "/models/smol"
    assert info["model_mount"] == {"source": "/srv/models/smol", "target": "/models/smol"}
    assert info["image"] == "gpufleet/vllm-cpu:lab" and info["image_id"].startswith("sha256:")
    assert info["settings"] == {"tensor_parallel_size": 1, "max_model_len": 1024,
                                "max_num_seqs": 256, "dtype": "float32"}
    assert "VLLM_API_KEY" not in info["env"] and "HF_TOKEN" not in info["env"]
    assert info["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert b.settings_text(info["settings"]) == "tp=1 len=1024 seqs=256 float32"
    assert b.instance_from_inspect(serving_attrs(max_len="4k"))["max_model_len"] == 4000
    attrs = serving_attrs()
    attrs["Config"]["Cmd"] = attrs["Config"]["Cmd"][3:]
    attrs["Config"]["Cmd"][0:0] = ["/models/smol"]
    assert b.instance_from_inspect(attrs)["max_model_len"] is None


def test_bench_env_carries_the_key_only_as_openai_api_key():
    env = b.bench_env({"OMP_NUM_THREADS": "1", "VLLM_API_KEY": KEY}, KEY)
    assert env["OPENAI_API_KEY"] == KEY and "VLLM_API_KEY" not in env
    assert env["HF_HUB_OFFLINE"] == "1" and "OPENAI_API_KEY" not in b.bench_env({}, "")


def test_loopback_and_targets():
    assert b.is_loopback("127.0.0.1") and b.is_loopback("::1") and b.is_loopback("localhost")
    assert not b.is_loopback("10.0.0.5") and not b.is_loopback("gpu01")
    assert b.split_target("[::1]:8000") == ("::1", 8000)
    assert b.split_target("10.0.0.5:18000") == ("10.0.0.5", 18000)
    with pytest.raises(b.BenchError):
        b.split_target("10.0.0.5")


def test_plan_instances_skips_pooling():
    entries = [{"targets": ["127.0.0.1:18000"], "labels": {"host": "h1", "container": "c1",
                "model": "m", "served_model_name": "m", "runner": "generate", "port": "18000"}},
               {"targets": ["127.0.0.1:18100"], "labels": {"host": "h2", "container": "c2",
                "model": "e", "served_model_name": "e", "runner": "pooling", "port": "18100"}}]
    plan = b.plan_instances(entries)
    assert [i["container"] for i in plan["run"]] == ["c1"]
    assert "pooling" in plan["skipped"][0]["reason"]
    assert b.plan_instances(entries, hosts=["h2"])["run"] == []


def test_parse_dmon_and_summary():
    text = ("# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa     fb   bar1\n"
            "# Idx      W      C      C      %      %      %      %      %      %     MB     MB\n"
            "    0     70     35      -     10      3      0      0      0      0  40000      2\n"
            "    1     90     36      -      -      3      0      0      0      0  41000      2\n"
            "    0     80     35      -     30      9      0      0      0      0  42000      2\n")
    samples = bench_gpu.parse_dmon(text)
    assert len(samples) == 3 and samples[1]["util"] is None
    summary = bench_gpu.summarise_gpu_samples(samples, "nvidia-smi dmon")
    assert summary["sampled"] and summary["devices"][0] == {
        "index": 0, "samples": 2, "util_mean": 20.0, "util_max": 30.0, "mem_util_mean": 6.0,
        "mem_util_max": 9.0, "fb_max_mib": 42000.0, "power_mean_w": 75.0}
    none = bench_gpu.summarise_gpu_samples([])
    assert not none["sampled"] and none["reason"] == "no GPU on this host: no utilisation sampled"


def test_no_server_result_from_vllm_032_is_a_measured_point_with_failed_requests():
    row = bench_results.point_from_result(NO_SERVER)
    assert (row["completed"], row["failed"], row["concurrency"]) == (0, 4, 2)
    group = bench_analysis.analyse([row])[0]
    assert group["cliff"]["rule"] == "failed_requests"


# ---------------------------------------------------------------------------
# The module, with a fake docker client
# ---------------------------------------------------------------------------

class FakeBench:
    def __init__(self, client, kwargs):
        self.client, self.kwargs = client, kwargs
        self.removed = False

    def wait(self, timeout=None):
        self.client.waited = timeout
        if self.client.behaviour == "timeout":
            raise ConnectionError("Read timed out")
        return {"StatusCode": 1 if self.client.behaviour == "crash" else 0}

    def logs(self, stdout=True, stderr=True):
        if self.client.behaviour == "crash":
            return b"loading\nValueError: something broke\n"
        return b"============ Serving Benchmark Result ============\n"

    def get_archive(self, path):
        self.client.archived = path
        if self.client.behaviour == "noresult":
            raise docker_errors.NotFound("no such file")
        data = self.client.result_text.encode()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(path.rsplit("/", 1)[-1])
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        return iter([buffer.getvalue()]), {}

    def remove(self, force=False):
        self.removed = True


class FakeServing:
    def __init__(self, attrs, status="running"):
        self.attrs, self.status = attrs, status


class FakeContainers:
    def __init__(self, client):
        self.client = client

    def get(self, name):
        if name in self.client.serving:
            return self.client.serving[name]
        raise docker_errors.NotFound(f"No such container: {name}")

    def run(self, image, **kwargs):
        self.client.runs.append(dict(kwargs, image=image))
        bench = FakeBench(self.client, kwargs)
        self.client.benches.append(bench)
        return bench


class FakeClient:
    def __init__(self, behaviour="ok", result=None, attrs=None):
        self.behaviour = behaviour
        self.result_text = json.dumps(result if result is not None else json.loads(FIXTURE.read_text()))
        self.serving = {"vllm-smol": FakeServing(attrs or serving_attrs(max_len="4096"))}
        self.runs, self.benches, self.containers = [], [], FakeContainers(self)
        self.waited = self.archived = None


class FakeSampler:
    def start(self):
        return None

    def summary(self):
        return bench_gpu.summarise_gpu_samples([], None, "no GPU on this host: no utilisation sampled (test)")


@pytest.fixture
def client(monkeypatch):
    holder = {}

    def from_env():
        return holder["client"]
    monkeypatch.setattr(vllm_bench.docker, "from_env", from_env)
    monkeypatch.setattr(vllm_bench, "GpuSampler", FakeSampler)
    # /metrics of the instance: the reads answered in order (no server in these tests)
    holder["reads"], holder["asked"] = [], []

    def read_preemptions(address, port, api_key=""):
        holder["asked"].append((address, port, api_key))
        return holder["reads"].pop(0) if holder["reads"] else (None, "no /metrics in this test")
    monkeypatch.setattr(vllm_bench, "read_preemptions", read_preemptions)

    def make(reads=(), **kw):
        holder["reads"][:] = list(reads)
        holder["client"] = FakeClient(**kw)
        holder["client"].metrics_asked = holder["asked"]
        return holder["client"]
    return make


POINT = {"input_len": 1000, "output_len": 512, "concurrency": 8, "num_prompts": 80}
ARGS = {"container": "vllm-smol", "target": "127.0.0.1:18000", "served_model_name": "smol",
        "instance": "gpu01-vllm0", "api_key": KEY}


def test_module_plan_clips_to_the_containers_max_model_len(client, monkeypatch):
    fake = client()
    fake.serving["vllm-smol"] = FakeServing(serving_attrs(max_len="2048"))
    result, failed = run_module(vllm_bench.main, dict(ARGS, pairs=[[1000, 512], [4000, 512]],
                                                      concurrency=[1, 2]), monkeypatch)
    assert not failed and not result["changed"] and not fake.runs
    assert result["plan"]["max_model_len"] == 2048
    assert [p["input_len"] for p in result["plan"]["points"]] == [1000, 1000, 1536, 1536]
    assert "clipped" in result["plan"]["notes"][0] or "1536" in result["plan"]["notes"][0]
    assert "VLLM_API_KEY" not in result["instance"]["env_names"]


def test_module_plan_uses_the_lab_preset(client, monkeypatch):
    client()
    result, failed = run_module(vllm_bench.main, dict(ARGS, preset="lab"), monkeypatch)
    assert not failed
    assert result["plan"]["asked"] == {"preset": "lab", "concurrency": list(b.LAB_CONCURRENCY),
                                       "pairs": [list(p) for p in b.LAB_PAIRS]}
    assert len(result["plan"]["points"]) == len(b.LAB_CONCURRENCY) * len(b.LAB_PAIRS)


def test_module_runs_a_point(client, monkeypatch):
    fake = client()
    result, failed = run_module(vllm_bench.main, dict(ARGS, point=POINT, timeout=123), monkeypatch)
    assert not failed and not result["changed"]
    assert result["status"] == "ok" and result["row"]["concurrency"] == 8
    assert result["result"]["output_throughput"] == json.loads(FIXTURE.read_text())["output_throughput"]
    run = fake.runs[0]
    assert run["image"] == "sha256:" + "ab" * 32          # the instance's own image, by id
    assert run["entrypoint"] == ["vllm"] and run["command"][:2] == ["bench", "serve"]
    assert run["network_mode"] == "host"                    # loopback target
    assert run["volumes"] == {"/srv/models/smol": {"bind": "/models/smol", "mode": "ro"}}
    assert run["environment"]["OPENAI_API_KEY"] == KEY
    assert KEY not in " ".join(run["command"]) and KEY not in json.dumps(result)
    assert run["environment"]["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert fake.waited == 123 and fake.benches[0].removed
    assert result["gpu"]["reason"].startswith("no GPU on this host")


def test_module_remote_target_uses_the_default_network(client, monkeypatch):
    fake = client()
    result, _ = run_module(vllm_bench.main, dict(ARGS, point=POINT, target="10.0.0.5:18000"),
                           monkeypatch)
    assert result["network_mode"] == "default" and "network_mode" not in fake.runs[0]
    assert fake.runs[0]["command"][fake.runs[0]["command"].index("--host") + 1] == "10.0.0.5"


@pytest.mark.parametrize("behaviour,words", [
    ("timeout", "timed out after 5 s"),
    ("crash", "exited with status 1: ValueError: something broke"),
    ("noresult", "saved no result"),
])
def test_module_failed_points_are_recorded_not_raised(client, monkeypatch, behaviour, words):
    fake = client(behaviour=behaviour)
    result, failed = run_module(vllm_bench.main, dict(ARGS, point=POINT, timeout=5), monkeypatch)
    assert not failed and result["status"] == "failed"
    assert words in result["error"] and result["row"]["error"] == result["error"]
    assert result["row"]["status"] == "failed" and result["row"]["output_throughput"] is None
    assert fake.benches[0].removed


def test_module_unusable_result_is_a_failed_point(client, monkeypatch):
    data = json.loads(FIXTURE.read_text())
    del data["p90_e2el_ms"]
    client(result=data)
    result, failed = run_module(vllm_bench.main, dict(ARGS, point=POINT), monkeypatch)
    assert not failed and result["status"] == "failed" and "p90_e2el_ms" in result["error"]


def test_module_missing_container_is_a_failed_point(client, monkeypatch):
    fake = client()
    result, failed = run_module(vllm_bench.main, dict(ARGS, point=POINT, container="gone"),
                                monkeypatch)
    assert not failed and result["status"] == "failed" and "does not exist" in result["error"]
    assert not fake.runs


def test_module_check_mode_runs_nothing(client, monkeypatch):
    fake = client()
    result, failed = run_module(vllm_bench.main, dict(ARGS, point=POINT), monkeypatch,
                                check_mode=True)
    assert not failed and result["status"] == "not_run" and not fake.runs
    assert result["command"][:2] == ["bench", "serve"] and not result["changed"]


def test_module_refuses_bad_percentiles(client, monkeypatch):
    client()
    result, failed = run_module(vllm_bench.main, dict(ARGS, point=POINT, percentiles=[50, 99]),
                                monkeypatch)
    assert failed and "lack 90" in result["msg"]


def test_module_refuses_bad_goodput_and_passes_good_goodput(client, monkeypatch):
    fake = client()
    result, failed = run_module(vllm_bench.main, dict(ARGS, point=POINT, goodput={"latency": 5}),
                                monkeypatch)
    assert failed and "vLLM's goodput objectives are ttft, tpot, e2el" in result["msg"]
    assert not fake.runs
    result, failed = run_module(vllm_bench.main, dict(ARGS, point=POINT, goodput={"ttft": 2000}),
                                monkeypatch, check_mode=True)
    assert not failed and "ttft:2000" in result["command"]


# ---------------------------------------------------------------------------
# Knee facts for upgrade.yml's capacity gate
# ---------------------------------------------------------------------------

def _rows(instance, curve, output_len=512):
    data = json.loads(FIXTURE.read_text())
    rows = []
    for c in [1, 2, 4, 8, 16, 32, 64]:
        tput = curve(c)
        req = tput / output_len
        d = dict(data, max_concurrency=c, output_throughput=tput, request_throughput=req,
                 completed=10 * c, failed=0, instance=instance, input_len="1000",
                 output_len=str(output_len), mean_e2el_ms=1000.0 * c / req,
                 p99_e2el_ms=1100.0 * c / req, request_goodput=None)
        rows.append(bench_results.point_from_result(d))
    return rows


def test_knee_summary_and_rps_by_host():
    from gpufleet.gateway import backend_name

    groups = bench_analysis.analyse(_rows("h1:8000", lambda c: 100.0 * min(c, 8) + 0.5 * c)
                       + _rows("h2:8000", lambda c: 50.0 * min(c, 4) + 0.5 * c))
    knees = bench_analysis.knee_summary(groups)
    assert knees["h1:8000"]["concurrency"] == 8 and knees["h2:8000"]["concurrency"] == 4
    assert knees["h1:8000"]["request_throughput"] == pytest.approx((800 + 4) / 512)
    instances = [{"host": "h1", "container": "h1:8000", "served_model_name": "Org/M"},
                 {"host": "h2", "container": "h2:8000", "served_model_name": "Org/M"}]
    rps = bench_analysis.knee_rps_by_host(instances, knees, backend_name)
    assert rps == {"h1": {backend_name("Org/M"): round((200 + 2) / 512, 4)},
                   "h2": {backend_name("Org/M"): round((800 + 4) / 512, 4)}}
    # the form upgrade.capacity_verdict reads
    from gpufleet.upgrade import capacity_verdict
    servers = [{"backend": backend_name("Org/M"), "server": "h1_8000", "host": "h1", "status": "UP"},
               {"backend": backend_name("Org/M"), "server": "h2_8000", "host": "h2", "status": "UP"}]
    verdict = capacity_verdict(servers, "h1", knee_rps=rps["h1"],
                               load_rps={backend_name("Org/M"): 1.0})
    assert not verdict["ok"] and "knee capacity" in verdict["reasons"][0]


def test_no_knee_leaves_the_backend_out():
    rows = [bench_results.point_from_result(dict(json.loads(FIXTURE.read_text()), max_concurrency=c,
                                     instance="h2:8000")) for c in (1, 2)]
    knees = bench_analysis.knee_summary(bench_analysis.analyse(rows))
    assert knees["h2:8000"]["concurrency"] is None and "only 2" in knees["h2:8000"]["why_no_knee"]
    rps = bench_analysis.knee_rps_by_host([{"host": "h1", "container": "h1:8000", "served_model_name": "m"},
                              {"host": "h2", "container": "h2:8000", "served_model_name": "m"}],
                             knees, lambda m: "vllm_" + m)
    assert rps == {"h1": {}, "h2": {}}


def test_the_role_preflight_refuses_bad_goodput_before_any_point(tmp_path):
    """fleet_benchmark's preflight (tasks_from: preflight) on localhost: objectives vLLM
    would refuse are refused with the rule before anything runs; good ones pass."""
    from helpers import run_role_preflight

    listing = tmp_path / "vllm.json"
    listing.write_text("[]")
    base = {"fleet_benchmark_instances_file": str(listing)}
    rc, failures, changed = run_role_preflight(tmp_path, "fleet_benchmark",
                                               dict(base, fleet_benchmark_goodput={"latency": 100}))
    assert rc != 0 and changed == [] and len(failures) == 1, failures
    assert "fleet_benchmark_goodput: goodput names 'latency'" in failures[0], failures
    assert "Nothing was run" in failures[0]
    rc, failures, _ = run_role_preflight(tmp_path, "fleet_benchmark",
                                         dict(base, fleet_benchmark_goodput={"ttft": 2000}))
    assert not any("latency objectives" in f for f in failures), failures



def _preflight_output_dir(tmp_path, inventory, extra):
    """fleet_benchmark's preflight on the host gpu-1 (local): (rc, failures, the folder of
    the run folders it chose, or None)."""
    import re

    from conftest import ROOT
    from helpers import run_playbook

    listing = tmp_path / "vllm.json"
    listing.write_text("[]")
    play = tmp_path / "play.yml"
    play.write_text("- hosts: gpu-1\n  gather_facts: false\n  tasks:\n"
                    "    - name: Preflight\n      ansible.builtin.include_role:\n"
                    "        name: gpufleet.fleet.fleet_benchmark\n        tasks_from: preflight\n"
                    "    - name: Say the folder\n      ansible.builtin.debug:\n"
                    "        msg: \"OUTPUT_DIR={{ __fleet_benchmark_output_dir }}\"\n")
    extra = dict(extra, fleet_benchmark_instances_file=str(listing), ansible_connection="local",
                 ansible_python_interpreter=str(ROOT / ".venv/bin/python"))
    rc, _, failures, _, out = run_playbook(inventory, play, "gpu-1", extra, with_output=True)
    found = re.search(r'"OUTPUT_DIR=([^"]*)"', out)
    return rc, failures, found.group(1) if found else None


def test_the_run_folders_go_beside_the_inventory_not_into_the_collection(tmp_path):
    """#33 item 1: with fleet_benchmark_output_dir empty the run folders went to
    role_path/../../benchmarks, inside the collection once installed; now
    <inventory folder>/benchmarks, and a host from no inventory file is refused before
    any point runs, saying what to set."""
    from conftest import ROOT

    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts").write_text("gpu-1\n")
    rc, failures, chosen = _preflight_output_dir(tmp_path, inv / "hosts", {})
    assert rc == 0, failures
    assert chosen == str(inv / "benchmarks")
    assert not chosen.startswith(str(ROOT))

    rc, failures, chosen = _preflight_output_dir(tmp_path, "gpu-1,", {})
    assert rc != 0 and chosen is None and len(failures) == 1, failures
    assert ("fleet_benchmark_output_dir is empty and gpu-1 comes from no inventory file"
            in failures[0]), failures
    assert "Nothing was run" in failures[0]

    runs = tmp_path / "runs"
    rc, failures, chosen = _preflight_output_dir(tmp_path, "gpu-1,",
                                                 {"fleet_benchmark_output_dir": str(runs)})
    assert rc == 0 and chosen == str(runs), failures


def test_the_role_preflight_refuses_an_https_instance_it_cannot_benchmark(tmp_path):
    """An instance of the fleet's list with label scheme https (vllm_server_tls): vllm bench
    serve speaks plain http, so the preflight stops before any point, naming it; the same
    instance over http is not refused for that (the control)."""
    from helpers import run_role_preflight

    listing = tmp_path / "vllm.json"
    entry = {"targets": ["127.0.0.1:8000"], "labels": {
        "host": "localhost", "container": "vllm-m", "model": "m", "served_model_name": "m",
        "runner": "generate", "port": "8000", "scheme": "https"}}
    listing.write_text(json.dumps([entry]))
    rc, failures, changed = run_role_preflight(tmp_path, "fleet_benchmark",
                                               {"fleet_benchmark_instances_file": str(listing)})
    assert rc != 0 and changed == [] and len(failures) == 1, failures
    assert "127.0.0.1:8000 on localhost serves https (vllm_server_tls)" in failures[0], failures
    entry["labels"]["scheme"] = "http"
    listing.write_text(json.dumps([entry]))
    rc, failures, _ = run_role_preflight(tmp_path, "fleet_benchmark",
                                         {"fleet_benchmark_instances_file": str(listing)})
    assert not any("serves https" in f for f in failures), failures


# --- preemptions: vLLM's counter on /metrics, read before and after each point (#34 item 7)
METRICS_PAGE = """# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 5.0
vllm:num_preemptions_total{engine="1",model_name="a {b} c"} 2.0 1733450000000
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
vllm:num_preemptions_created{engine="0",model_name="x"} 1.733e+09
vllm:num_requests_running{engine="0",model_name="x"} 3.0
"""


def test_preemptions_from_metrics_sums_the_counters_series():
    """Prometheus text format: `name{labels} value [timestamp]`; the _created sample and
    other metrics are not the counter. A page without it says None, not 0."""
    assert bench_results.preemptions_from_metrics(METRICS_PAGE) == 7.0
    assert bench_results.preemptions_from_metrics("vllm:num_preemptions_total 3\n") == 3.0
    assert bench_results.preemptions_from_metrics("vllm:num_requests_running 1.0\n") is None
    assert bench_results.preemptions_from_metrics("") is None


def test_read_preemptions_over_http_sends_the_key_and_says_why_not():
    import http.server
    import threading
    seen = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen["path"], seen["auth"] = self.path, self.headers.get("Authorization")
            body = METRICS_PAGE.encode() if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        assert vllm_bench.read_preemptions("127.0.0.1", port, KEY) == (7.0, None)
        assert seen == {"path": "/metrics", "auth": f"Bearer {KEY}"}
    finally:
        server.shutdown()
        server.server_close()
    count, why = vllm_bench.read_preemptions("127.0.0.1", port)  # nothing listens now
    assert count is None and f"http://127.0.0.1:{port}/metrics could not be read" in why


def test_module_counts_the_preemptions_of_the_point(client, monkeypatch):
    fake = client(reads=[(3.0, None), (7.0, None)])
    result, failed = run_module(vllm_bench.main, dict(ARGS, point=POINT), monkeypatch)
    assert not failed and result["status"] == "ok"
    assert result["preemptions"] == {"count": 4.0, "reason": None}
    assert result["row"]["preemptions"] == 4.0
    assert fake.metrics_asked == [("127.0.0.1", 18000, KEY)] * 2
    assert KEY not in json.dumps(result)
    # unread: null with the reason, and no rule reads it
    client()
    result, _ = run_module(vllm_bench.main, dict(ARGS, point=POINT), monkeypatch)
    assert result["preemptions"] == {"count": None, "reason": "no /metrics in this test"}
    assert result["row"]["preemptions"] is None
    client(reads=[(9.0, None), (0.0, None)])
    result, _ = run_module(vllm_bench.main, dict(ARGS, point=POINT), monkeypatch)
    assert result["row"]["preemptions"] is None and "the server restarted" in result["preemptions"]["reason"]
