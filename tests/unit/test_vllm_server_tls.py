"""vLLM serving TLS (issue #32 item 2): what the vllm_server role plans for an instance with
vllm_server_tls (serve.plan_instances with tls_dir): vLLM 0.32's --ssl-certfile/--ssl-keyfile
on files of one folder mounted read-only, the certificate's digest in the settings hash,
https in the instance's URL and in the fleet list's label `scheme` (which the gateway and
Prometheus read), the arguments check without the unmounted files, and the role's
defaults and the lab's opt-out. The real TLS check (vLLM's own HTTP launcher in the lab
image, run with the planned mount, command and the role's container security, reached with
curl --cacert and gpufleet's client): tests/slow/test_vllm_tls_serving.py."""
import pathlib

import pytest
import yaml

from gpufleet import serve

ROOT = pathlib.Path(__file__).resolve().parents[2]
TUNE = {"args": ["--max-model-len", "512"],
        "settings": {"tensor_parallel_size": 1, "runner": "generate", "docker": {}, "env": {}}}


def plan(**kw):
    opts = {"image": "img:1", "image_id": "sha256:aa", "container_prefix": "vllm-",
            "default_port": 8000, "gpu_indexes": [0], "gpu_runtime": "nvidia",
            "allow_replicas": False, "revision": "c0ffee"}
    opts.update(kw)
    (inst,) = serve.plan_instances({"name": "chat", "path": "/srv/m/chat"}, TUNE, **opts)
    return inst


def test_an_instance_with_tls_serves_https_from_the_mounted_folder():
    inst = plan(tls_dir="/etc/gpufleet/vllm-tls", tls_digest="d1")
    assert inst["command"][-4:] == ["--ssl-certfile", "/run/gpufleet/vllm-tls/cert.pem",
                                    "--ssl-keyfile", "/run/gpufleet/vllm-tls/key.pem"]
    assert {"source": "/etc/gpufleet/vllm-tls", "target": "/run/gpufleet/vllm-tls", "type": "bind",
            "read_only": True} in inst["mounts"]
    assert inst["scheme"] == "https"
    entry = serve.registry_entry(inst, "gpu-a", "10.0.0.7")
    assert entry["labels"]["scheme"] == "https" and entry["targets"] == ["10.0.0.7:8000"]
    assert serve.local_url("127.0.0.1", inst["port"], inst["scheme"]) == "https://127.0.0.1:8000"


def test_a_new_certificate_replaces_the_container_and_a_plain_fleet_keeps_its_hash():
    plain = plan()
    assert plain["scheme"] == "http" and "--ssl-certfile" not in plain["command"]
    assert serve.registry_entry(plain, "gpu-a", "10.0.0.7")["labels"]["scheme"] == "http"
    first, renewed = plan(tls_dir="/t", tls_digest="d1"), plan(tls_dir="/t", tls_digest="d2")
    assert len({plain["settings_hash"], first["settings_hash"], renewed["settings_hash"]}) == 3
    # the hash of a plan without TLS is what it was before TLS existed (no replacement)
    assert plain["settings_hash"] == plan(tls_dir="", tls_digest="")["settings_hash"]


def test_the_arguments_check_runs_without_the_certificate_files():
    inst = plan(tls_dir="/t", tls_digest="d1")
    checked = serve.args_check_command(inst["command"])
    assert "--ssl-certfile" not in checked and "--ssl-keyfile" not in checked
    assert checked[0] == serve.ARGS_CHECK_MODEL and "--max-model-len" in checked


@pytest.mark.parametrize("kw, message", [
    ({"tls_dir": "/t"}, "tls_dir needs tls_digest"),
    ({"tls_dir": "/t\n- x", "tls_digest": "d"}, "tls_dir (vllm_server_tls_dir)")])
def test_bad_tls_inputs_are_refused(kw, message):
    with pytest.raises(serve.PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(**kw)


def test_the_scheme_rule_reads_plans_and_list_entries_and_refuses_others():
    assert serve.scheme_of({"scheme": "https"}) == "https"
    assert serve.scheme_of({"labels": {"host": "a"}}) == "http"  # a list written before TLS
    with pytest.raises(serve.PlanError):
        serve.scheme_of({"labels": {"scheme": "gopher"}})


def test_tls_is_the_default_and_the_lab_opts_out():
    defaults = yaml.safe_load((ROOT / "roles/vllm_server/defaults/main.yml").read_text())
    assert defaults["vllm_server_tls"] is True
    gateway = yaml.safe_load((ROOT / "roles/vllm_gateway/defaults/main.yml").read_text())
    assert gateway["vllm_gateway_backend_tls"] is True
    lab = yaml.safe_load((ROOT / "inventories/lab/group_vars/gpu_hosts/main.yml").read_text())
    lab_gw = yaml.safe_load((ROOT / "inventories/lab/group_vars/gateways/main.yml").read_text())
    assert lab["vllm_server_tls"] is False and lab_gw["vllm_gateway_backend_tls"] is False
    # every reader of an instance's URL passes its CA file
    for path in ["roles/vllm_server/tasks/containers.yml", "roles/vllm_server/tasks/instance.yml",
                 "roles/fleet_upgrade/tasks/drain.yml", "roles/fleet_upgrade/tasks/change.yml"]:
        text = (ROOT / path).read_text()
        assert text.count(".url }}") == text.count(".ca_file | default('') }}"), path
    assert "ca_path: \"{{ item.ca_file" in (ROOT / "playbooks/summary.yml").read_text()


# --- Prometheus scrapes an https instance over TLS (roles/fleet_monitoring) --------------
def _prometheus_config(tls):
    from helpers import prometheus_config

    return prometheus_config(tls)


def test_prometheus_takes_each_instances_scheme_and_verifies_https_with_the_fleet_ca():
    job = [j for j in _prometheus_config(True)["scrape_configs"] if j["job_name"] == "vllm"][0]
    assert job["relabel_configs"] == [{"source_labels": ["scheme"], "regex": "(https?)",
                                       "target_label": "__scheme__"}]
    assert job["tls_config"] == {"ca_file": "/etc/prometheus/gpufleet-ca.crt", "min_version": "TLS12"}
    # the relabelling Prometheus applies to a target of vllm_server's list
    import re
    inst = plan(tls_dir="/t", tls_digest="d1")
    labels = serve.registry_entry(inst, "gpu-a", "10.0.0.7")["labels"]
    rule = job["relabel_configs"][0]
    assert re.fullmatch(rule["regex"], labels["scheme"]).group(1) == "https"
    # control: a fleet without https instances gets no CA file to load (Prometheus refuses a
    # missing ca_file at start), and plain http targets keep the scheme http
    plain = [j for j in _prometheus_config(False)["scrape_configs"] if j["job_name"] == "vllm"][0]
    assert "tls_config" not in plain and plain["relabel_configs"] == job["relabel_configs"]
