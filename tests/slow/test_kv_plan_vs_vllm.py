"""The tuner's KV cache plans against vLLM's own code, run in the lab image.

Each tests/differential/ script runs inside gpufleet/vllm-cpu:lab (vllm 0.32.0, CPU
build, no GPU, no weights, no network): it builds the per-layer KV cache specs the
model builds from its config.json and calls vLLM's kv_cache_utils for each case. The
tuner's blocks, maximum concurrency, "KV cache size" tokens, estimated maximum model
length, bytes per block and groups must EQUAL vLLM's for every case vLLM accepts, and
the tuner must refuse the others with vLLM's reason (tests/helpers.kv_plan_vs_vllm).

- deepseek_v4_vllm.py: DeepSeek-V4-Flash and -Pro, TP 1/2/4/8, --block-size 128/256,
  --kv-cache-dtype auto/fp8/bfloat16, three lengths (about 20-30 s on 2 cores).
- gemma4_vllm.py: gemma-4-26B-A4B's and gemma-4-31B-it's two page sizes on
  FlashAttention and Triton (TP 1/2/4/8) and the CPU backend (about 15 s).
- families_vllm.py: every described family built by its own vLLM model class on the
  meta device (tests/unit/test_kv_families_vs_vllm.py compares the whole recording);
  here a SAMPLE, SAMPLE_FAMILIES: an alternating sliding-window family (gemma2) and an
  MLA family (deepseek_v2); 55 s measured under load (load average 7-9 on 2 cores),
  most of it vLLM's import and ModelConfig's model inspection, not the cases.

The recorded output (tests/fixtures/vllm-kv/*.json, which the fast path checks) must
also still be what vLLM prints.

The three scripts run in ONE container, one Python process (tests/differential/
run_many.py), so vLLM and torch are imported once: 39 s for the three on this machine,
where three `docker run`s took about 60 s in CI (25 + 19 + 16 s, clean-clone run of
2026-12-07).
"""
import json
import pathlib
import subprocess

import pytest

from helpers import DEEPSEEK_V4_REFUSALS, TP_REFUSALS, kv_plan_vs_vllm
# Shared docker fixtures (the SDK client; the image, built when missing).
from test_vllm_image import docker_client, image  # noqa: F401

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "vllm-kv"

SAMPLE_FAMILIES = ("gemma2", "deepseek_v2")
# script, recorded output, refusals, numbers compared, cases both refuse, the
# recording's models the run covers (None: all)
CHECKS = {
    "deepseek-v4": ("tests/differential/deepseek_v4_vllm.py", "deepseek-v4.json",
                    DEEPSEEK_V4_REFUSALS, 312, 96, None),
    "gemma-4": ("tests/differential/gemma4_vllm.py", "gemma-4.json", (), 508, 0, None),
    "families-sample": ("tests/differential/families_vllm.py", "families.json",
                        TP_REFUSALS, None, None, SAMPLE_FAMILIES),
}


def _numbers(doc):
    """The recorded document without its timing."""
    return {k: v for k, v in doc.items() if k != "seconds"}


def _sample(doc, models):
    return doc if models is None else dict(doc, models={k: doc["models"][k] for k in models})


def _argument(name):
    """run_many.py's argument for a check: the script and its --models."""
    script, models = CHECKS[name][0], CHECKS[name][5]
    argument = pathlib.Path(script).name
    return argument if models is None else f"{argument} --models {','.join(models)}"


@pytest.fixture(scope="module")
def vllm_runs(image):  # noqa: F811
    """Every check's script, run once in one container: {name: its JSON document}."""
    ref = image.tags[0] if image.tags else image.id
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-v", f"{ROOT}:/src:ro",
         "--entrypoint", "python", ref, "/src/tests/differential/run_many.py"]
        + [_argument(name) for name in CHECKS],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    documents = json.loads(out.stdout)
    return {name: documents[_argument(name)] for name in CHECKS}


@pytest.mark.parametrize("name", CHECKS)
def test_tuner_equals_vllm(vllm_runs, name):
    _, recorded, refusals, expected_compared, expected_refused, models = CHECKS[name]
    fresh = vllm_runs[name]
    assert fresh["vllm_version"] == "0.32.0"
    compared, refused, diffs = kv_plan_vs_vllm(fresh, refusals)
    assert not diffs, "\n".join(diffs[:20])
    assert compared == (expected_compared or compared) and refused == (
        expected_refused or refused) and compared
    old = _sample(json.loads((RECORDED / recorded).read_text()), models)
    assert _numbers(fresh) == _numbers(old), (
        f"vLLM's numbers changed: re-record tests/fixtures/vllm-kv/{recorded} "
        "(command in tests/fixtures/vllm-kv/SOURCES.md)")
