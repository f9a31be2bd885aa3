"""playbooks/plan.yml and the vllm_server role choose vLLM settings through one option map
(roles/vllm_server/tasks/tune.yml, entry point `tune`): the same inventory gives the same
arguments. Real ansible-playbook runs (connection local) on a tiny Llama folder written
here (config.json of lab/models' gpufleet/tiny-llama, safetensors header with real
offsets) and a real nvidia-smi capture (tests/fixtures/nvidia-smi, SOURCES.md)."""
import json
import pathlib
import re
import struct
import subprocess
import uuid

import yaml

from conftest import FIXTURES, ROOT
from helpers import run_playbook

XML = FIXTURES / "nvidia-smi" / "netdata-rtx-4090-driver-535.xml"
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
    "head_dim": 32, "hidden_size": 64, "intermediate_size": 128,
    "max_position_embeddings": 2048, "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": False,
}


def _model(folder):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    n = 512 * 64
    header = json.dumps({"model.embed_tokens.weight": {
        "dtype": "BF16", "shape": [512, 64], "data_offsets": [0, 2 * n]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header
                                               + bytes(2 * n))
    return folder


def _inventory(tmp_path, models, **host_vars):
    inv = {"all": {"hosts": {"h": {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(ROOT / ".venv/bin/python"),
        "plan_nvidia_smi_xml": str(XML),
        # a planning host without the image names the release (else read from the image)
        "vllm_server_vllm_version": "0.32.0",
        "vllm_server_models": models, **host_vars}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _models(tmp_path, **extra):
    path = _model(tmp_path / "models" / "tiny")
    return [{"name": "tiny", "path": str(path), "dtype": "float16", "enforce_eager": True,
             "allow_long_context": True, "max_model_len": 4096, "overhead_bytes": 1 << 30,
             "allow_unknown_architecture": False, "target_concurrency": 8,
             "extra_args": ["--enable-prefix-caching"], **extra}]


def _report(proc):
    start = re.search(r"^\{", proc.stdout, re.M)
    assert start, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.JSONDecoder().raw_decode(proc.stdout[start.start():])[0]


def _playbook(inventory, playbook, *extra):
    import os

    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_FORCE_COLOR="0")
    return subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory),
                           str(playbook), *extra], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


def _task_results(report, name):
    return [res for p in report["plays"] for t in p["tasks"] if t["task"]["name"] == name
            for res in t["hosts"].values()]


def _plan_commands(report):
    printed = _task_results(report, "Plan | Print settings, prediction and reasons")
    assert printed, "plan.yml printed nothing"
    return {item["msg"]["model"]: item["msg"] for item in printed[0]["results"]}


def _role_tune_play():
    """A play running the role's `tune` entry point after gpu_facts, as preflight runs it."""
    return f"""
- hosts: h
  gather_facts: false
  tasks:
    - name: Test | Gather GPU facts as the role's preflight does
      gpufleet.fleet.gpu_facts:
        nvidia_smi_xml: "{XML}"
    - name: Test | Choose settings with the role
      ansible.builtin.include_role:
        name: gpufleet.fleet.vllm_server
        tasks_from: tune
"""


def _role_args(tmp_path, inventory):
    """The role's own choice: its `tune` entry point after gpu_facts, as preflight runs it."""
    pb = tmp_path / "role-tune.yml"
    pb.write_text(_role_tune_play() + """    - name: Test | Show them
      ansible.builtin.debug:
        msg: "{{ vllm_server_tunes.results | map(attribute='args') | list }}"
""")
    proc = _playbook(inventory, pb)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return _task_results(_report(proc), "Test | Show them")[0]["msg"]


def test_plan_yml_and_the_role_give_identical_args(tmp_path):
    models = _models(tmp_path)
    inventory = _inventory(tmp_path, models)
    proc = _playbook(inventory, ROOT / "playbooks" / "plan.yml")
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = _report(proc)
    assert report["stats"]["h"]["changed"] == 0
    printed = _plan_commands(report)["tiny"]
    assert printed["fits"] is True and printed["reasons"] and printed["prediction"]
    plan_args = printed["command"].split()[3:]  # vllm serve PATH ARGS
    assert plan_args == _role_args(tmp_path, inventory)[0]
    # the options plan.yml used to drop
    assert plan_args[plan_args.index("--dtype") + 1] == "float16"
    assert "--enforce-eager" in plan_args and "--max-model-len" in plan_args
    assert plan_args[plan_args.index("--max-model-len") + 1] == "4096"
    assert printed["settings"]["dtype"] == "float16"


def test_plan_yml_honours_the_role_inputs_and_changes_nothing_in_check_mode(tmp_path):
    """vllm_server_gpu_runtime: none plans for the CPU build, as the role does."""
    models = _models(tmp_path, kv_cache_memory_bytes=64 << 20)
    inventory = _inventory(tmp_path, models, vllm_server_gpu_runtime="none")
    proc = _playbook(inventory, ROOT / "playbooks" / "plan.yml", "--check")
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = _report(proc)
    assert report["stats"]["h"]["changed"] == 0
    printed = _plan_commands(report)["tiny"]
    assert printed["settings"]["target"] == "cpu"
    assert printed["command"].split()[3:] == _role_args(tmp_path, inventory)[0]


def test_a_model_that_does_not_fit_is_printed_and_fails_the_host(tmp_path):
    models = _models(tmp_path) + [dict(_models(tmp_path / "b")[0], name="huge",
                                       max_model_len=2048, target_concurrency=100000,
                                       allow_long_context=False)]
    models[1]["kv_cache_memory_bytes"] = 1 << 20
    inventory = _inventory(tmp_path, models, vllm_server_gpu_runtime="none")
    models[0]["kv_cache_memory_bytes"] = 64 << 20
    inventory = _inventory(tmp_path, models, vllm_server_gpu_runtime="none")
    proc = _playbook(inventory, ROOT / "playbooks" / "plan.yml")
    assert proc.returncode != 0
    printed = _plan_commands(_report(proc))
    assert printed["tiny"]["fits"] is True
    assert printed["huge"]["fits"] is False and printed["huge"]["error"]
    fail = _task_results(_report(proc), "Plan | Fail the host when a model does not fit")
    assert fail and "huge" in fail[0]["msg"] and "tiny" not in fail[0]["msg"]


def test_vllm_tune_is_called_from_one_task_file():
    calls = [str(p.relative_to(ROOT)) for top in ("roles", "playbooks")
             for p in (ROOT / top).rglob("*.yml") if re.search(r"^\s*(gpufleet\.fleet\.)?vllm_tune:", p.read_text(), re.M)]
    assert calls == ["roles/vllm_server/tasks/tune.yml"]


def test_an_api_key_in_extra_args_is_refused_and_never_printed(tmp_path):
    secret = f"sk-{uuid.uuid4().hex}"
    for extra in (["--api-key", secret], [f"--api-key={secret}"]):
        models = _models(tmp_path / secret[:8] / str(len(extra)), extra_args=extra)
        inventory = _inventory(tmp_path, models)
        proc = _playbook(inventory, ROOT / "playbooks" / "plan.yml", "-vvv")
        assert proc.returncode != 0
        assert "vllm_server_api_key" in proc.stdout
        assert secret not in proc.stdout + proc.stderr


def test_the_role_can_set_every_tuner_option():
    """vllm_server's one vllm_tune call maps a model entry's key to every vllm_tune option
    but those the role fills itself from the host (gpu_facts and model_config are the
    module's alternatives to gpus and model_path). At 170a6fc block_size and
    expert_parallel were missing: the role could not set them."""
    import re

    doc = re.search(r'DOCUMENTATION = r"""(.*?)"""', (ROOT / "plugins/modules/vllm_tune.py").read_text(),
                    re.S).group(1)
    options = set(yaml.safe_load(doc)["options"])
    tasks = yaml.safe_load((ROOT / "roles/vllm_server/tasks/tune.yml").read_text())
    mapped = next(t["gpufleet.fleet.vllm_tune"] for t in tasks if "gpufleet.fleet.vllm_tune" in t)
    assert options - set(mapped) == {"gpu_facts", "model_config"}, options - set(mapped)
    assert not set(mapped) - options, set(mapped) - options
    for option, value in mapped.items():
        if option not in ("model_path", "gpus", "vllm_version"):
            assert f"item.{option}" in str(value), (option, value)



def test_the_role_refuses_a_draft_it_cannot_read_before_any_change(tmp_path):
    """Preflight's tune (the role's entry point `tune`): an EAGLE-3 config without the
    draft's folder, and a speculative_model_path that is not a folder on the host, each
    fail naming what to do (issue #34 item 2); one ansible-playbook run, both models."""
    spec = ["--speculative-config",
            '{"method": "eagle3", "model": "org/draft", "num_speculative_tokens": 2}']
    missing = tmp_path / "drafts" / "org" / "draft"
    models = (_models(tmp_path / "a", extra_args=spec)
              + [dict(_models(tmp_path / "b", extra_args=spec)[0], name="tiny-b",
                      speculative_model_path=str(missing))])
    inventory = _inventory(tmp_path, models)
    pb = tmp_path / "role-tune.yml"
    pb.write_text(_role_tune_play())
    proc = _playbook(inventory, pb)
    assert proc.returncode != 0
    (tuned,) = _task_results(_report(proc), "gpufleet.fleet.vllm_server : VLLM server | "
                             "Choose vLLM settings for each model")
    msgs = {r["item"]["name"]: r.get("msg", "") for r in tuned["results"]}
    assert "has no draft folder" in msgs["tiny"] and "speculative_model_path" in msgs["tiny"]
    assert f"speculative_model_path {missing} is not a folder on this host" in msgs["tiny-b"]
    assert "model_fetch_models" in msgs["tiny-b"]
    assert not missing.exists()
