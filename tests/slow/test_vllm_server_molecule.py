"""The vllm_server role end to end: `molecule test -s vllm_server` with a random API key.

Real software only: the lab's vLLM CPU image (gpufleet/vllm-cpu:lab, the stand-in for
vllm/vllm-openai, lab/vllm/) serves SmolLM2-135M-Instruct (lab/models/) in a container
the role creates through the host's Docker engine. The scenario converges, re-converges
(idempotence: changed=0), and verifies a real chat completion, 401 without the key,
/metrics, the labels, and that missing weights, an unknown flag and a busy port each fail
with their cause while the serving container keeps running.

This test adds what Molecule cannot check itself: the API key appears nowhere in the
whole output of all those runs, at -vvv (ANSIBLE_VERBOSITY=3: every module's arguments
and results but those of no_log tasks). Containers are named vllmsrv-molecule-*; Molecule's
destroy step and the final cleanup here remove them.
"""
import os
import pathlib
import re
import secrets
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / ".cache" / "lab" / "models" / "HuggingFaceTB" / "SmolLM2-135M-Instruct"

pytestmark = pytest.mark.slow


def _have_image(name):
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True,
                          check=False).returncode == 0


@pytest.fixture
def requirements():
    if shutil.which("docker") is None or not _have_image("gpufleet/vllm-cpu:lab"):
        pytest.skip("needs docker and gpufleet/vllm-cpu:lab (lab/vllm/build.sh)")
    if not (SMOLLM2 / "model.safetensors").exists():
        pytest.skip("needs the lab models (lab/models/build.sh)")


def _cleanup():
    names = subprocess.run(["docker", "ps", "-aq", "--filter", "name=vllmsrv-molecule-"],
                           capture_output=True, text=True, check=False).stdout.split()
    for name in names:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def test_molecule_scenario_passes_and_never_shows_the_key(requirements):
    key = "vllmsrv-" + secrets.token_hex(12)
    env = dict(os.environ, VLLMSRV_API_KEY=key, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_VERBOSITY="3",
               PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
               ANSIBLE_NOCOLOR="1", PY_COLORS="0")
    try:
        proc = subprocess.run(["molecule", "test", "-s", "vllm_server"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=1500, check=False)
    finally:
        _cleanup()
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    # the idempotence step ran and found nothing to change
    assert re.search(r"idempotence.*Executed: Successful", output), output[-3000:]
    # every bad change was refused and the verify step got through them all
    for case in ("missing weights", "unknown flag", "busy port"):
        assert case in output
    assert key not in output
    assert "ESTABLISH" in output, "not run at -vvv (no connection lines)"
