"""One repo-id rule: hf_model's (gpufleet.hub_names.validate_repo_id) is the one the model_fetch
role's preflight applies, through the gpufleet_bad_repo_ids filter, before any fetch."""

import pytest

from conftest import ROOT
from gpufleet import hub, hub_names
from helpers import run_playbook


GOOD = ["org/name", "gpt2", "Qwen/Qwen2.5-7B-Instruct", "a/b-c_d.e"]
BAD = ["org/na..me", "org/name/extra", "/name", "org/", "-org/name", "org/name ", "", 7]


def _filter():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpufleet_filters", ROOT / "plugins/filter/gpufleet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()["gpufleet_bad_repo_ids"]


def test_the_filter_is_hub_rule():
    bad_repo_ids = _filter()
    assert bad_repo_ids(GOOD) == []
    assert bad_repo_ids(BAD) == BAD
    for repo_id in GOOD:
        hub_names.validate_repo_id(repo_id)
    for repo_id in BAD:
        with pytest.raises(hub.HubError):
            hub_names.validate_repo_id(repo_id)


@pytest.mark.parametrize("repo_id", ["org/na..me", "org/name/extra"])
def test_model_fetch_preflight_refuses_what_hf_model_refuses(tmp_path, repo_id):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(f"all:\n  hosts:\n    h:\n      ansible_connection: local\n"
                         f"      ansible_python_interpreter: {ROOT / '.venv/bin/python'}\n")
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: h\n  gather_facts: false\n  roles: [gpufleet.fleet.model_fetch]\n")
    rc, _, failures, _ = run_playbook(inventory, playbook, "h", {
        "model_fetch_models": [{"repo_id": "org/ok"}, {"repo_id": repo_id}],
        "model_fetch_root": str(tmp_path / "models"),
        "model_fetch_endpoint": "http://127.0.0.1:9"}, check=True)
    assert rc != 0
    assert len(failures) == 1 and "Model_fetch | Check the inputs: " in failures[0], failures
    assert not (tmp_path / "models").exists()
