"""DeepSeek-V4's KV cache: the tuner against vLLM's own code, run in the lab image.

Runs tests/differential/deepseek_v4_vllm.py inside gpufleet/vllm-cpu:lab (vllm
0.32.0, CPU build, no GPU, no weights, no network): it builds the per-layer KV cache
specs the V4 model builds from the Flash and Pro config.json files and calls vLLM's
kv_cache_utils for each TP size (1/2/4/8), --block-size (128/256), --kv-cache-dtype
(auto/fp8/bfloat16) and max_model_len. The tuner's blocks, maximum concurrency,
"KV cache size" tokens, estimated maximum model length, bytes per block and groups must
EQUAL vLLM's for every combination vLLM accepts, and the tuner must refuse the others
with vLLM's reason (tests/helpers.deepseek_v4_vs_vllm).

The recorded output (tests/fixtures/vllm-kv/deepseek-v4.json, which the fast path
checks) must also still be what vLLM prints. About 20-30 s on 2 cores.
"""
import json
import pathlib
import subprocess

import pytest

from helpers import deepseek_v4_vs_vllm
# Shared docker fixtures (the SDK client; the image, built when missing).
from test_vllm_image import docker_client, image  # noqa: F401

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = "tests/differential/deepseek_v4_vllm.py"
RECORDED = ROOT / "tests" / "fixtures" / "vllm-kv" / "deepseek-v4.json"


def _numbers(doc):
    """The recorded document without its timing."""
    return {k: v for k, v in doc.items() if k != "seconds"}


def test_tuner_equals_vllm_for_deepseek_v4(image):  # noqa: F811
    ref = image.tags[0] if image.tags else image.id
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-v", f"{ROOT}:/src:ro",
         "--entrypoint", "python", ref, f"/src/{SCRIPT}"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    fresh = json.loads(out.stdout)
    assert fresh["vllm_version"] == "0.32.0"
    compared, refused, diffs = deepseek_v4_vs_vllm(fresh)
    assert not diffs, "\n".join(diffs[:20])
    assert compared == 312 and refused == 96
    assert _numbers(fresh) == _numbers(json.loads(RECORDED.read_text())), (
        "vLLM's numbers changed: re-record tests/fixtures/vllm-kv/deepseek-v4.json "
        "(command in tests/fixtures/vllm-kv/SOURCES.md)")
