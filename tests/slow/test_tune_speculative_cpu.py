"""Speculative decoding on a running engine (issue #34 item 2): an EAGLE-3 draft, planned
by the vllm_tune module, mounted as roles/vllm_server mounts it, started on the lab's
CPU build, and the KV cache vLLM logs compared with the plan.

Real software only. The draft is a tiny random EAGLE-3 head for gpufleet/tiny-llama
(lab/models/eagle3_draft.py, run by the lab image's own python: one layer of the target's
4 heads / 2 KV heads x 32, bfloat16). The vllm_tune module (main(), through
tests/helpers.run_module) plans tiny-llama with `gpus: []`, `kv_cache_memory_bytes`
16 MiB and `speculative_model_path` the draft's folder; the model's
`--speculative-config` names the draft by a hub name, as a user writes it.
gpufleet.serve.plan_instances (what vllm_serve_plan runs) then gives the container's
mounts and command: the draft's folder mounted read-only at serve.draft_mount and the
config's "model" rewritten to that path. The container is started with that mount and
those arguments (tests/slow/test_tune_vs_vllm.py's Server: the model at /models/m, the
listen address and port added), and must log that it loaded the drafter and
`CPU KV cache size: 21,760 tokens, Maximum concurrency for 1,024 tokens per request:
21.25x`, which the module's prediction must equal: the draft's layer joins the
target's two in one KV cache group (3 layers x 2 x 2 KV heads x 32 x 2 B = 768 B a
token; 16 MiB / (768 x 128) = 170 blocks of 128 = 21,760 tokens; without the drafter
it would be 32,768 tokens, 32.00x). The n-gram method (no layer, no weight; the same
figures as without it) was started by hand with the same model and budget: vLLM logged
32,768 tokens / 32.00x, the plan's figures (docs/tuning.md "Speculative decoding",
tests/unit/test_tune_speculative.py, which holds both logged lines as fixtures).

One container, removed whatever happens; every wait bounded. Measured 2026-12-07 on the
2 shared cores: 1 passed in 28 s (healthy after 26 s), and 54 s (healthy after 48 s) at
load average 4.5, when one case of test_tune_vs_vllm.py took 49 s. Control (run by hand:
the container started without the draft's mount): vLLM stops with "Value error, Invalid
repository ID or local directory specified: '/models/tiny-draft'", 1 failed in 22 s.
"""
import json
import subprocess

import pytest

from gpufleet import kv_log, serve
from helpers import run_module
from test_tune_vs_vllm import (CONTAINER_PATH, ROOT, VLLM_VERSION, Server, lab_models,  # noqa: F401
                               vllm_cache)
from test_vllm_image import docker_client, image  # noqa: F401

pytestmark = pytest.mark.slow

KV_BYTES = 16 * 1024 * 1024
MAX_MODEL_LEN = 1024
SPEC = {"method": "eagle3", "model": "gpufleet/tiny-llama-eagle3", "num_speculative_tokens": 2}
# What vLLM 0.32.0 logged for this case (also tests/fixtures/vllm-kv/speculative-cpu.json)
LOGGED = (21_760, 21.25)


@pytest.fixture
def draft(image, lab_models, tmp_path):  # noqa: F811 (fixtures imported above)
    """The tiny EAGLE-3 draft for tiny-llama, written by the lab image's python."""
    out = tmp_path / "draft"
    out.mkdir()
    target = lab_models / "gpufleet/tiny-llama"
    run = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "/opt/venv/bin/python",
         "-v", f"{ROOT / 'lab/models'}:/recipe:ro", "-v", f"{target}:/target:ro",
         "-v", f"{out}:/out", image.id, "/recipe/eagle3_draft.py", "/target/config.json",
         "/out"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def test_eagle3_draft_mounted_by_the_plan_runs_and_matches(monkeypatch, docker_client, image,  # noqa: F811
                                                           lab_models, vllm_cache, draft):  # noqa: F811
    model_dir = lab_models / "gpufleet/tiny-llama"
    result, failed = run_module(__import__("vllm_tune").main, {
        "model_path": str(model_dir), "gpus": [], "vllm_version": VLLM_VERSION,
        "kv_cache_memory_bytes": KV_BYTES, "max_model_len": MAX_MODEL_LEN,
        "dtype": "bfloat16", "enforce_eager": True, "speculative_model_path": str(draft),
        "extra_args": ["--speculative-config", json.dumps(SPEC)]}, monkeypatch)
    assert not failed, result["msg"]
    assert result["settings"]["speculative"]["draft_layers"] == 1
    entry = {"name": "tiny", "path": str(model_dir), "speculative_model_path": str(draft)}
    (inst,) = serve.plan_instances(entry, result, image="img", image_id="sha256:" + "a" * 64,
                                   container_prefix="vllm-", default_port=8000,
                                   gpu_indexes=[], gpu_runtime="none", allow_replicas=False)
    (mount,) = [m for m in inst["mounts"] if m["target"] == serve.draft_mount("/models", "tiny")]
    assert mount["read_only"] and mount["source"] == str(draft.resolve())
    # the container's arguments as planned: between the model and --served-model-name
    args = inst["command"][1:inst["command"].index("--served-model-name")]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config == dict(SPEC, model=mount["target"])

    server = Server(docker_client, image, model_dir, args, vllm_cache,
                    volumes={mount["source"]: {"bind": mount["target"], "mode": "ro"}})
    try:
        healthy = server.wait_healthy()
        logs = server.logs()
    finally:
        server.stop()
    logged = kv_log.parse_kv_cache_log(logs)
    predicted = result["prediction"]
    print(f"\ntiny-llama + EAGLE-3 draft: predicted {predicted['kv_cache_tokens']:,} tokens / "
          f"{predicted['max_concurrency']}x; vLLM logged {logged['kv_cache_tokens']:,} tokens "
          f"/ {logged['max_concurrency']}x (healthy after {healthy:.0f} s)")
    assert "Loading drafter model" in logs
    assert "EAGLE drafter KV cache initialized for CPU backend" in logs
    assert (logged["kv_cache_tokens"], logged["max_concurrency"]) == LOGGED
    assert (predicted["kv_cache_tokens"], predicted["max_concurrency"]) == LOGGED
