"""The state record that lets site.yml skip an unchanged host in one round trip (issue 12
item 4): gpufleet.hoststate observes and compares, plugins/modules/host_state.py checks and
records. Drift must send the host through the full run: a hand edit of daemon.json, a
removed hold (dpkg's status file), a new repository file, a stopped container, a truncated
model file, a GPU gone, a reboot, a changed input."""

import functools
import pathlib
import json
import os

import pytest

from conftest import FIXTURES, ROOT
from gpufleet import hoststate
from helpers import run_module

import host_state

H200_XML = FIXTURES / "nvidia-smi" / "device-h200-driver-580.xml"
PUBLISHED = {"plan": {"host": "gpu-01", "remove": [], "instances": [
    {"name": "vllm-gpu-01-0", "url": "http://10.0.0.1:8000", "runner": "generate",
     "served_model_name": "tiny", "port": 8000, "file_sd": {"targets": ["10.0.0.1:8000"]},
     "mount": ["/srv/models/tiny", "/models/tiny"]}]},
    "tunes": {"results": []}}
HOLD = ("Package: nvidia-open-580\nStatus: hold ok installed\nVersion: 580.65.06-1\n\n")


def host(tmp_path):
    """A host's files under tmp_path: daemon.json, dpkg's status with a hold, a repository
    file, a systemd enablement link, the boot id and a model folder."""
    files = {
        "etc/docker/daemon.json": '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}\n',
        "var/lib/dpkg/status": HOLD,
        "etc/apt/sources.list.d/cuda.list": "deb [signed-by=/etc/apt/keyrings/cuda.gpg] http://r/ /\n",
        "etc/os-release": "ID=debian\nVERSION_ID=12\n",
        "proc/sys/kernel/random/boot_id": "8e1c0f8a-1111-2222-3333-444455556666\n",
        "srv/models/tiny/config.json": '{"model_type": "llama"}',
        "srv/models/tiny/model.safetensors": "x" * 4096,
    }
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    wants = tmp_path / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "docker.service").symlink_to("/lib/systemd/system/docker.service")
    return tmp_path


class Host:
    """systemctl and docker as the host answers them; tests change the answers."""

    def __init__(self):
        self.services = {s: ("active", "enabled") for s in ("docker", "containerd")}
        self.container = {"Name": "/vllm-gpu-01-0", "Id": "c" * 64, "Image": "sha256:" + "a" * 64,
                          "RestartCount": 0,
                          "State": {"Status": "running", "Health": {"Status": "healthy"}}}

    def run(self, argv):
        if argv[0] == "systemctl":
            name = argv[2].removesuffix(".service")
            active, enabled = self.services.get(name, ("inactive", "not-found"))
            return 0, (active if argv[1] == "is-active" else enabled) + "\n"
        if argv[0] == "docker":
            return 0, json.dumps([self.container] if self.container else [])
        raise AssertionError(argv)


GPUS = {"present": True, "count": 1, "driver_version": "580.159.04",
        "cuda_driver_version": "13.0", "devices": [{"uuid": "GPU-166192c3"}]}


def observed(root, answers, gpus=GPUS):
    return hoststate.observe(hoststate.spec_for(PUBLISHED), answers.run, gpus, root=str(root))


def test_an_unchanged_host_shows_no_difference(tmp_path):
    root, answers = host(tmp_path), Host()
    first = observed(root, answers)
    assert hoststate.compare(first, observed(root, answers)) == []
    # what was observed: the trees, dpkg's status, services, the container, the model
    assert first["trees"]["/etc/docker"]["daemon.json"].startswith("file:")
    assert first["trees"]["/etc/systemd/system"]["multi-user.target.wants/docker.service"] == \
        "link:/lib/systemd/system/docker.service"
    assert first["files"]["/var/lib/dpkg/status"] is not None
    assert first["services"]["docker"] == "active/enabled"
    assert first["containers"]["vllm-gpu-01-0"]["health"] == "healthy"
    assert set(first["models"]["/srv/models/tiny"]) == {"config.json", "model.safetensors"}


def _edit(root, rel, text):
    (root / rel).write_text(text)


@pytest.mark.parametrize("drift, reason", [
    (lambda r, a: _edit(r, "etc/docker/daemon.json", "{}\n"), "file /etc/docker/daemon.json: changed"),
    (lambda r, a: _edit(r, "var/lib/dpkg/status", HOLD.replace("hold ok", "install ok")),
     "file /var/lib/dpkg/status: changed"),
    (lambda r, a: _edit(r, "etc/apt/sources.list.d/other.list", "deb http://x/ /\n"),
     "file /etc/apt/sources.list.d/other.list: new"),
    (lambda r, a: os.unlink(r / "etc/systemd/system/multi-user.target.wants/docker.service"),
     "file /etc/systemd/system/multi-user.target.wants/docker.service: gone"),
    (lambda r, a: os.chmod(r / "etc/docker/daemon.json", 0o666), "file /etc/docker/daemon.json: changed"),
    (lambda r, a: a.services.update(docker=("inactive", "enabled")), "service docker: changed"),
    (lambda r, a: a.container["State"].update(Status="exited"), "container vllm-gpu-01-0: changed"),
    (lambda r, a: a.container.update(RestartCount=1), "container vllm-gpu-01-0: changed"),
    (lambda r, a: setattr(a, "container", None), "container vllm-gpu-01-0: gone"),
    (lambda r, a: _edit(r, "srv/models/tiny/model.safetensors", "x" * 100),
     "model file /srv/models/tiny/model.safetensors: changed"),
    (lambda r, a: os.unlink(r / "srv/models/tiny/config.json"),
     "model file /srv/models/tiny/config.json: gone"),
    (lambda r, a: _edit(r, "proc/sys/kernel/random/boot_id", "another\n"),
     "the host rebooted since the last full run"),
])
def test_drift_is_a_difference(tmp_path, drift, reason):
    root, answers = host(tmp_path), Host()
    before = observed(root, answers)
    drift(root, answers)
    assert reason in hoststate.compare(before, observed(root, answers))


def test_a_gpu_gone_or_a_new_driver_is_a_difference(tmp_path):
    root, answers = host(tmp_path), Host()
    before = observed(root, answers)
    assert hoststate.compare(before, observed(root, answers, dict(GPUS, count=0, devices=[]))) == [
        "GPUs 1 x driver 580.159.04 -> 0 x driver 580.159.04"]
    assert hoststate.compare(before, observed(root, answers, dict(GPUS, driver_version="580.95.05")))


def test_many_differences_are_cut_to_twelve(tmp_path):
    root, answers = host(tmp_path), Host()
    before = observed(root, answers)
    for i in range(20):
        _edit(root, f"etc/apt/sources.list.d/n{i:02d}.list", "deb http://x/ /\n")
    reasons = hoststate.compare(before, observed(root, answers))
    assert len(reasons) == 13 and reasons[-1] == "and 8 more", reasons


def test_a_record_of_another_format_is_never_unchanged(tmp_path):
    root, answers = host(tmp_path), Host()
    before = dict(observed(root, answers), format=0)
    assert hoststate.compare(before, observed(root, answers)) == [
        "the record is format 0, this code writes 1"]


def test_inputs_digest_follows_every_input():
    base = hoststate.inputs_digest(["vllm_server_image", "nvidia_driver_branch"], ["img:1", "580"],
                                   "code", ["gpu-01", "10.0.0.1", ["gpu_hosts"]])
    assert base == hoststate.inputs_digest(["nvidia_driver_branch", "vllm_server_image"],
                                           ["580", "img:1"], "code",
                                           ["gpu-01", "10.0.0.1", ["gpu_hosts"]])
    for other in [(["vllm_server_image", "nvidia_driver_branch"], ["img:2", "580"], "code", ["gpu-01", "10.0.0.1", ["gpu_hosts"]]),
                  (["vllm_server_image", "nvidia_driver_branch"], ["img:1", "580"], "code2", ["gpu-01", "10.0.0.1", ["gpu_hosts"]]),
                  (["vllm_server_image", "nvidia_driver_branch"], ["img:1", "580"], "code", ["gpu-01", "10.0.0.2", ["gpu_hosts"]]),
                  (["vllm_server_image"], ["img:1"], "code", ["gpu-01", "10.0.0.1", ["gpu_hosts"]])]:
        assert hoststate.inputs_digest(*other) != base, other
    with pytest.raises(hoststate.HostStateError, match="2 variable names but 1 values"):
        hoststate.inputs_digest(["a", "b"], ["x"], "code")


def test_code_digest_follows_the_code_and_ignores_caches(tmp_path):
    (tmp_path / "roles/r/tasks").mkdir(parents=True)
    (tmp_path / "roles/r/tasks/main.yml").write_text("- debug: {}\n")
    (tmp_path / "site.yml").write_text("---\n")
    first = hoststate.code_digest(tmp_path)
    (tmp_path / "roles/r/__pycache__").mkdir()
    (tmp_path / "roles/r/__pycache__/x.pyc").write_bytes(b"\0")
    assert hoststate.code_digest(tmp_path) == first
    (tmp_path / "roles/r/tasks/main.yml").write_text("- debug: {msg: 1}\n")
    assert hoststate.code_digest(tmp_path) != first


def test_the_repository_code_digest_is_stable():
    assert hoststate.code_digest(ROOT) == hoststate.code_digest(ROOT)


def test_published_facts_keep_only_what_later_plays_read():
    plan = {"host": "gpu-01", "remove": ["old"], "instances": [dict(
        PUBLISHED["plan"]["instances"][0], env={"HF_TOKEN": "hf_secret"}, args=["--x"],
        action="keep")]}
    tunes = [{"item": {"name": "tiny", "path": "/srv"}, "settings": {"max_model_len": 2048}},
             {"item": {"name": "skipped"}, "skipped": True}]
    published = hoststate.published_facts(plan, tunes)
    assert published == PUBLISHED | {"tunes": {"results": [
        {"item": {"name": "tiny"}, "settings": {"max_model_len": 2048}}]}}
    assert "hf_secret" not in json.dumps(published)
    assert hoststate.published_facts({}, []) == {"plan": {}, "tunes": {"results": []}}


@pytest.fixture()
def module_host(tmp_path, monkeypatch):
    """host_state's main() on a host under tmp_path/root, answering as Host() does."""
    root, answers = host(tmp_path / "root"), Host()
    monkeypatch.setattr(host_state, "observe",
                        functools.partial(hoststate.observe, root=str(root)))
    monkeypatch.setattr(host_state, "_run", lambda module: answers.run)
    record = tmp_path / "state" / "host-state.json"
    base = {"path": str(record), "nvidia_smi_xml": str(H200_XML),
            "rollout_state_path": str(tmp_path / "state" / "rollout-state.json")}
    return root, answers, record, base


DIGEST = "d" * 64


def test_module_records_then_finds_the_host_unchanged(module_host, monkeypatch):
    root, answers, record, base = module_host
    result, failed = run_module(host_state.main, dict(base, state="check", inputs_digest=DIGEST),
                                monkeypatch)
    assert not failed and result["unchanged"] is False
    assert result["reasons"] == [f"no state record at {record} (first run, or a run that stopped early)"]
    assert result["ansible_facts"]["gpu"]["count"] == 1  # the GPUs, read in the same trip

    result, failed = run_module(host_state.main, dict(base, state="record", inputs_digest=DIGEST,
                                                      published=PUBLISHED), monkeypatch)
    assert not failed and result["changed"] is True
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    written = record.read_text()

    # the same again: nothing to write, the file untouched (its time included)
    result, _ = run_module(host_state.main, dict(base, state="record", inputs_digest=DIGEST,
                                                 published=PUBLISHED), monkeypatch)
    assert result["changed"] is False and record.read_text() == written

    result, _ = run_module(host_state.main, dict(base, state="check", inputs_digest=DIGEST), monkeypatch)
    assert result["unchanged"] is True and result["reasons"] == []
    assert result["published"] == PUBLISHED

    # control: the same check after a hand edit of daemon.json is not unchanged
    (root / "etc/docker/daemon.json").write_text("{}\n")
    result, _ = run_module(host_state.main, dict(base, state="check", inputs_digest=DIGEST), monkeypatch)
    assert result["unchanged"] is False and result["published"] == {}
    assert result["reasons"] == ["file /etc/docker/daemon.json: changed"]


def test_module_other_inputs_or_none_are_not_unchanged(module_host, monkeypatch):
    _, _, record, base = module_host
    run_module(host_state.main, dict(base, state="record", inputs_digest=DIGEST,
                                     published=PUBLISHED), monkeypatch)
    result, _ = run_module(host_state.main, dict(base, state="check", inputs_digest="e" * 64), monkeypatch)
    assert result["unchanged"] is False
    assert result["reasons"][0].startswith("the inputs changed")
    result, _ = run_module(host_state.main, dict(base, state="check", inputs_digest=""), monkeypatch)
    assert result["reasons"] == ["the inputs could not be read before the run"]


def test_module_record_in_check_mode_writes_nothing(module_host, monkeypatch):
    _, _, record, base = module_host
    result, failed = run_module(host_state.main, dict(base, state="record", inputs_digest=DIGEST,
                                                      published=PUBLISHED), monkeypatch,
                                check_mode=True)
    assert not failed and result["changed"] is True and not record.exists()


def test_module_refuses_a_record_without_a_digest(module_host, monkeypatch):
    _, _, record, base = module_host
    result, failed = run_module(host_state.main, dict(base, state="record", inputs_digest="x"),
                                monkeypatch)
    assert failed and "inputs_digest must be the 64-hex sha256" in result["msg"]
    assert not record.exists()


def test_module_names_a_record_it_cannot_read(module_host, monkeypatch):
    _, _, record, base = module_host
    record.parent.mkdir(parents=True)
    record.write_text("{not json")
    result, failed = run_module(host_state.main, dict(base, state="check", inputs_digest=DIGEST),
                                monkeypatch)
    assert failed and str(record) in result["msg"] and "remove it" in result["msg"]


def test_every_gpu_play_after_the_state_play_skips_unchanged_hosts_first():
    """site.yml: the state play comes first; every later play on GPU hosts keeps all of
    them (a play whose changed hosts all fail must not end the run for the others) and
    ends the play for a skipped host before anything else, facts gathering included."""
    import yaml

    plays = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    assert plays[0]["name"].startswith("State | Skip") and plays[0]["hosts"] == "gpu_hosts"
    gpu_plays = [p for p in plays[1:] if "hosts" in p and p["hosts"].startswith("gpu_hosts")]
    assert len(gpu_plays) == 6, [p["name"] for p in gpu_plays]
    for play in gpu_plays:
        assert "gpufleet_state" not in play["hosts"], play["name"]
        assert play.get("gather_facts") is False, play["name"]
        first = play["pre_tasks"][0]
        assert first["ansible.builtin.import_tasks"] == "tasks/skip-unchanged.yml", play["name"]
    skip = yaml.safe_load((ROOT / "playbooks/tasks/skip-unchanged.yml").read_text())
    assert skip[0]["ansible.builtin.meta"] == "end_host"
    assert "gpufleet_state_unchanged" in skip[0]["when"]


def test_module_a_host_a_rollout_left_mid_change_is_held_and_never_unchanged(module_host, monkeypatch):
    """The rollout state is read in the same round trip (site.yml refuses such a host:
    tests/unit/test_rollout.py); control: a finished rollout holds nothing."""
    _, _, record, base = module_host
    run_module(host_state.main, dict(base, state="record", inputs_digest=DIGEST,
                                     published=PUBLISHED), monkeypatch)
    path = pathlib.Path(base["rollout_state_path"])
    for step, held in (("out_of_service", True), ("recorded", False)):
        path.write_text(json.dumps({"version": 1, "rollout": "r-3", "step": step, "at": "t", "history": []}))
        result, failed = run_module(host_state.main, dict(base, state="check", inputs_digest=DIGEST),
                                    monkeypatch)
        assert not failed and result["held"] is held and result["unchanged"] is (not held)
        assert result["rollout_state"]["step"] == step
        if held:
            assert result["reasons"] == ["a rollout left it mid-change (rollout r-3, step out_of_service)"]


def test_module_a_record_others_may_write_is_refused(module_host, monkeypatch):
    """#32 item 6: its published facts (instance URLs) feed later plays; control: 0600 passes."""
    _, _, record, base = module_host
    run_module(host_state.main, dict(base, state="record", inputs_digest=DIGEST,
                                     published=PUBLISHED), monkeypatch)
    record.chmod(0o646)
    result, failed = run_module(host_state.main, dict(base, state="check", inputs_digest=DIGEST), monkeypatch)
    assert failed and str(record) in result["msg"]
    record.chmod(0o600)
    result, failed = run_module(host_state.main, dict(base, state="check", inputs_digest=DIGEST), monkeypatch)
    assert not failed and result["unchanged"] is True
