#!/usr/bin/python
"""Ansible module vllm_tune: choose vLLM serve settings for a model on this host."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_tune
short_description: Choose vLLM serve settings for a model on this host's GPUs
description:
  - Reads a local model folder (C(config.json) and safetensors headers, never the
    tensors) or a given config, and the host's GPUs, and computes the C(vllm serve)
    arguments, each chosen setting, a prediction of the KV cache and one reason per
    decision.
  - The memory rules follow vLLM's own code (KV page sizes, block counts, tensor
    parallel divisibility); the activation and CUDA-graph overhead is an estimate that
    O(overhead_bytes) replaces. See C(docs/tuning.md).
  - It only computes; it never changes anything, so C(changed) is always false.
  - When nothing fits it fails with what is missing and the nearest settings that fit
    (for example C(needs 2 GPUs) or C(max_model_len up to 45,248 fits)).
version_added: "0.1.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  model_path:
    description:
      - Folder on the managed host holding the model's C(config.json) and
        C(*.safetensors) (or C(model.safetensors.index.json)).
      - One of O(model_path) or O(model_config) is required.
    type: path
  model_config:
    description:
      - The content of the model's C(config.json), when the folder is not on this host.
      - Needs O(weights_bytes).
    type: dict
  weights_bytes:
    description:
      - Total bytes of the weights. Required with O(model_config); with O(model_path)
        it replaces reading the safetensors headers.
    type: int
  allow_unknown_architecture:
    description:
      - Describe a model whose C(model_type) is not in gpufleet's table with the
        generic decoder rule (C(num_key_value_heads), C(head_dim) or
        C(hidden_size / num_attention_heads)). Off by default, so an unknown
        architecture fails and names the fields it needs.
    type: bool
    default: false
  gpus:
    description:
      - The host's GPUs, as the list C(ansible_facts.gpu.devices) from the C(gpu_facts)
        module; pass C("{{ ansible_facts.gpu.devices }}"). A module cannot read facts
        itself, so give this or O(gpu_facts).
      - Each item needs C(memory_total_mib) and C(compute_capability) (C("8.9")), and
        should have C(memory_reserved_mib) (gpu_facts gives it), since the budget starts from
        CUDA's total, the GPU total less the driver's reserve, as vLLM's does.
      - An empty list with O(kv_cache_memory_bytes) plans for vLLM's CPU backend.
    type: list
    elements: dict
  gpu_facts:
    description:
      - The whole C(ansible_facts.gpu) mapping; its C(devices) list is used when
        O(gpus) is not given.
    type: dict
  max_model_len:
    description:
      - Context length to serve, an integer, or C(auto) for the longest that fits (never
        above the model's own context unless O(allow_long_context)).
    type: raw
    default: auto
  target_concurrency:
    description:
      - Requests of O(max_model_len) tokens to hold at once. Sets C(max_num_seqs) and
        makes the plan require that many full-length requests in the KV cache.
    type: int
  gpu_memory_utilization:
    description:
      - Fraction of each GPU's memory vLLM may use. Default is vLLM's own default for
        O(vllm_version) (0.92 since 0.21.0, 0.9 before).
    type: float
  kv_cache_dtype:
    description:
      - KV cache element type. C(fp8) is refused on GPUs below compute capability 8.9
        for vLLM >= 0.8.0 (V1 backends) and emulated for older vLLM.
    type: str
    default: auto
    choices: [auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, fp8_ds_mla]
  allow_fp8:
    description:
      - Let the tuner choose C(kv_cache_dtype=fp8) when the GPU has native FP8
        (compute capability 8.9 or newer).
    type: bool
    default: false
  kv_cache_memory_bytes:
    description:
      - KV cache budget per GPU in bytes, as vLLM's C(--kv-cache-memory-bytes); used
        instead of estimating one, and emitted as that flag.
      - Required for a CPU target (no GPUs).
    type: int
  vllm_version:
    description:
      - vLLM version the arguments are for; flag names differ by version.
    type: str
    default: "0.32.0"
  tensor_parallel_size:
    description:
      - C(auto) picks the smallest valid size that fits; an integer is checked against
        vLLM's divisibility rules and refused when invalid.
    type: raw
    default: auto
  pipeline_parallel_size:
    description:
      - Pipeline stages on this host's GPUs; each instance takes O(tensor_parallel_size) x
        O(pipeline_parallel_size) GPUs, which must fit the host (refused otherwise).
      - Above 1 the plan splits the layers as vLLM does (get_pp_indices), gives the first
        stage the embedding and the last the lm_head, sizes each stage's KV cache from its
        own layers and takes the tightest stage's blocks, and emits
        C(--pipeline-parallel-size). Not planned for DeepSeek-V4, Gemma 4, pooling or
        encoder-only models, nor the CPU target.
    type: int
    default: 1
  dtype:
    description:
      - Model dtype to serve. C(auto) picks bfloat16 on compute capability 8.0 or newer,
        float16 below it and for AWQ/GPTQ weights.
    type: str
    default: auto
    choices: [auto, bfloat16, float16, float32]
  allow_long_context:
    description:
      - Accept an O(max_model_len) above the model's context (the model was extended
        with rope scaling); sets C(VLLM_ALLOW_LONG_MAX_MODEL_LEN=1) in the returned
        settings' C(env).
    type: bool
    default: false
  overhead_bytes:
    description:
      - Per-GPU memory outside weights and KV cache (activations, CUDA graphs, CUDA
        context), replacing the built-in estimate. Use the figure from a real start's
        log when you have one.
    type: int
  enforce_eager:
    description:
      - Plan for C(--enforce-eager) (no CUDA graphs, so their memory is not reserved)
        and emit that flag in RV(args).
    type: bool
    default: false
  block_size:
    description:
      - C(--block-size). Left out, gpufleet keeps vLLM's choice for the model. Only
        DeepSeek-V4 takes it, and only 256 (its sparse MLA and indexer kernels take
        256-token blocks; vLLM refuses 128), which is also what gpufleet picks and
        writes out for it.
    type: int
  expert_parallel:
    description:
      - Emit C(--enable-expert-parallel). Left out, it is on for DeepSeek-V4 on more
        than one GPU and off otherwise. It changes neither the weight bytes nor the
        KV cache per GPU.
    type: bool
  speculative_model_path:
    description:
      - Folder on the managed host holding an EAGLE / EAGLE-3 draft's C(config.json) and
        C(*.safetensors), for a C(--speculative-config) in O(extra_args) with method
        C(eagle) or C(eagle3); the plan adds the draft's layers to the KV cache and its
        weights to the GPUs'. Without it such a method is refused, and a path that is
        not a folder on the host is refused naming it. roles/vllm_server mounts this
        folder read-only in the container (C(/models/<slug>-draft)) and rewrites
        C(--speculative-config)'s C(model) to that path (gpufleet.serve.draft_mount), so
        vLLM loads the draft the plan sized.
    type: path
  extra_args:
    description:
      - More C(vllm serve) arguments, appended; flags renamed between vLLM versions are
        rewritten for O(vllm_version). C(--api-key) is refused (the key would be on the
        command line and in this module's output); vllm_server gives its
        C(vllm_server_api_key) to vLLM in a root-only file named by C(--config).
      - Every C(vllm serve) argument is classified (plugins/module_utils/gpufleet/engine_args.py,
        docs/tuning.md). Refused, with what sets it instead, is one this module sets
        (C(--max-model-len), C(--max-num-batched-tokens), C(--block-size), ...), one
        vllm_server sets (C(--port), C(--served-model-name), ...) and one whose memory
        this module does not model (C(--quantization), LoRA, offloading, ...).
        C(--enforce-eager), C(--[no-]enable-prefix-caching) and
        C(--[no-]enable-chunked-prefill) are read into RV(settings).
      - C(--speculative-config) (C(-sc), C(--spec-method), C(--spec-model),
        C(--spec-tokens)) is read as vLLM 0.32.0 sizes it. Methods C(eagle) and
        C(eagle3) (with O(speculative_model_path)) add the draft's layers and weights,
        C(mtp) on DeepSeek-V4 adds its MTP layer's sliding-window cache, C(ngram) turns
        async scheduling off; other methods and keys are refused by name
        (plugins/module_utils/gpufleet/speculative.py, docs/tuning.md). On vLLM's CPU
        backend (O(gpus) empty) C(ngram) and C(eagle3) are planned, the methods run on the
        lab's CPU build; the others are refused there.
      - A model whose config class only its repository defines (EXAONE 3.x, InternLM2,
        GTE-new) is planned only when this holds C(--trust-remote-code), which runs the
        repository's Python in vLLM; the module never adds it.
      - C(--trust-remote-code) is refused unless O(lock) pins every C(*.py) file of the
        model (those in O(model_path), with the sha256 they have there, and every module
        C(auto_map) in C(config.json) names); the message names the file that is not.
      - Each item at most 1 MiB (1048576 characters).
    type: list
    elements: str
    default: []
  lock:
    description:
      - The model's lock (C(plugins/module_utils/gpufleet/model_lock.py)), a dict with C(repo_id),
        C(commit) and C(files) (each path to its sha256) as M(gpufleet.fleet.hf_model_lock) writes it on
        the control node, or the path of such a file on the host. Needed only with
        C(--trust-remote-code) in O(extra_args).
    type: raw
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
notes:
  - The returned C(args) hold the flags only; put the model (path or name) before them
    as C(vllm serve MODEL ARGS).
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpufleet.fleet.gpu_facts:

- name: Plan Llama-3.1-8B on this host
  gpufleet.fleet.vllm_tune:
    model_path: /srv/models/Llama-3.1-8B-Instruct
    gpus: "{{ ansible_facts.gpu.devices }}"
    max_model_len: 32768
    target_concurrency: 16
    allow_fp8: true
  register: plan

- name: Plan DeepSeek-V4-Pro on 8 B200 GPUs (TP 8, expert parallel, fp8, block 256)
  gpufleet.fleet.vllm_tune:
    model_path: /srv/models/DeepSeek-V4-Pro
    gpus: "{{ ansible_facts.gpu.devices }}"
    kv_cache_dtype: fp8
    block_size: 256

- name: Plan an embedding model for the vLLM CPU backend
  gpufleet.fleet.vllm_tune:
    model_path: /srv/models/all-MiniLM-L6-v2
    gpus: []
    kv_cache_memory_bytes: 1073741824
    max_model_len: 512
"""

RETURN = r"""
args:
  description: Arguments for C(vllm serve MODEL ...), in order.
  returned: success
  type: list
  elements: str
  sample: ["--tensor-parallel-size", "1", "--max-model-len", "32768"]
settings:
  description:
    - Each chosen value, with C(target) (gpu or cpu), C(tensor_parallel_size),
      C(pipeline_parallel_size), C(replicas) (independent instances this host can run), C(max_model_len),
      C(max_num_seqs), C(max_num_batched_tokens), C(kv_cache_dtype), C(dtype),
      C(block_size), C(gpu_memory_utilization), C(kv_cache_memory_bytes), C(runner),
      C(convert), C(enable_prefix_caching), C(enable_chunked_prefill), C(enforce_eager),
      C(enable_expert_parallel),
      C(docker) (for example C(ipc_mode=host) when tensor or pipeline parallel) and C(env).
    - With a C(--speculative-config) in O(extra_args), C(speculative) (C(method),
      C(num_speculative_tokens), C(draft_layers), C(draft_weights_bytes) for an EAGLE
      draft, C(async_scheduling)).
  returned: success
  type: dict
prediction:
  description:
    - C(kv_bytes_per_token) (per GPU, all layers), C(weights_bytes_per_gpu),
      C(overhead_bytes_per_gpu), C(kv_cache_bytes), C(num_blocks),
      C(kv_cache_tokens) (as vLLM 0.32 logs "KV cache size", which is max_concurrency
      times max_model_len, not num_blocks times block_size), C(max_concurrency) at
      C(max_model_len), C(max_model_len_that_fits).
    - For DeepSeek-V4, and for models whose layer kinds have pages of different
      sizes (Gemma 4), also C(kv_cache_groups) (each KV cache group's kind, block
      size, window, layers and bytes per block), C(bytes_per_block),
      C(blocks_per_request) and C(fixed_blocks_per_request) (the part that does not
      grow with context).
    - With speculative decoding, C(kv_bytes_per_token) and C(weights_bytes_per_gpu)
      include the drafter's layers and weights.
    - With O(pipeline_parallel_size) above 1, C(pipeline_stages) (each stage's
      C(layers) [start, end), C(weights_bytes_per_gpu), C(kv_cache_bytes),
      C(bytes_per_block) and C(num_blocks)); C(weights_bytes_per_gpu),
      C(kv_cache_bytes) and C(num_blocks) are then the tightest stage's, whose blocks vLLM
      gives every stage.
  returned: success
  type: dict
reasons:
  description: One sentence per decision.
  returned: always
  type: list
  elements: str
model:
  description: The model description the plan used (attention kind, heads, layers, quantization, weights).
  returned: when the model could be read
  type: dict
nearest:
  description: When nothing fits, the nearest settings that would (C(max_model_len), C(tensor_parallel_size), C(gpus_needed)).
  returned: failure
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import model_lock
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.model import (
    ModelError, describe, describe_dir, model_summary)
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.speculative import SpeculativeError, describe_draft
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.engine_args import check_extra_args
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.tune import (
    DEFAULT_VLLM_VERSION, NoFitError, TuneError, make_plan)

KV_DTYPES = ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla"]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            model_path=dict(type="path"),
            model_config=dict(type="dict"),
            weights_bytes=dict(type="int"),
            allow_unknown_architecture=dict(type="bool", default=False),
            gpus=dict(type="list", elements="dict"),
            gpu_facts=dict(type="dict"),
            max_model_len=dict(type="raw", default="auto"),
            target_concurrency=dict(type="int"),
            gpu_memory_utilization=dict(type="float"),
            kv_cache_dtype=dict(type="str", default="auto", choices=KV_DTYPES),
            allow_fp8=dict(type="bool", default=False),
            kv_cache_memory_bytes=dict(type="int"),
            vllm_version=dict(type="str", default=DEFAULT_VLLM_VERSION),
            tensor_parallel_size=dict(type="raw", default="auto"),
            pipeline_parallel_size=dict(type="int", default=1),
            dtype=dict(type="str", default="auto",
                       choices=["auto", "bfloat16", "float16", "float32"]),
            allow_long_context=dict(type="bool", default=False),
            overhead_bytes=dict(type="int"),
            enforce_eager=dict(type="bool", default=False),
            block_size=dict(type="int"),
            expert_parallel=dict(type="bool"),
            speculative_model_path=dict(type="path"),
            extra_args=dict(type="list", elements="str", default=[]),
            lock=dict(type="raw"),
        ),
        required_one_of=[("model_path", "model_config")],
        mutually_exclusive=[("model_path", "model_config"), ("gpus", "gpu_facts")],
        required_by={"model_config": "weights_bytes"},
        supports_check_mode=True,
    )
    p = module.params
    try:
        check_extra_args(p["extra_args"])
    except TuneError as exc:
        # the invocation printed with the failure (-vvv) must not carry the key either
        p["extra_args"] = ["********" if a.split("=", 1)[0] == "--api-key" or i and
                           p["extra_args"][i - 1] == "--api-key" else a
                           for i, a in enumerate(p["extra_args"])]
        module.fail_json(msg=str(exc), changed=False, reasons=[])
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(p, module.argument_spec, {
            # a vLLM argument may be an inline chat template or JSON: up to a MiB each
            "extra_args": options.items(options.text(2 ** 20)),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc), changed=False, reasons=[])
    lock = p["lock"]
    if isinstance(lock, str):  # a lock file on the host
        try:
            lock = model_lock.load_lock_file(lock)
        except model_lock.LockError as exc:
            module.fail_json(msg=f"lock: {exc}", changed=False, reasons=[])
    gpus = p["gpus"]
    if gpus is None and p["gpu_facts"] is not None:
        gpus = p["gpu_facts"].get("devices") or []
    if gpus is None:
        module.fail_json(msg="gpus is required: pass gpus: \"{{ ansible_facts.gpu.devices "
                             "}}\" after the gpu_facts module (or gpu_facts: \"{{ "
                             "ansible_facts.gpu }}\"); use gpus: [] with "
                             "kv_cache_memory_bytes for a CPU target", changed=False,
                         reasons=[])
    try:
        if p["model_path"]:
            model = describe_dir(p["model_path"], p["allow_unknown_architecture"],
                                 p["weights_bytes"])
        else:
            model = describe(p["model_config"], weights_bytes=p["weights_bytes"],
                             weights_source="weights_bytes option",
                             allow_unknown_architecture=p["allow_unknown_architecture"],
                             source="model_config (config.json)")
    except ModelError as exc:
        module.fail_json(msg=str(exc), changed=False, reasons=[])
    draft = None
    if p["speculative_model_path"]:
        try:
            draft = describe_draft(p["speculative_model_path"])
        except SpeculativeError as exc:
            module.fail_json(msg=str(exc), changed=False, reasons=[])

    try:
        result = make_plan(
            model, gpus, max_model_len=p["max_model_len"],
            target_concurrency=p["target_concurrency"],
            gpu_memory_utilization=p["gpu_memory_utilization"],
            kv_cache_dtype=p["kv_cache_dtype"], allow_fp8=p["allow_fp8"],
            kv_cache_memory_bytes=p["kv_cache_memory_bytes"],
            vllm_version=p["vllm_version"], extra_args=p["extra_args"],
            tensor_parallel_size=p["tensor_parallel_size"], dtype=p["dtype"],
            allow_long_context=p["allow_long_context"],
            overhead_bytes=p["overhead_bytes"], enforce_eager=p["enforce_eager"],
            block_size=p["block_size"], expert_parallel=p["expert_parallel"],
            pipeline_parallel_size=p["pipeline_parallel_size"], draft_model=draft, lock=lock)
    except NoFitError as exc:
        module.fail_json(msg=str(exc), changed=False, model=model_summary(model),
                         **exc.result)
    except TuneError as exc:
        module.fail_json(msg=str(exc), changed=False, model=model_summary(model),
                         reasons=[])
    module.exit_json(changed=False, model=model_summary(model), **result.as_dict())


if __name__ == "__main__":
    main()
