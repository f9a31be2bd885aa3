"""Every `vllm serve` argument of vLLM 0.32.0 classified (issue #34 item 1,
plugins/module_utils/gpufleet/engine_args.py), and the tuner acting on the class: a flag the
tuner or vllm_server sets, or whose memory the tuner does not model, is refused in
extra_args with what to do; a flag the tuner reads changes its settings as it changes
what vLLM runs with; every other flag is passed through.

The arguments are vLLM's own, recorded from the lab image
(tests/fixtures/vllm-args/serve-0.32.0.json, written by tests/differential/serve_args.py;
tests/slow/test_vllm_image.py regenerates it from the image and compares).
Run with -s to print the count per class."""
import collections
import json
import pathlib

import pytest

from conftest import FIXTURES
from gpufleet import engine_args, tune
from gpufleet import gpu as gpu_facts
from gpufleet.model import describe_config
from helpers import pinning_lock

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECORDED = json.loads((ROOT / "tests/fixtures/vllm-args/serve-0.32.0.json").read_text())
FLAGS = [flag for arg in RECORDED["arguments"] for flag in arg["flags"]]
MODELS = ROOT / "tests" / "fixtures" / "models"
GiB = 1024 ** 3
A10G = gpu_facts.parse_nvidia_smi_xml(
    (FIXTURES / "nvidia-smi" / "telegraf-a10g.xml").read_text())["devices"]  # 23028 MiB, 8.6


def _llama():
    config = json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text())
    return describe_config(config, weights_bytes=16_060_522_496)


def test_the_recorded_arguments_are_vllm_0_32_0s():
    assert RECORDED["vllm_version"].startswith("0.32.0")
    assert len(RECORDED["arguments"]) == 317 and len(FLAGS) == len(set(FLAGS)) == 430


def test_every_flag_the_table_names_is_a_flag_of_vllm():
    """No class holds a name vLLM does not have (a typo would classify nothing)."""
    named = (set(engine_args.TUNED) | set(engine_args.SERVER) | set(engine_args.NOT_MODELLED)
             | set(engine_args.READ) | set(engine_args.PASSED))
    assert named - set(FLAGS) == set(), sorted(named - set(FLAGS))
    # PASSED is a note on passed-through flags, not a class
    assert [f for f in engine_args.PASSED if engine_args.classify(f) != "passed through"] == []
    # and no flag is in two classes
    counts = collections.Counter(list(engine_args.TUNED) + list(engine_args.SERVER)
                                 + list(engine_args.NOT_MODELLED) + list(engine_args.READ))
    assert [f for f, n in counts.items() if n > 1] == []


def test_the_table_per_class(capsys):
    """Every recorded argument has a class; the count per class (the issue's "Must
    show"): an argument is counted once, by its first flag."""
    per_class = collections.Counter(engine_args.classify(arg["flags"][0])
                                    for arg in RECORDED["arguments"])
    with capsys.disabled():
        print("\n[engine args] vLLM 0.32.0 `vllm serve`: "
              + ", ".join(f"{k} {per_class[k]}" for k in engine_args.CLASSES)
              + f" (of {len(RECORDED['arguments'])} arguments)")
    assert sum(per_class.values()) == 317
    # 226 passed through (classified by name) until each was checked in vLLM 0.32.0's
    # code: 31 went to not modelled and --device-ids to server (MOVED below);
    # --pipeline-parallel-size went from not modelled to tuned (issue #34 item 3);
    # --speculative-config (-sc), --spec-method, --spec-model, --spec-tokens from not
    # modelled to read (issue #34 item 2: gpufleet.speculative)
    assert dict(per_class) == {"tuned": 13, "server": 12, "not modelled": 88, "read": 10,
                               "passed through": 194}, dict(per_class)
    # every flag of an argument has the class of its first (aliases agree), but the off
    # form of a boolean the tuner does not model (--no-enable-lora: vLLM's default)
    for arg in RECORDED["arguments"]:
        on = {engine_args.classify(f) for f in arg["flags"] if not f.startswith("--no-")}
        assert len(on) == 1, arg
        for flag in arg["flags"]:
            if flag.startswith("--no-"):
                assert engine_args.classify(flag) in on | {"passed through"}, flag


def test_the_four_arguments_of_the_issue_are_refused_not_ignored():
    """At 170a6fc each of these in extra_args gave the same prediction and settings as
    without it (the settings even reported another max_num_batched_tokens)."""
    llama = _llama()
    for extra, option in ((["--max-num-batched-tokens", "4096"], "max_num_batched_tokens"),
                          (["--block-size=32"], "block_size"),
                          # since issue #34 item 3 the refusal names the option
                          (["--pipeline-parallel-size", "2"], "pipeline_parallel_size"),
                          (["-pp", "2"], "pipeline_parallel_size"),
                          # since issue #34 item 2 read: refused here for what it lacks
                          # (tests/unit/test_tune_speculative.py plans the modelled ones)
                          (["--speculative-config", '{"method": "eagle3"}'],
                           "num_speculative_tokens"),
                          (["-sc", "{}"], "--speculative-config")):
        with pytest.raises(tune.TuneError) as err:
            tune.plan(llama, A10G, max_model_len=8192, extra_args=extra)
        assert extra[0].split("=")[0] in str(err.value) and option in str(err.value), err.value


@pytest.mark.parametrize("extra, pointer", [
    (["--max-model-len", "4096"], "the option max_model_len"),
    (["-tp", "2"], "the option tensor_parallel_size"),
    (["--pipeline-parallel-size", "2"], "the option pipeline_parallel_size"),
    (["-pp=4"], "the option pipeline_parallel_size"),
    (["--gpu-memory-utilization=0.8"], "the option gpu_memory_utilization"),
    (["--kv-cache-dtype", "fp8"], "the option kv_cache_dtype"),
    (["--max-num-seqs", "8"], "the option target_concurrency"),
    (["--served-model-name", "x"], "served_model_name"),
    (["--port", "9000"], "port"),
    (["--config", "/etc/x.yaml"], "config file"),
    (["--hf-token", "hf_secret_value"], "process list"),
    (["--quantization", "fp8"], "quantized ahead"),
    (["--enable-lora"], "LoRA"),
    (["--num-gpu-blocks-override", "100"], "KV blocks"),
    (["-O3"], "CUDA graph"),
])
def test_a_refusal_names_what_sets_it_instead(extra, pointer):
    with pytest.raises(tune.TuneError) as err:
        tune.plan(_llama(), A10G, max_model_len=8192, extra_args=extra)
    assert pointer in str(err.value), err.value
    assert "Remove it" in str(err.value)
    assert "hf_secret_value" not in str(err.value)  # a refusal never echoes a value


def test_flags_passed_through_and_values_are_not_flags():
    llama = _llama()
    extra = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--seed", "-1",
             "--chat-template", "{{ x }}", "--trust-remote-code"]
    result = tune.plan(llama, A10G, max_model_len=8192, extra_args=extra,
                       lock=pinning_lock(llama))
    assert result["args"][-len(extra):] == extra
    assert engine_args.flag_of("-1") is None and engine_args.flag_of("hermes") is None
    assert engine_args.flag_of("--block-size=16") == "--block-size"


def test_what_the_tuner_reads_from_extra_args_is_in_its_settings():
    llama = _llama()
    plain = tune.plan(llama, A10G, max_model_len=8192)
    eager = tune.plan(llama, A10G, max_model_len=8192, extra_args=["--enforce-eager"])
    option = tune.plan(llama, A10G, max_model_len=8192, enforce_eager=True)
    # --enforce-eager in extra_args plans exactly as the option: no graph memory, so more KV
    assert eager["settings"]["enforce_eager"] and eager["prediction"] == option["prediction"]
    assert eager["prediction"]["kv_cache_bytes"] > plain["prediction"]["kv_cache_bytes"]
    assert eager["args"].count("--enforce-eager") == 1
    off = tune.plan(llama, A10G, max_model_len=8192,
                    extra_args=["--no-enable-prefix-caching", "--no-enable-chunked-prefill"])
    assert plain["settings"]["enable_prefix_caching"] and plain["settings"]["enable_chunked_prefill"]
    assert not off["settings"]["enable_prefix_caching"]
    assert not off["settings"]["enable_chunked_prefill"]
    assert "--enable-prefix-caching" not in off["args"]
    with pytest.raises(tune.TuneError, match="say it once"):
        tune.plan(llama, A10G, max_model_len=8192, enforce_eager=True,
                  extra_args=["--no-enforce-eager"])


def test_hf_overrides_may_rename_an_architecture_only():
    """docs/tuning.md's use (gte-multilingual-base: NewModel -> GteNewModel) passes; an
    override of a field the plan reads from config.json does not."""
    llama = _llama()
    rename = ["--hf-overrides", '{"architectures": ["LlamaForCausalLM"]}']
    assert tune.plan(llama, A10G, max_model_len=8192, extra_args=rename)["args"][-2:] == rename
    for extra in (["--hf-overrides", '{"max_position_embeddings": 1000000}'],
                  ['--hf-overrides={"num_hidden_layers": 2, "architectures": []}'],
                  ["--hf-overrides", "not json"], ["--hf-overrides"]):
        with pytest.raises(tune.TuneError, match="--hf-overrides"):
            tune.plan(llama, A10G, max_model_len=8192, extra_args=extra)



# Passed through by name until checked where vLLM 0.32.0 reads them (the lab image's vllm
# package): each changes the weights per GPU, the KV pool or the blocks a request holds,
# the profiled peak, or the concurrency the plan promises. flag -> what the refusal cites.
MOVED = {
    "--performance-mode": "cudagraph_capture_sizes",
    "--enable-dbo": "workspace per microbatch", "--ubatch-size": "workspace per microbatch",
    "--all2all-backend": "communication buffers",
    "--disable-custom-all-reduce": "custom all-reduce",
    "--enable-batch-sharded-sampling": "BatchSharder",
    "--attention-config": "attention backend", "-ac": "attention backend",
    "--kernel-config": "repack quantized", "--moe-backend": "repack quantized",
    "--linear-backend": "repack quantized",
    "--enable-cumem-allocator": "CuMemAllocator",
    "--enable-return-routed-experts": "routed_experts_capturer.py",
    "--aux-output-config": "routed_experts_capturer.py",
    "--enable-trace-replay": "TraceReplayState",
    "--enable-prompt-embeds": "embeddings buffer",
    "--use-replayssm": "ring buffers",
    "--logits-processors": "build_custom_logits_processors",
    "--worker-cls": "determine_available_memory",
    "--model-class-overrides": "another model class",
    "--model-impl": "Transformers",
    "--config-format": "params.json",
    "--load-format": "ipc_cache",
    "--enable-mm-embeds": "encoder cache",
    "--mm-processor-kwargs": "encoder cache", "--video-pruning-rate": "encoder cache",
    "--mm-encoder-only": "encoder's weights only",
    "--mm-encoder-tp-mode": "whole weights on every GPU",
    "--mm-encoder-attn-backend": "get_vit_attn_backend",
    "--mm-encoder-attn-dtype": "get_vit_attn_backend",
    "--watermark": "target_concurrency", "--max-num-active-seqs": "target_concurrency",
    "--device-ids": "GPU group",
}


@pytest.mark.parametrize("flag", sorted(MOVED))
def test_a_flag_that_changes_memory_is_refused_with_why(flag):
    """Control: with main's engine_args.py (1aa549b) every one of these passed through."""
    assert flag in FLAGS
    with pytest.raises(tune.TuneError) as err:
        engine_args.check_extra_args([flag])
    assert flag in str(err.value) and MOVED[flag] in str(err.value), err.value
    assert "Remove it" in str(err.value)


def test_the_off_form_of_a_moved_boolean_passes():
    """--no-enable-dbo asks for vLLM's default, which the plan models."""
    for flag in ("--no-enable-dbo", "--no-enable-prompt-embeds", "--no-use-replayssm",
                 "--no-disable-custom-all-reduce", "--no-enable-cumem-allocator"):
        assert flag in FLAGS and engine_args.classify(flag) == "passed through", flag
        assert engine_args.check_extra_args([flag]) == [flag]
