"""Every `vllm serve` argument of vLLM 0.32.0, classified (issue #34 item 1): what a model
entry's `extra_args` may hold, and what happens to it.

The arguments are vLLM's own: tests/fixtures/vllm-args/serve-0.32.0.json lists every
option string of `vllm serve`'s parser in the lab image (tests/differential/serve_args.py,
run in gpufleet/vllm-cpu:lab; tests/slow/test_vllm_image.py regenerates it and fails on an
argument this table does not know). Each falls in one class:

- TUNED: the tuner decides it from the model, the GPUs and its options, and writes it on
  the command line; in extra_args vLLM would take the last one and run with other
  settings than the plan predicts. Refused, with the option that sets it.
- SERVER: vllm_server writes it (address, port, served name, key, shutdown); refused with
  the variable that sets it.
- NOT_MODELLED: it changes the memory arithmetic (the KV pool, the weights per GPU, the
  blocks, the profiled peak) or the concurrency the plan promises, in a way the tuner does
  not compute, so its prediction would be wrong. Refused by name, with why.
- READ: the tuner reads it from extra_args (and the prediction follows it).
- everything else: passed through as given; not read by the tuner. They configure the
  API server, parsers, logging, loading, scheduling policy, observability, or features
  that do not size the KV pool or the weights.

Each passed-through argument was checked against vLLM 0.32.0's own code in the lab image
(where its dest is read: EngineArgs.create_engine_config, vllm/config/*.py, the GPU
model runner and worker, vllm/v1/core): one that changes the weights per GPU, the KV pool
or the blocks a request holds, the profiled peak (activations, CUDA graphs, encoder
cache) or the concurrency the plan promises is NOT_MODELLED, citing where. PASSED holds,
for passed-through arguments whose name suggests memory, why they do not change it (the
memory they act on only with an argument that is refused, or what they act on instead);
it is a note, not a class.

Plain Python, no Ansible imports.
"""
from __future__ import annotations

import json

from . import model_lock, vllm_flags
from .model_description import ModelDescription
from .tune_errors import TuneError

__all__ = ["TUNED", "SERVER", "NOT_MODELLED", "READ", "PASSED", "CLASSES", "HF_OVERRIDES_ALLOWED",
           "classify", "refusal", "flag_of", "hf_overrides_refusal", "first_refusal",
           "SECRET_FLAGS", "check_extra_args", "models_with_secret_args", "serve_args"]

# flag -> the vllm_tune option (or what) sets it
TUNED = {
    "--tensor-parallel-size": "the option tensor_parallel_size", "-tp": "the option tensor_parallel_size",
    # issue #34 item 3: planned per stage (tune.py _evaluate_pp), no longer "not modelled"
    "--pipeline-parallel-size": "the option pipeline_parallel_size",
    "-pp": "the option pipeline_parallel_size",
    "--max-model-len": "the option max_model_len",
    "--max-num-seqs": "the option target_concurrency",
    "--max-num-batched-tokens": "the tuner (settings.max_num_batched_tokens, from max_model_len)",
    "--dtype": "the option dtype",
    "--gpu-memory-utilization": "the option gpu_memory_utilization",
    "--device-memory-utilization": "the option gpu_memory_utilization",
    "--kv-cache-memory-bytes": "the option kv_cache_memory_bytes",
    "--kv-cache-dtype": "the option kv_cache_dtype (with allow_fp8)",
    "--block-size": "the tuner (settings.block_size: the attention backend's)",
    "--enable-expert-parallel": "the tuner (settings.enable_expert_parallel)",
    "--no-enable-expert-parallel": "the tuner (settings.enable_expert_parallel)",
    "-ep": "the tuner (settings.enable_expert_parallel)",
    "--runner": "the tuner (the model's kind: generate or pooling)",
    "--convert": "the tuner (the model's kind: generate or pooling)",
}

# flag -> the vllm_server variable that sets it
SERVER = {
    "--model": "the model entry's path (vllm_server mounts it and names it first)",
    "--served-model-name": "the model entry's served_model_name",
    "--host": "vllm_server_bind_address",
    "--port": "the model entry's port (vllm_server_port for the first)",
    "--api-key": "vllm_server_api_key and vllm_server_api_keys_retiring (from a vault; given to vLLM in a root-only --config file)",
    "--shutdown-timeout": "vllm_server_shutdown_timeout",
    "--hf-token": ("nothing: vllm_server serves the folder model_fetch wrote, and a token on "
                   "the command line is in `docker inspect` and every process list"),
    "--config": ("the model entry's options: a config file would set arguments the plan cannot "
                 "see (vllm_server names its own, holding the API keys; vLLM takes one)"),
    "--uds": "vllm_server_bind_address and the port (the gateway and Prometheus reach TCP)",
    "--headless": "nothing: gpufleet runs one API server per instance",
    "--api-server-count": "nothing: gpufleet runs one API server per instance",
    "-asc": "nothing: gpufleet runs one API server per instance",
    "--device-ids": ("the model entry's GPU group, which vllm_server gives the container "
                     "(serve.device_request); the plan is for all of them"),
}

_DP = ("data parallelism in one container is not modelled: gpufleet runs one instance per "
       "GPU group (the model entry's replicas)")
_CP = "context parallelism is not modelled (the KV cache per GPU would differ)"
_OFFLOAD = "offloading changes the weights or the KV cache per GPU, which the plan does not compute"
_LORA = "LoRA adapters take GPU memory the plan does not reserve"
_MAMBA = "the tuner sizes mamba and linear-attention state with vLLM's own defaults only"
_QUANT = ("on-the-fly quantization changes the weights per GPU; serve a checkpoint quantized "
          "ahead (its config.json names the method, which the tuner reads)")
_GRAPH = ("CUDA graph capture sizes change the memory vLLM reserves; the option enforce_eager "
          "is what the plan models")
# the reasons below were checked in vLLM 0.32.0's code in the lab image; paths are in vllm/
_DBO = ("dual-batch overlap and microbatching keep a workspace per microbatch "
        "(v1/worker/gpu_worker.py _init_workspace_and_model_runner) and capture their own "
        "CUDA graphs")
_KERNEL = ("the GEMM and MoE kernels decide how the weights are laid out and the workspace "
           "they take (config/kernel.py KernelConfig: marlin and machete repack quantized "
           "weights, flashinfer_moe_ep_cutedsl requantizes MXFP4 at load, batched_triton "
           "sizes activations per expert); the plan follows vLLM's automatic choice")
_ROUTED = ("returning the routed experts keeps a max_num_batched_tokens x layers x top-k "
           "int32 buffer on the GPU, allocated after the KV cache "
           "(model_executor/layers/fused_moe/routed_experts_capturer.py; "
           "distributed/aux_output_connector/worker.py)")
_ATTN = ("it chooses the attention backend (whose block size and KV layout the plan "
         "follows by default), the sparse indexer's KV dtype and HiSparse's KV pool "
         "(config/attention.py AttentionConfig; v1/core/kv_cache_utils.py "
         "get_hisparse_kv_cache_config)")
_CODE = ("it loads code into vLLM's GPU worker, whose memory the plan cannot know "
         "(v1/worker/gpu/sample/logits_processor/loader.py build_custom_logits_processors "
         "builds it with the batch size)")
_MM_TOKENS = ("it changes the tokens per image or video, from which vLLM sizes the encoder "
              "cache and the profiled encoder batch (multimodal/encoder_budget.py "
              "MultiModalBudget; v1/core/encoder_cache_manager.py compute_mm_encoder_budget); "
              "the plan counts vLLM's defaults only")
_MM_ATTN = ("it chooses the multimodal encoder's attention kernel (fp8 runs cuDNN and pads "
            "Q/K/V to a multiple of 16 per head), which decides the memory of the profiled "
            "encoder batch (model_executor/models/vision.py get_vit_attn_backend, "
            "get_fp8_padded_hidden_size; TORCH_SDPA in model_executor/layers/attention/"
            "mm_encoder_attention.py); the plan counts vLLM's default")
_CONCURRENCY = "fewer requests would run at once than the option target_concurrency plans for"

# flag -> why it is refused
NOT_MODELLED = {
    "--data-parallel-size": _DP, "-dp": _DP, "--data-parallel-size-local": _DP, "-dpl": _DP,
    "--decode-context-parallel-size": _CP, "-dcp": _CP,
    "--prefill-context-parallel-size": _CP, "-pcp": _CP,
    "--dcp-kv-cache-interleave-size": _CP, "--cp-kv-cache-interleave-size": _CP,
    "--num-gpu-blocks-override": "it overrides the KV blocks the plan computes",
    "--cpu-offload-gb": _OFFLOAD, "--cpu-offload-params": _OFFLOAD,
    "--offload-backend": _OFFLOAD, "--offload-group-size": _OFFLOAD,
    "--offload-num-in-group": _OFFLOAD, "--offload-prefetch-step": _OFFLOAD,
    "--offload-params": _OFFLOAD, "--kv-offloading-size": _OFFLOAD,
    "--kv-offloading-backend": _OFFLOAD,
    "--quantization": _QUANT, "-q": _QUANT, "--quantization-config": _QUANT,
    "--enable-lora": _LORA, "--max-loras": _LORA, "--max-lora-rank": _LORA,
    "--lora-modules": _LORA, "--fully-sharded-loras": _LORA, "--max-cpu-loras": _LORA,
    "--lora-dtype": _LORA, "--lora-target-modules": _LORA, "--default-mm-loras": _LORA,
    "--enable-tower-connector-lora": _LORA,
    "--mamba-cache-dtype": _MAMBA, "--mamba-ssm-cache-dtype": _MAMBA,
    "--mamba-block-size": _MAMBA, "--mamba-cache-mode": _MAMBA,
    "--kv-cache-dtype-skip-layers": "per-layer KV dtypes are not modelled (the option kv_cache_dtype sets all)",
    "--disable-hybrid-kv-cache-manager": ("the tuner computes the hybrid KV cache manager's "
                                          "pools (vLLM's default), not one pool per layer"),
    "--disable-sliding-window": ("the tuner sizes sliding-window layers as vLLM does by "
                                 "default; disabling it makes them full attention"),
    "--kv-sharing-fast-prefill": "KV sharing across layers is not modelled",
    "--hf-config-path": "the plan reads the model folder's own config.json",
    "--cudagraph-capture-sizes": _GRAPH, "--max-cudagraph-capture-size": _GRAPH,
    "--compilation-config": _GRAPH, "-cc": _GRAPH, "--optimization-level": _GRAPH,
    "--kv-transfer-config": "a KV transfer connector (disaggregated prefill) is not modelled",
    "--enable-sleep-mode": "sleep mode changes how vLLM allocates memory; not modelled",
    "--limit-mm-per-prompt": ("the multimodal encoder's cache is sized from it; the plan "
                              "counts vLLM's defaults only"),
    "--mm-processor-cache-gb": "the multimodal processor cache is not modelled",
    "--language-model-only": "the plan counts the whole checkpoint's weights",
    "--max-num-scheduled-tokens": "the tuner sizes the batch from max_num_batched_tokens",
    "--attention-backend": ("the attention backend decides the KV block size and layout; the "
                            "tuner follows the backend vLLM picks by default"),
    "--skip-mm-profiling": ("vLLM would not profile the multimodal encoder, and size the KV "
                            "pool from a profile the plan does not make"),
    "--mm-ipc-gpu-memory-gb": "GPU memory for multimodal IPC is not modelled",
    "--mm-processor-device": "a multimodal processor on the GPU takes memory the plan does not count",
    "--ec-manager-config": "an encoder cache manager is not modelled",
    "--ec-transfer-config": "an encoder cache transfer connector is not modelled",
    "--enable-elastic-ep": _DP, "--elastic-ep-max-dp-size": _DP,
    "--enable-eplb": "expert load balancing adds redundant experts the plan does not count",
    "--eplb-config": "expert load balancing adds redundant experts the plan does not count",
    # found passed through by name, moved after reading where vLLM 0.32.0 uses them
    "--performance-mode": ("'interactivity' captures CUDA graphs at every batch size up to "
                           "32 (config/vllm.py, the default cudagraph_capture_sizes) and "
                           "'throughput' doubles the default batch sizes "
                           "(engine/arg_utils.py "
                           "_set_default_max_num_seqs_and_batched_tokens_args); "
                           "the plan models the default, 'balanced'"),
    "--enable-dbo": _DBO, "--ubatch-size": _DBO,
    "--all2all-backend": ("the expert-parallel all-to-all backend allocates its own "
                          "communication buffers (DeepEP, NIXL EP) or redundant experts "
                          "(moonep) (config/parallel.py all2all_backend); the plan models "
                          "the default allgather_reducescatter"),
    "--disable-custom-all-reduce": ("the plan's all-reduce reserve per GPU under tensor "
                                    "parallelism was measured with vLLM's custom all-reduce "
                                    "buffers (v1/worker/gpu_worker.py "
                                    "init_worker_distributed_environment)"),
    "--enable-batch-sharded-sampling": ("each tensor-parallel rank samples a slice of the "
                                        "batch (v1/worker/gpu/model_runner.py BatchSharder), "
                                        "so the sampler's part of the profiled peak is not "
                                        "the plan's"),
    "--attention-config": _ATTN, "-ac": _ATTN,
    "--kernel-config": _KERNEL, "--moe-backend": _KERNEL, "--linear-backend": _KERNEL,
    "--enable-cumem-allocator": ("it puts the weights and the KV cache in CuMemAllocator's "
                                 "pool, as sleep mode does (v1/worker/gpu_worker.py "
                                 "_maybe_get_memory_pool_context)"),
    "--enable-return-routed-experts": _ROUTED, "--aux-output-config": _ROUTED,
    "--enable-trace-replay": ("it keeps a max_num_seqs x max_model_len int32 tensor on the "
                              "GPU (v1/worker/gpu/sample/trace_replay.py TraceReplayState)"),
    "--enable-prompt-embeds": ("it allocates a max_num_batched_tokens x hidden size "
                               "embeddings buffer and per-request embedding state on the GPU "
                               "(v1/worker/gpu/model_states/default.py)"),
    "--use-replayssm": (_MAMBA + " (ReplaySSM adds ring buffers to each Mamba2 state: "
                        "model_executor/layers/mamba/mamba_utils.py)"),
    "--logits-processors": _CODE,
    "--worker-cls": ("it replaces vLLM's GPU worker, which measures the memory and sizes the "
                     "KV pool (v1/worker/worker_base.py; v1/worker/gpu_worker.py "
                     "determine_available_memory)"),
    "--model-class-overrides": ("it runs another model class than the one whose layers and "
                                "KV cache specs the plan reads from config.json "
                                "(config/model.py _maybe_register_model_class_overrides)"),
    "--model-impl": ("the Transformers or TerraTorch implementation builds other layers than "
                     "vLLM's, whose KV cache specs the plan follows (config/model.py model_impl)"),
    "--config-format": ("'mistral' reads the model's params.json, not the config.json the "
                        "plan reads (config/model.py config_format)"),
    "--load-format": ("it decides where the weights come from: ipc_cache maps a daemon's GPU "
                      "copy through CUDA IPC, the sharded formats read pre-sharded state dicts "
                      "and skip maybe_untie_word_embeddings (model_executor/model_loader/"
                      "__init__.py; config/vllm.py); the plan counts the model folder's files"),
    "--enable-mm-embeds": ("vLLM sizes the encoder cache from the modalities it enables "
                           "(multimodal/encoder_budget.py MultiModalBudget); the plan counts "
                           "vLLM's defaults only"),
    "--mm-processor-kwargs": _MM_TOKENS, "--video-pruning-rate": _MM_TOKENS,
    "--mm-encoder-only": ("vLLM then loads the multimodal encoder's weights only "
                          "(model_executor/model_loader/default_loader.py "
                          "_init_mm_encoder_only_weight_filter); the plan counts the whole "
                          "checkpoint's weights"),
    "--mm-encoder-attn-backend": _MM_ATTN, "--mm-encoder-attn-dtype": _MM_ATTN,
    "--mm-encoder-tp-mode": ("'data' keeps the encoder's whole weights on every GPU "
                             "(config/multimodal.py mm_encoder_tp_mode); the plan shares all "
                             "weights across the tensor-parallel GPUs"),
    "--watermark": ("it keeps that fraction of the KV blocks free when admitting requests "
                    "(v1/core/kv_cache_manager.py watermark_blocks): " + _CONCURRENCY),
    "--max-num-active-seqs": ("it caps the running requests below max_num_seqs "
                              "(config/scheduler.py max_num_active_seqs): " + _CONCURRENCY),
}

_SPEC_READ = ("speculative decoding: eagle/eagle3 (with the option speculative_model_path), "
              "mtp (DeepSeek-V4) and ngram are planned; other methods are refused by name")
# flags the tuner reads from extra_args (its prediction follows them)
READ = {
    "--hf-overrides": ("only an architecture rename (the fields the plan reads come from "
                       "config.json; see hf_overrides_refusal)"),
    "--enforce-eager": "no CUDA graphs (as the option enforce_eager)",
    "--no-enforce-eager": "CUDA graphs (the default)",
    "--trust-remote-code": "a config class only the repository defines",
    "--no-trust-remote-code": "no repository code (the default)",
    "--async-scheduling": "async scheduling", "--no-async-scheduling": "no async scheduling",
    "--enable-prefix-caching": "prefix caching (the tuner's default: on)",
    "--no-enable-prefix-caching": "no prefix caching",
    "--enable-chunked-prefill": "chunked prefill (the tuner's default: on)",
    "--no-enable-chunked-prefill": "no chunked prefill",
    # issue #34 item 2: gpufleet.speculative (the drafter's KV layers and weights,
    # async scheduling); methods and keys it does not model are refused there, by name
    "--speculative-config": _SPEC_READ, "-sc": _SPEC_READ,
    "--spec-method": _SPEC_READ, "--spec-model": _SPEC_READ, "--spec-tokens": _SPEC_READ,
}

_ONLY_WITH = "it acts only with {}, which is refused"
_DP_ONLY = _ONLY_WITH.format("data parallelism (--data-parallel-size)")
_LORA_ONLY = _ONLY_WITH.format("LoRA (--enable-lora)")
_SLEEP_ONLY = (_ONLY_WITH.format("--enable-sleep-mode")
               + " (config/vllm.py use_cumem_cudagraph_pool; v1/worker/gpu_worker.py)")
_DBO_ONLY = _ONLY_WITH.format("--enable-dbo or --ubatch-size") + " (v1/worker/ubatch_utils.py)"
_QUEUE = "a limit in the API server: requests over it get HTTP 503 (config/scheduler.py)"
_DCP_ONLY = _ONLY_WITH.format("decode context parallelism")
_FP8_VIT = (_ONLY_WITH.format("--mm-encoder-attn-dtype fp8") + " (config/multimodal.py): "
            "scales for the encoder's attention")
_MAMBA_KERNEL = ("a kernel choice for the Mamba state update (config/mamba.py MambaConfig); "
                 "the state's shape and dtype are unchanged")
_LINEAR_KERNEL = ("selects a linear-attention kernel (model_executor/layers/mamba/gdn/"
                  "qwen_gdn_linear_attn.py _resolve_gdn_prefill_backend, models/kimi_k3/"
                  "nvidia/kda.py); the recurrent state is unchanged")

# passed-through flag -> why it does not change what the plan computes (checked in vLLM
# 0.32.0's code, paths in vllm/): notes for the names that suggest memory, not a class
PASSED = {
    "--dbo-decode-token-threshold": _DBO_ONLY, "--dbo-prefill-token-threshold": _DBO_ONLY,
    "--swa-bounded-replay": ("it acts on DeepSeek-V4.1's sliding-window cache only "
                             "(models/deepseek_v41/attention.py), a model the tuner refuses"),
    "--engram-config": ("DeepSeek-V4.1's Engram only (config/vllm.py "
                        "_resolve_and_verify_engram_config), a model the tuner refuses"),
    "--scheduler-reserve-full-isl": ("an admission check against the KV pool "
                                     "(v1/core/sched/scheduler.py full_sequence_must_fit); the "
                                     "pool and the blocks a request holds are unchanged"),
    "--prefix-cache-retention-interval": ("which sliding-window and Mamba prefix-cache "
                                          "checkpoints are kept (config/cache.py); the pool is "
                                          "unchanged"),
    "--prefix-match-unit": ("the granularity of prefix-cache hashes (v1/core/kv_cache_utils.py); "
                            "the block size is unchanged"),
    "--mamba-backend": ("selects the Mamba SSU kernel; the state's shape follows it only under "
                        "--use-replayssm (model_executor/layers/mamba/mamba_utils.py), which is "
                        "refused"),
    "--replayssm-buffer-len": _ONLY_WITH.format("--use-replayssm") + " (config/cache.py)",
    "--mamba-ssu-algorithm": _MAMBA_KERNEL,
    "--enable-mamba-cache-stochastic-rounding": _MAMBA_KERNEL,
    "--mamba-cache-philox-rounds": _MAMBA_KERNEL,
    "--enable-mamba-shared-prefix-checkpoint": ("it acts only with EAGLE speculative decoding "
                                                "on a Mamba or hybrid model (config/cache.py), "
                                                "which gpufleet.speculative refuses"),
    "--gdn-prefill-backend": _LINEAR_KERNEL, "--kda-prefill-backend": _LINEAR_KERNEL,
    "--kda-decode-backend": _LINEAR_KERNEL,
    "--additional-config": ("in vLLM 0.32.0 read only for the gdn/kda kernel choices "
                            "(qwen_gdn_linear_attn.py, kimi_gdn_linear_attn.py, models/kimi_k3)"),
    "--max-logprobs": ("a limit per request (sampling_params.py); the profile vLLM sizes the "
                       "KV pool from samples without logprobs (v1/worker/gpu/model_runner.py "
                       "_dummy_sampler_run)"),
    "--logprobs-mode": "which logprobs a request gets; the profile samples without logprobs",
    "--use-fp64-gumbel": ("float64 only inside the sampling kernel and for its per-block "
                          "maxima (v1/worker/gpu/sample/gumbel.py)"),
    "--return-sampling-mask": ("a per-step mask of the kept tokens, bounded by top_k "
                               "(v1/worker/gpu/sample/sampler.py SamplingMaskTensors)"),
    "--seed": "seeds the samplers' random generators (v1/worker/gpu_worker.py)",
    "--max-num-queued-reqs": _QUEUE, "--max-num-queued-tokens": _QUEUE,
    "--long-prefill-token-threshold": ("caps a long prompt's chunk per step (config/scheduler.py); "
                                       "max_num_batched_tokens still bounds the batch"),
    "--disable-chunked-mm-input": ("refuses a multimodal item larger than max_num_batched_tokens "
                                   "(v1/core/encoder_cache_manager.py compute_mm_encoder_budget)"),
    "--mm-encoder-fp8-scale-path": _FP8_VIT, "--mm-encoder-fp8-scale-save-path": _FP8_VIT,
    "--mm-encoder-fp8-scale-save-margin": _FP8_VIT,
    "--video-pruning-method": _ONLY_WITH.format("--video-pruning-rate") + " (config/multimodal.py)",
    "--mm-processor-cache-type": "the processor cache in host memory (config/multimodal.py)",
    "--mm-shm-cache-max-object-size-mb": ("the processor cache in host shared memory "
                                          "(config/multimodal.py)"),
    "--watermark-config": ("it needs model runner V2, vLLM 0.32.0's default (config/vllm.py "
                           "use_v2_model_runner); its state per request is small "
                           "(v1/worker/gpu/sample/watermark.py)"),
    "--enable-hc-sp": "Qwen4Exp at tensor parallel > 1 only (config/parallel.py enable_hc_sp)",
    "--sleep-mode-offload-cudagraph": _SLEEP_ONLY, "--sleep-preserve-parameter-names": _SLEEP_ONLY,
    "--enable-nccl-comm-suspend": _SLEEP_ONLY,
    "--dcp-comm-backend": _DCP_ONLY, "--dcp-q-replicate": _DCP_ONLY,
    "--specialize-active-lora": _LORA_ONLY, "--enable-mixed-moe-lora-format": _LORA_ONLY,
    "--enable-moe-shared-loras": _LORA_ONLY, "--max-lora-cls-labels": _LORA_ONLY,
    "--data-parallel-rank": _DP_ONLY, "--data-parallel-start-rank": _DP_ONLY,
    "--data-parallel-address": _DP_ONLY, "--data-parallel-rpc-port": _DP_ONLY,
    "--data-parallel-backend": _DP_ONLY, "--data-parallel-hybrid-lb": _DP_ONLY,
    "--data-parallel-external-lb": _DP_ONLY, "--data-parallel-multi-port-external-lb": _DP_ONLY,
    "--disable-nccl-for-dp-synchronization": _DP_ONLY, "--dp-sync-interval": _DP_ONLY,
    "--expert-placement-strategy": ("which experts a GPU holds under expert parallelism, the "
                                    "same number on each (config/parallel.py)"),
    "--enable-ep-weight-filter": ("skips reading other ranks' experts at load "
                                  "(model_executor/model_loader/default_loader.py); what a GPU "
                                  "holds is unchanged"),
    "--worker-extension-cls": ("adds methods to the worker and may not override one "
                               "(v1/worker/worker_base.py)"),
    "--pooler-config": ("how a pooling model's outputs are pooled, and chunking in the API "
                        "server (config/pooler.py)"),
    "--allow-deprecated-quantization": ("allows a deprecated method that config.json names, "
                                        "which the tuner reads"),
    "--kv-cache-metrics": "tracks block residency in the scheduler (v1/core/block_pool.py)",
    "--cudagraph-metrics": ("per-step CUDA graph statistics (v1/worker/gpu/model_runner.py "
                            "make_cudagraph_stats); captures nothing"),
    "--max-parallel-loading-workers": "host memory while loading (config/parallel.py)",
}

CLASSES = ("tuned", "server", "not modelled", "read", "passed through")

# --hf-overrides keys that change no field the tuner reads: a model whose config names a
# class vLLM knows under another name (gte-multilingual-base: NewModel -> GteNewModel)
HF_OVERRIDES_ALLOWED = ("architectures",)


def hf_overrides_refusal(value):
    """Why `--hf-overrides VALUE` may not be used, or None: a JSON object whose keys are
    all in HF_OVERRIDES_ALLOWED passes; any other key changes a config.json field that the
    plan reads from the file (a context length, a layer count), so vLLM would run with
    another model than the one planned."""
    try:
        data = json.loads(value)
    except (TypeError, ValueError):
        data = None
    if not isinstance(data, dict):
        return ("extra_args holds --hf-overrides without a JSON object after it: give it as "
                "--hf-overrides '{\"architectures\": [\"...\"]}'.")
    other = sorted(str(k)[:64] for k in data if k not in HF_OVERRIDES_ALLOWED)[:8]
    if other:
        return (f"extra_args holds --hf-overrides of {', '.join(other)}: config.json fields "
                "the plan reads from the file, so vLLM would run another model than the one "
                "planned. Edit config.json in the model folder (model_fetch pins it) or "
                f"override only {', '.join(HF_OVERRIDES_ALLOWED)}.")
    return None


def flag_of(arg):
    """The flag an extra_args item names ("--max-model-len=8192" -> "--max-model-len"),
    or None for a value ("8192", "hermes")."""
    text = str(arg)
    if not text.startswith("-") or text in ("-", "--") or _is_number(text):
        return None
    if text == "-O" or (text[:2] == "-O" and text[2:].isdigit()):
        return "--optimization-level"  # -O3: vLLM's parser reads it as the level
    return text.split("=", 1)[0]


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def classify(flag):
    """The class of a `vllm serve` flag (CLASSES)."""
    if flag in TUNED:
        return "tuned"
    if flag in SERVER:
        return "server"
    if flag in NOT_MODELLED:
        return "not modelled"
    if str(flag).startswith("--no-") and "--" + str(flag)[5:] in NOT_MODELLED:
        return "passed through"  # the off form asks for vLLM's default, which is modelled
    if flag in READ:
        return "read"
    return "passed through"


def refusal(flag):
    """Why extra_args may not hold `flag`, and what to do; None when it may."""
    kind = classify(flag)
    if kind == "tuned":
        return (f"extra_args holds {flag}, which gpufleet's tuner sets ({TUNED[flag]}): "
                "vLLM would run with the last one given, not the one the plan predicts. "
                "Remove it from extra_args and set it through that option.")
    if kind == "server":
        return (f"extra_args holds {flag}, which vllm_server sets ({SERVER[flag]}). "
                "Remove it from extra_args.")
    if kind == "not modelled":
        return (f"extra_args holds {flag}: {NOT_MODELLED[flag]}, so the plan's memory "
                "prediction would not be what vLLM runs with. Remove it.")
    return None


def first_refusal(args):
    """Why a model's extra_args (a list of strings) may not be used, for the first
    argument refused (refusal; --hf-overrides by its value), or None."""
    for i, arg in enumerate(args):
        flag = flag_of(arg)
        if flag == "--hf-overrides":
            value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else None)
            why = hf_overrides_refusal(value)
        else:
            why = refusal(flag)
        if why:
            return why
    return None


# ---------------------------------------------------------------------------
# A model entry's extra_args, checked before the tuner plans with them
# ---------------------------------------------------------------------------

# Flags whose value is a secret: on a command line it shows in `ps`, `docker inspect`, the
# module's output and logs. vllm_server gives vLLM its keys in a root-only file named by
# --config (serve.AUTH_MOUNT, docs/security.md).
SECRET_FLAGS = ("--api-key",)


def check_extra_args(extra_args):
    """Refuse a secret given in extra_args (`--api-key KEY`, `--api-key=KEY`); the
    message never holds the value. Returns the arguments as strings."""
    if extra_args is None:
        return []
    if isinstance(extra_args, (str, bytes)) or not isinstance(extra_args, (list, tuple)):
        raise TuneError("extra_args must be a list of strings, e.g. "
                        "[--enable-auto-tool-choice, --tool-call-parser, hermes]")
    out = [str(arg) for arg in extra_args]
    for arg in out:
        flag = arg.split("=", 1)[0]
        if flag in SECRET_FLAGS:
            raise TuneError(f"extra_args holds {flag}: an API key there would be on the "
                            "container's command line and in the module's output. Remove "
                            "it and set vllm_server_api_key (from a vault) instead: "
                            "vllm_server gives it to vLLM in a root-only file.")
    # every `vllm serve` argument is classified (the tables above, issue #34 item 1): one the
    # tuner or vllm_server sets, or whose memory the tuner does not model, is refused
    why = first_refusal(out)
    if why:
        raise TuneError(why)
    return out


def extra_toggle(extra_args, name, default):
    """The last of --NAME / --no-NAME in extra_args (argparse's BooleanOptionalAction:
    the last one wins), else `default`."""
    value = default
    for arg in extra_args:
        if arg == f"--{name}":
            value = True
        elif arg == f"--no-{name}":
            value = False
    return value


def check_remote_config(model, extra_args, reasons):
    """A config class only the checkpoint's own code defines
    (model_families.REMOTE_CONFIG_MODEL_TYPES) loads in vLLM only with
    --trust-remote-code: refuse the plan unless extra_args says
    so, rather than let the container fail at start. gpufleet never adds the flag itself:
    it runs the repository's Python."""
    model = ModelDescription.of(model)
    remote = model.remote_config_class
    if not remote:
        return
    if "--trust-remote-code" not in extra_args:
        raise TuneError(
            f"config.json names a config class that neither transformers nor vLLM has, "
            f"the repository's own ({remote}), which vLLM "
            "loads only with --trust-remote-code, running that repository's Python "
            "(otherwise it stops with 'Failed to load the model config'). If you trust "
            "the repository, pin its revision and add --trust-remote-code to extra_args.")
    reasons.append(f"--trust-remote-code (extra_args): vLLM runs the repository's config "
                   f"class {remote}.")


def check_trust_remote_code(model, extra_args, lock, reasons):
    """--trust-remote-code runs the repository's Python in the container: refused unless
    the model's lock (model_lock, written on the control node from a trusted source) pins
    every *.py file the model has (the folder's, and every module auto_map names) with
    the sha256 the folder holds, and auto_map names no other repository's code."""
    model = ModelDescription.of(model)
    if not extra_toggle(extra_args, "trust-remote-code", False):
        return
    if lock is None:
        raise TuneError(
            "extra_args holds --trust-remote-code, which runs the repository's Python in "
            "the container: give the model's lock (lock: the lock playbooks/model_lock.yml "
            "wrote on the control node), which must pin every *.py file of the model, so "
            "that no mirror or path can change that code.")
    try:
        lock = model_lock.parse_lock(lock)
    except model_lock.LockError as exc:
        raise TuneError(f"lock: {exc}") from None
    files = model.python_files or {}
    unpinned = model_lock.unpinned_python(lock, files)
    if unpinned:
        raise TuneError(
            f"--trust-remote-code refused: the lock of {lock.repo_id} does not pin "
            f"{', '.join(unpinned)} (a Python file the model has or its config.json's "
            "auto_map names), so nothing vouches for the code vLLM would run. Write the lock "
            "from the whole repository (playbooks/model_lock.yml) and fetch with it.")
    for path, digest in sorted(files.items()):
        if digest is not None and digest != lock.files[path]:
            raise TuneError(
                f"--trust-remote-code refused: {path}: the lock pins sha256 "
                f"{lock.files[path]}, the model folder holds sha256 {digest}. Fetch the "
                "model again with its lock (model_fetch).")
    repos = model.remote_code_repos or []
    if repos:
        raise TuneError(
            f"--trust-remote-code refused: config.json's auto_map names code of another "
            f"repository ({', '.join(repos)}), which the lock of {lock.repo_id} cannot pin.")
    pinned = model_lock.python_files(files)
    reasons.append(f"--trust-remote-code: the lock of {lock.repo_id}@{lock.commit[:12]} pins "
                   f"the model's {len(pinned)} Python file(s)"
                   + (f" ({', '.join(pinned)})." if pinned else "."))


def models_with_secret_args(models):
    """Names of the model entries whose extra_args check_extra_args refuses: vllm_server
    asks before any module sees the entries (a module's loop item is printed at -vvv)."""
    names = []
    for entry in models or []:
        try:
            check_extra_args((entry or {}).get("extra_args"))
        except TuneError:
            names.append(str((entry or {}).get("name", "?")))
    return names


def translate_extra_args(extra_args, version, reasons):
    out = []
    for arg in extra_args:
        arg = str(arg)
        for change in vllm_flags.FLAG_CHANGES:
            old, new = change["old"], change["new"]
            if not isinstance(old, list) or len(old) != 1 or len(new) != 1:
                continue
            if vllm_flags.version_at_least(version, change["since"]) and arg == old[0]:
                reasons.append(f"extra_args: {old[0]} became {new[0]} in vLLM "
                               f"{change['since']}; rewritten for {version}.")
                arg = new[0]
            elif not vllm_flags.version_at_least(version, change["since"]) and arg == new[0]:
                reasons.append(f"extra_args: {new[0]} does not exist before vLLM "
                               f"{change['since']}; rewritten to {old[0]}.")
                arg = old[0]
        out.append(arg)
    return out


def serve_args(settings, version, extra_args, reasons):
    """The arguments of `vllm serve MODEL ...` for a plan's settings (gpufleet.tune's
    TunePlan.settings), in order, then extra_args translated for `version`."""
    args = []
    if settings["runner"] == "pooling":
        if vllm_flags.version_at_least(version, vllm_flags.flag_change("runner_convert")["since"]):
            args += ["--runner", "pooling"]
            if settings["convert"]:
                args += ["--convert", settings["convert"]]
        else:
            args += ["--task", "embed"]
    args += ["--tensor-parallel-size", str(settings["tensor_parallel_size"])]
    if settings.get("pipeline_parallel_size", 1) > 1:
        args += ["--pipeline-parallel-size", str(settings["pipeline_parallel_size"])]
    args += ["--max-model-len", str(settings["max_model_len"]),
             "--max-num-seqs", str(settings["max_num_seqs"]),
             "--max-num-batched-tokens", str(settings["max_num_batched_tokens"]),
             "--dtype", settings["dtype"]]
    if settings.get("emit_block_size"):
        args += ["--block-size", str(settings["block_size"])]
    if settings.get("enable_expert_parallel"):
        args.append("--enable-expert-parallel")
    if settings["kv_cache_memory_bytes"] is not None:
        args += ["--kv-cache-memory-bytes", str(settings["kv_cache_memory_bytes"])]
    elif settings["gpu_memory_utilization"] is not None:
        args += ["--gpu-memory-utilization", str(settings["gpu_memory_utilization"])]
    if settings["kv_cache_dtype"] != "auto":
        args += ["--kv-cache-dtype", settings["kv_cache_dtype"]]
    if settings["enable_prefix_caching"]:
        args.append("--enable-prefix-caching")
    if settings["enable_chunked_prefill"]:
        args.append("--enable-chunked-prefill")
    extra = translate_extra_args(extra_args, version, reasons)
    if settings["enforce_eager"] and "--enforce-eager" not in extra:
        # The plan reserved no CUDA-graph memory; vLLM must not capture graphs either.
        args.append("--enforce-eager")
    return args + extra
