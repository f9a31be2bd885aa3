"""The lab's vLLM CPU image (lab/vllm/) serving the tiny lab model, through the docker SDK.

Stand-in: gpufleet/vllm-cpu runs real vLLM (vllm-cpu 0.32.0) on the CPU in place of the
official vllm/vllm-openai GPU image (see docs/lab-vllm.md). The image and the model are
built by their own idempotent scripts (lab/vllm/build.sh, lab/models/build.sh): the
first run builds the image (minutes), later runs reuse it.

The server listens on 127.0.0.1 only (host network, --host 127.0.0.1) and every wait is
bounded. Containers are named vllmimg-test-* and removed whatever happens.
"""
import importlib.util
import json
import pathlib
import re
import socket
import subprocess
import time
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / ".cache" / "lab" / "models" / "gpufleet" / "tiny-llama"
HEALTH_TIMEOUT_S = 300
CPU_BLOCK_SIZE = 128  # vLLM's CPU attention backend (docs/lab-vllm.md)


def _load_lab_defaults():
    spec = importlib.util.spec_from_file_location(
        "gpufleet_lab_defaults", ROOT / "lab" / "vllm" / "gpufleet_lab_defaults.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------- pure (no docker)
@pytest.mark.parametrize("argv, environ, applied", [
    (["/opt/venv/bin/vllm", "serve", "--model", "/m"], {}, True),
    (["/opt/venv/bin/vllm", "serve", "--kv-cache-memory-bytes", "1000"], {}, False),
    (["/opt/venv/bin/vllm", "serve", "--kv-cache-memory-bytes=1000"], {}, False),
    (["/opt/venv/bin/vllm", "serve", "--kv_cache_memory_bytes", "1000"], {}, False),
    (["/opt/venv/bin/vllm", "serve", "--gpu-memory-utilization", "0.5"], {}, False),
    (["/opt/venv/bin/vllm", "serve"], {"VLLM_CPU_KVCACHE_SPACE": "4"}, False),
    (["/opt/venv/bin/vllm", "bench", "serve"], {}, False),
    (["/opt/venv/bin/python", "-c", "pass"], {}, False),
    ([], {}, False),
])
def test_lab_kv_default_only_when_caller_sized_nothing(argv, environ, applied):
    """The image's KV fallback never overrides an explicit size (the tuner's)."""
    environ = dict(environ)
    before = dict(environ)
    assert _load_lab_defaults()._apply(argv, environ) is applied
    if applied:
        assert environ == {**before, "VLLM_CPU_KVCACHE_SPACE": "1"}
    else:
        assert environ == before


def test_lab_kv_default_size_is_configurable():
    environ = {"GPUFLEET_LAB_KVCACHE_SPACE": "2"}
    assert _load_lab_defaults()._apply(["vllm", "serve"], environ)
    assert environ["VLLM_CPU_KVCACHE_SPACE"] == "2"


# ----------------------------------------------------------------- docker
@pytest.fixture(scope="module")
def docker_client():
    docker = pytest.importorskip("docker", reason="the docker SDK is not installed")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # no engine, no socket, no permission
        pytest.skip(f"docker is unavailable ({exc}); start it with scripts/setup.sh")
    yield client
    client.close()


@pytest.fixture(scope="module")
def image(docker_client):
    out = subprocess.run(["bash", str(ROOT / "lab/vllm/build.sh")], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    ref = out.stdout.strip().splitlines()[-1]
    return docker_client.images.get(ref)


@pytest.fixture(scope="module")
def tiny_model():
    out = subprocess.run(["bash", str(ROOT / "lab/models/build.sh"), "gpufleet/tiny-llama"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return TINY


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kv_tokens_expected(config, kv_bytes, max_model_len):
    """vLLM's arithmetic (vllm/v1/core/kv_cache_utils.py): pages of CPU_BLOCK_SIZE tokens,
    num_blocks = kv_bytes // page_bytes // layers; the log reports
    num_blocks / blocks_per_request * max_model_len."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    page_bytes = 2 * kv_heads * head_dim * 2 * CPU_BLOCK_SIZE  # K and V, bf16
    num_blocks = kv_bytes // page_bytes // config["num_hidden_layers"]
    blocks_per_request = -(-max_model_len // CPU_BLOCK_SIZE)
    return int(num_blocks / blocks_per_request * max_model_len)


def _serve(client, image, model_dir, extra_args, api_key):
    import requests

    port = _free_port()
    container = client.containers.run(
        image.id,
        command=["--model", "/models/tiny-llama", "--served-model-name", "tiny",
                 "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
                 "--enforce-eager", *extra_args],
        environment={"VLLM_API_KEY": api_key},
        volumes={str(model_dir): {"bind": "/models/tiny-llama", "mode": "ro"}},
        network_mode="host", shm_size="1g", name=f"vllmimg-test-{uuid.uuid4().hex[:8]}",
        detach=True)
    start = time.monotonic()
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        container.reload()
        if container.status != "running":
            logs = container.logs().decode(errors="replace")[-3000:]
            container.remove(force=True)
            pytest.fail(f"vLLM exited before it was healthy:\n{logs}")
        if time.monotonic() - start > HEALTH_TIMEOUT_S:
            logs = container.logs().decode(errors="replace")[-3000:]
            container.remove(force=True)
            pytest.fail(f"vLLM not healthy after {HEALTH_TIMEOUT_S} s:\n{logs}")
        time.sleep(1)
    return container, f"http://127.0.0.1:{port}"


def _kv_tokens_logged(container):
    logs = container.logs().decode(errors="replace")
    found = re.search(r"CPU KV cache size: ([\d,]+) tokens", logs)
    assert found, f"no 'CPU KV cache size' line in the log:\n{logs[-3000:]}"
    return int(found.group(1).replace(",", ""))


@pytest.mark.slow
def test_image_is_shaped_like_the_official_one(image):
    cfg = image.attrs["Config"]
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert cfg["Entrypoint"] == ["vllm", "serve"]
    assert not cfg["Cmd"]
    assert cfg["WorkingDir"] == "/vllm-workspace"
    assert env["NVIDIA_REQUIRE_CUDA"].startswith("cuda>=13.0 brand=unknown,driver>=535,driver<536 ")
    assert env["CUDA_VERSION"].startswith("13.0.")
    assert env["TORCH_CUDA_ARCH_LIST"] == "7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX"
    assert env["HF_HOME"] == "/root/.cache/huggingface"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env  # would override --kv-cache-memory-bytes
    assert cfg["Labels"]["org.gpufleet.role"] == "lab-cpu-standin"


@pytest.mark.slow
def test_the_version_module_reads_the_release_the_image_runs(image, monkeypatch):
    """plugins/modules/vllm_image_version against the real lab image: its python3 reads the vllm
    distribution ("0.32.0+cpu", the image's alias of vllm-cpu) and the tuner gets the
    release, 0.32.0; the throwaway container is gone afterwards."""
    import docker
    import vllm_image_version
    from helpers import run_module

    name = f"vllmimg-test-version-{uuid.uuid4().hex[:8]}"
    result, failed = run_module(vllm_image_version.main, {
        "image": image.tags[0], "name": name}, monkeypatch, check_mode=True)
    assert not failed, result
    assert result["version"] == "0.32.0" and result["installed"] == "vllm 0.32.0+cpu", result
    assert not result["changed"]
    with pytest.raises(docker.errors.NotFound):
        docker.from_env().containers.get(name)


@pytest.mark.slow
def test_every_serve_argument_of_the_image_is_classified(image):
    """tests/differential/serve_args.py in the image lists every `vllm serve` option
    string; it must be the recorded list (tests/fixtures/vllm-args/serve-0.32.0.json)
    that plugins/module_utils/gpufleet/engine_args.py classifies (tests/unit/test_engine_args.py).
    A vLLM with an argument nobody classified fails here, naming it."""
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
         "-v", f"{ROOT / 'tests' / 'differential'}:/d:ro", image.tags[0], "/d/serve_args.py"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    now = json.loads(out.stdout)
    recorded = json.loads((ROOT / "tests/fixtures/vllm-args/serve-0.32.0.json").read_text())
    flags = {f for arg in now["arguments"] for f in arg["flags"]}
    known = {f for arg in recorded["arguments"] for f in arg["flags"]}
    assert flags - known == set(), f"unclassified vllm serve arguments: {sorted(flags - known)}"
    assert known - flags == set(), f"arguments vLLM no longer has: {sorted(known - flags)}"
    assert now == recorded


@pytest.mark.slow
def test_a_start_with_nothing_sized_fits_a_small_machine_and_serves_only_with_the_key(
        docker_client, image, tiny_model):
    """With no KV size at all, vLLM CPU would ask for 92 % of the NUMA node and refuse
    to start on a lab machine; the image's fallback gives it 1 GiB instead. The same start
    serves completions to the key alone (VLLM_API_KEY), and the key is not in its log.
    (An explicit size is never overridden: test_lab_kv_default_only_when_caller_sized_nothing
    above, and every start of tests/slow/test_tune_vs_vllm.py gives vLLM the tuner's size
    and reads it back.)"""
    import requests

    api_key = uuid.uuid4().hex
    container, url = _serve(docker_client, image, tiny_model, ["--dtype", "bfloat16"], api_key)
    try:
        config = json.loads((tiny_model / "config.json").read_text())
        assert _kv_tokens_logged(container) == _kv_tokens_expected(config, 1024**3, 256)

        body = {"model": "tiny", "prompt": "The capital of France is", "max_tokens": 8,
                "temperature": 0}
        anonymous = requests.post(f"{url}/v1/completions", json=body, timeout=60)
        assert anonymous.status_code == 401

        answer = requests.post(f"{url}/v1/completions", json=body, timeout=120,
                               headers={"Authorization": f"Bearer {api_key}"})
        assert answer.status_code == 200, answer.text
        data = answer.json()
        assert data["model"] == "tiny"
        assert isinstance(data["choices"][0]["text"], str)
        assert 1 <= data["usage"]["completion_tokens"] <= 8
        assert api_key not in container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
