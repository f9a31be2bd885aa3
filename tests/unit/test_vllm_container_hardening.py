"""The vLLM container keeps no Linux capability and gains no privilege
(roles/vllm_server/tasks/instance.yml); the lab's
test_the_pooling_instance_serves_embeddings_hardened_with_its_key_in_a_root_file
(tests/slow/test_upgrade_under_load.py) checks the running container and that vLLM CPU
serves that way."""
import yaml

from conftest import ROOT


def _start_task():
    tasks = yaml.safe_load((ROOT / "roles/vllm_server/tasks/instance.yml").read_text())
    for task in tasks[0]["block"]:
        if "community.docker.docker_container" in task:
            return task["community.docker.docker_container"]
    raise AssertionError("no docker_container task in instance.yml")


def test_the_container_drops_every_capability_and_adds_none():
    spec = _start_task()
    assert spec["cap_drop"] == ["ALL"]
    assert "capabilities" not in spec and "privileged" not in spec


def test_the_container_gains_no_privileges():
    assert _start_task()["security_opts"] == ["no-new-privileges"]


def test_docs_say_what_stays_and_who_reads_the_key():
    text = (ROOT / "docs/vllm-server.md").read_text()
    assert "cap_drop: [ALL]" in text and "ipc_mode: host" in text
    assert "docker inspect" in text and "`docker` group" in text
