"""What each model family's config means for its KV cache, as vLLM reads it.

The tables keyed by model_type (families checked, config-class defaults and other
names, layer patterns, hybrid layer lists), the structures refused whatever the family,
and FAMILY_RULES, the registry of per-family rules gpufleet.model.describe_config
applies: adding a family is a row in these tables and, where its config class or vLLM
model file does something of its own, one rule. Every row cites the vLLM or
transformers file it was read in; see docs/tuning.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from .model_fields import (ModelError, UnsupportedModelError, first_of, is_int,
                           positive_int)


# Architecture-name endings vLLM's registry runs as generative models
# (vllm/model_executor/models/registry.py `_TEXT_GENERATION_MODELS`).
GENERATIVE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
# The one generative name in vLLM 0.32.0's `_TEXT_GENERATION_MODELS` without such an
# ending (registry.py:82): ChatGLM / GLM-4 checkpoints name `ChatGLMModel`.
GENERATIVE_ARCHITECTURES = {"ChatGLMModel",
                            # _MULTIMODAL_MODELS (registry.py:440): InternVL 2.5 / 3
                            "InternVLChatModel"}
# Endings of natively pooling architectures (registry `_EMBEDDING_MODELS`,
# `_CROSS_ENCODER_MODELS`): BertModel, XLMRobertaModel, ...ForSequenceClassification.
POOLING_SUFFIXES = ("Model", "ForSequenceClassification", "ForTokenClassification",
                    "ForEmbedding", "ForRewardModel")
# Encoder-only families: vLLM gives them EncoderOnlyAttentionSpec, which needs no KV
# cache (kv_cache_interface.py: max_memory_usage_bytes returns 0).
ENCODER_ONLY_MODEL_TYPES = {"bert", "roberta", "xlm-roberta", "nomic_bert", "modernbert",
                            "new", "gte"}
# Decoder families whose vLLM 0.32.0 decoder layer reads config.is_causal and, when it
# is false, builds EncoderOnlyAttention (bidirectional, no KV cache) instead of
# Attention: llama.py:277-283 (LlamaDecoderLayer, which mistral.py:144-156 and
# phi3.py:10 reuse), qwen2.py:254-260, qwen3.py:194-200, gemma3.py:165-168. Embedding
# models built on them say so in config.json (Alibaba-NLP/gte-Qwen2-7B-instruct:
# "is_causal": false).
IS_CAUSAL_MODEL_TYPES = {"llama", "mistral", "phi3", "qwen2", "qwen3", "gemma3_text"}
# model_types whose KV layout gpufleet has checked: decoder families whose vLLM model
# files build a standard Attention layer from num_key_value_heads / head_dim, the MLA
# families (kv_lora_rank), families described by `layer_types`, and encoder-only
# pooling models. Anything else needs allow_unknown_architecture. The families added
# for issue #14 item 5 were each read in vLLM 0.33.0 (commit 4ba787ec9) and tested on
# the model's own config.json (tests/unit/test_model_families.py, docs/tuning.md).
KNOWN_MODEL_TYPES = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "deepseek_v2", "deepseek_v3", "gpt_oss", "gemma2", "gemma3_text",
    "phi3", "exaone4", "olmo3", "minimax_m2", "kimi_k2",
    # DeepSeek-V4 (issue #14 item 6): its own layout, gpufleet.deepseek_v4, checked
    # against vLLM 0.32.0's kv_cache_utils (tests/slow/test_kv_plan_vs_vllm.py).
    "deepseek_v4",
    # Read in vLLM 0.32.0 (the lab image's wheel) and tested on real configs: the
    # language models of Qwen3-VL, Qwen3-VL-MoE (text_config), Qwen2.5-VL (top-level
    # fields), Mistral 3 / Devstral 2 (text_config ministral3), and Phi-1/2 (phi, on
    # the Transformers backend). Kimi-K2.5 needs no entry: its text_config is kimi_k2.
    "qwen3_vl_text", "qwen3_vl_moe_text", "qwen2_5_vl", "ministral3", "phi",
    "glm4_moe",
    # Also read in vLLM 0.32.0: Command-R (commandr.py), StarCoder2 and StarCoder /
    # GPTBigCode (both on the Transformers backend).
    "cohere", "starcoder2", "gpt_bigcode",
    # EXAONE 4.5's text_config: transformers 5.19 loads exaone4_5_text as
    # Exaone4Config, vLLM runs it as Exaone4ForCausalLM (exaone4_5.py).
    "exaone4_5_text",
    # Muse Glimmer's text_config (vLLM 0.32.0 muse_glimmer.py, configs/muse_glimmer.py):
    # sliding layers are the RoPE layers of no_rope_layers, which vLLM derives (NoPE,
    # full, every 4th layer counted back from the last); the test checks that the
    # config's layer_types name the same layers.
    "muse_glimmer_text",
    # ChatGLM2/3 and GLM-4 (ChatGLMModel, vLLM 0.32.0 chatglm.py on vLLM's own
    # ChatGLMConfig, transformers_utils/configs/chatglm.py): num_layers,
    # multi_query_group_num KV heads when multi_query_attention, seq_length.
    "chatglm",
    # Phi-3.5-MoE (PhiMoEForCausalLM, vLLM 0.32.0 phimoe.py on transformers 5.19's
    # PhimoeConfig): num_key_value_heads, head_dim or hidden_size // heads, and no
    # per-layer window, so every layer takes the config's sliding_window
    # (CacheConfig.sliding_window: PhimoeConfig writes no layer_types).
    "phimoe",
    # InternLM2 / InternLM2.5 (InternLM2ForCausalLM, internlm2.py, read in vLLM 0.32.0
    # and at main 073c510c9): num_key_value_heads KV heads of hidden_size // num_attention_heads
    # (no head_dim is read), no sliding window. Its config class is the checkpoint's
    # remote code, but every attribute internlm2.py reads is in config.json itself.
    "internlm2",
    # GPT-NeoX (RedPajama-INCITE, Pythia, Dolly v2) and OLMo-2: vLLM 0.32.0 runs both
    # on the Transformers backend (registry.py:716, 723; transformers/base.py:633
    # head_size = hidden_size // heads, :668 num_kv_heads, :675 a window only from
    # layer_types). GPTNeoXConfig has no KV-head field (one per head, MHA); Olmo2Config
    # sets num_key_value_heads to the head count when absent; neither slides.
    "gpt_neox", "olmo2",
    # Falcon (FalconForCausalLM, vLLM 0.32.0 falcon.py:107-130 and its
    # FalconModelArchConfigConvertor, model_arch_config_convertor.py:535-552): KV heads by
    # the Falcon rule below (describe_config), with FalconConfig's defaults
    # (CONFIG_DEFAULTS); tested on falcon-7b-instruct's own config.json. The older
    # remote-code types (RefinedWeb, RefinedWebModel) have no FalconConfig defaults and
    # stay outside.
    "falcon",
    # Granite 3.x (GraniteForCausalLM, vLLM 0.32.0 granite.py:181-183 head_dim or
    # hidden_size // heads, :271-272 num_key_value_heads, :349 num_hidden_layers, :95-99
    # a window only for layers that layer_types calls sliding); tested on
    # granite-3.0-8b-instruct's config.json. attention/embedding/residual multipliers and
    # logits_scaling change the arithmetic of the model, not its KV cache.
    "granite",
    # Cohere2 (Command R7B, Command A, Aya; Cohere2ForCausalLM, vLLM 0.32.0 commandr.py):
    # layer_types (or, absent, every sliding_window_pattern-th layer full: transformers
    # 5.19 configuration_cohere2.py:96-100), head_dim = hidden_size // heads (the config
    # class overwrites the file's, :93), and the sliding layers' window one token wider
    # than the config's (WINDOW_OFFSET); tested on tiny-aya-global's config.json.
    "cohere2",
    # Five older families, each a native vLLM 0.32.0 model file (registry.py:81, 106,
    # 123-124, 185) building one Attention per layer with no window, tested on the
    # model's own config.json (tests/unit/test_kv_gemma1_gpt2_opt_gptj_bloom.py):
    # Gemma 1 (GemmaForCausalLM, gemma.py:145-154, 216-223: num_key_value_heads KV
    # heads of config.head_dim, GemmaConfig's 256 when absent, not hidden_size // heads);
    # GPT-2 (GPT2LMHeadModel, gpt2.py:72-77, 95-102), OPT (opt.py:85-88, 106-113) and
    # GPT-J (gpt_j.py:68-70, 104-111): one KV head per head (Attention without
    # num_kv_heads, layers/attention/attention.py:327-328) of hidden_size // heads,
    # GPT-J's rotary_dim only rotating part of it; Bloom (bloom.py:94-97, 127-135): the
    # same with ALiBi slopes instead of a rotary embedding, which leaves the cache as is.
    "gemma", "gpt2", "opt", "gptj", "bloom",
    # Read in vLLM 0.32.0 and tested on the model's own config.json
    # (tests/unit/test_kv_gemma3_1b_qwen2_vl_ernie45_moe.py). Gemma 3 1B (Gemma3ForCausalLM) is
    # gemma3_text above. Qwen2-VL (registry.py:258, qwen2_vl.py:1422-1426): the
    # language model is Qwen2ForCausalLM on the text config transformers 5.19 builds
    # from the top-level fields (configuration_qwen2_vl.py:107-119: no window unless
    # use_sliding_window), qwen2.py:150 head hidden_size // heads, :269
    # num_key_value_heads. ERNIE 4.5 MoE (registry.py:98, ernie45_moe.py:237-247,
    # 318-322): num_key_value_heads KV heads of head_dim or hidden_size // heads, one
    # Attention per layer, no window.
    "qwen2_vl", "ernie4_5_moe",
    # Slice g (tests/unit/test_kv_llava_olmoe_stablelm_exaone.py), read in vLLM 0.32.0. Llava 1.5
    # needs no entry: its text_config is llama (see TEXT_CONFIG_DEFAULTS).
    # OLMoE (OlmoeForCausalLM, registry.py:184, olmoe.py:130-147, 180-188, 287-288):
    # num_key_value_heads KV heads of hidden_size // heads (config.head_dim is not read),
    # Attention without a window; the q/k norms and the 64 experts leave the cache as is.
    "olmoe",
    # StableLM (StableLmForCausalLM, registry.py:205, stablelm.py:107-120, 154-161,
    # 232-233): num_key_value_heads KV heads of hidden_size // heads; partial_rotary_factor
    # turns only part of each head, the cache keeps all of it; no window.
    "stablelm",
    # EXAONE 3.0 / 3.5 (ExaoneForCausalLM, registry.py:99, exaone.py:119-136, 166-174,
    # 243-249, 314-315) on the checkpoint's remote ExaoneConfig, whose attribute_map
    # answers num_hidden_layers with the file's num_layers; num_key_value_heads, head_dim
    # (else hidden_size // heads) and the lengths are in config.json itself, as for
    # internlm2. No window.
    "exaone",
    # Gemma 4 (Gemma4ForConditionalGeneration / Gemma4ForCausalLM, text_config
    # gemma4_text): see PER_KIND_HEAD_MODEL_TYPES; tested on gemma-4-26B-A4B's own
    # config.json and checked against vLLM 0.32.0's kv_cache_utils
    # (tests/differential/gemma4_vllm.py).
    "gemma4_text",
    # Slice i (tests/unit/test_kv_smollm3_qwen3_next_internvl3.py), read in vLLM 0.32.0.
    # SmolLM3 (SmolLM3ForCausalLM, registry.py:727: the Transformers backend):
    # transformers/base.py:612-676 builds one Attention per layer, of the engine's
    # head_dim or hidden_size // heads (:633) and num_key_value_heads (:668), with a
    # window only for the layers that layer_types calls sliding (:674-676).
    # SmolLM3Config (transformers 5.19 configuration_smollm3.py:87-113) writes
    # layer_types when the file has none:
    # sliding only for the NoPE layers (no_rope_layers 0), and only when
    # use_sliding_window (default false) and sliding_window are set; NoPE itself
    # changes the rotary embedding, not the cache. Tested on SmolLM3-3B's config.json.
    "smollm3",
    # InternVL 2.5 / 3 (InternVLChatModel) needs no entry: its llm_config is qwen2 (or
    # llama), read as the text config (TEXT_CONFIG_KEYS).
    # Hybrid families described by their layer list (HYBRID_LAYER_LISTS, issue #34
    # item 5): only a checkpoint whose every layer is attention is described; any
    # other is refused naming the entry, before the table is looked at.
    "granitemoehybrid", "lfm2", "lfm2_moe",
} | ENCODER_ONLY_MODEL_TYPES
# Families whose full-attention layers have their own head size and KV head count.
# Gemma 4: vLLM 0.32.0 gemma4.py:577-587 builds each layer's Attention from
# config.per_layer_config[i].head_dim / .num_key_value_heads, which transformers 5.19's
# Gemma4TextConfig.__post_init__ (configuration_gemma4.py:210-221) fills for every
# full_attention layer: head_dim global_head_dim (512 when config.json has none, see
# CONFIG_DEFAULTS), num_key_value_heads num_global_key_value_heads when
# attention_k_eq_v is true and that field is set; the sliding layers keep head_dim and
# num_key_value_heads. With attention_k_eq_v the V slot holds K's projection, but the
# cache still stores both (gemma4.py:421-425), so pages count K and V.
PER_KIND_HEAD_MODEL_TYPES = {"gemma4_text"}
# model_types of the table that neither transformers 5.19 (models/auto/auto_mappings.py
# CONFIG_MAPPING_NAMES) nor vLLM 0.32.0 (transformers_utils/config.py _CONFIG_REGISTRY)
# has a config class for: their config.json names the checkpoint's own class in
# auto_map.AutoConfig, and vLLM loads it only with --trust-remote-code
# (HFConfigParser.parse: "Failed to load the model config ... consider setting
# trust_remote_code"), which runs that repository's Python. EXAONE 3.x, InternLM2 and
# GTE-new (NewModel); ChatGLM's and Kimi-K2's classes are in vLLM's registry.
REMOTE_CONFIG_MODEL_TYPES = {"exaone", "internlm2", "new",
                             # InternVL 2.5 / 3's wrapper (InternVLChatConfig): only
                             # transformers' own "internvl" has a class, and vLLM only
                             # a loading option (config.py:156-157)
                             "internvl_chat"}
# vLLM 0.32.0 commandr.py:237-244: "cohere swa layer sees [pos - sliding_window, pos],
# i.e. sliding_window + 1 tokens", so Cohere2's sliding layers are built with a window
# of sliding_window + 1, which the KV cache spec and its eviction then use.
WINDOW_OFFSET = {"cohere2": 1}
# Defaults of transformers' config classes (transformers 5.20, which vLLM 0.33.0
# requires) that change the KV layout when config.json leaves the field out:
# MistralConfig.sliding_window is 4096, so a Mistral config without the key slides.
CONFIG_DEFAULTS = {"mistral": {"sliding_window": 4096}}
FALCON_MODEL_TYPES = ("falcon", "RefinedWeb", "RefinedWebModel")
# Families whose vLLM 0.32.0 model file builds its Attention without cache_config, so
# the layer's KV cache dtype is "auto" whatever --kv-cache-dtype says
# (layers/attention/attention.py:276-279): Falcon, falcon.py:173-180 and 189-195.
# Found by tests/differential/families_vllm.py: with fp8 vLLM's pages stay 2 bytes
# per element.
KV_CACHE_DTYPE_IGNORED_MODEL_TYPES = ("falcon",)
# Gemma 2 and Gemma 3 configs on the Hub predate `layer_types`: transformers 5.19's
# Gemma2Config / Gemma3TextConfig write it at load time (configuration_gemma2.py
# __post_init__: every 2nd layer full; configuration_gemma3.py: every
# `sliding_window_pattern`-th, default 6), and vLLM 0.32.0's gemma2.py / gemma3.py
# read that list. The same defaults fill what a config leaves out (Gemma 3 4B's
# text_config omits its head counts and head_dim).
_GEMMA_DEFAULTS = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                   "sliding_window": 4096}
CONFIG_DEFAULTS.update({
    # transformers 5.19 FalconConfig (configuration_falcon.py:66-95): a config.json that
    # leaves these out gets them at load time, and vLLM reads the loaded config.
    "falcon": {"multi_query": True, "new_decoder_architecture": False,
               "max_position_embeddings": 2048},
    "gemma2": dict(_GEMMA_DEFAULTS, max_position_embeddings=8192),
    "gemma3_text": dict(_GEMMA_DEFAULTS, max_position_embeddings=131072),
    # transformers 5.19's config classes of the older families (the fields vLLM 0.32.0's
    # model file and engine read for the KV cache), under the names the class stores
    # them by (CONFIG_ATTRIBUTE_MAP): configuration_gemma.py:68-75 (head_dim 256),
    # configuration_gpt2.py:79-82, configuration_opt.py:55-64, configuration_gptj.py:53-56,
    # configuration_bloom.py:59-61 (test-sized: a Bloom file always names its own).
    "gemma": {"hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 16, "head_dim": 256, "max_position_embeddings": 8192},
    "gpt2": {"n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12},
    "opt": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
            "max_position_embeddings": 2048},
    "gptj": {"n_positions": 2048, "n_embd": 4096, "n_layer": 28, "n_head": 16},
    "bloom": {"hidden_size": 64, "n_layer": 2, "n_head": 8},
    # transformers 5.19 Gemma4TextConfig (configuration_gemma4.py:152-183, 210):
    # the fields the KV cache reads, and global_head_dim's 512 (popped with that
    # default in __post_init__).
    "gemma4_text": {"num_hidden_layers": 30, "num_attention_heads": 8,
                    "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
                    "max_position_embeddings": 131072, "sliding_window": 512,
                    "attention_k_eq_v": False},
    # transformers 5.19 Lfm2Config (configuration_lfm2.py:63-64) and Lfm2MoeConfig
    # (configuration_lfm2_moe.py:68, 73): 8 KV heads and 128,000 positions when
    # config.json leaves them out (not one KV head per head).
    "lfm2": {"num_key_value_heads": 8, "max_position_embeddings": 128_000},
    "lfm2_moe": {"num_key_value_heads": 8, "max_position_embeddings": 128_000},
    # transformers 5.19 SmolLM3Config (configuration_smollm3.py:87): no window unless
    # use_sliding_window, whose default is false (the tuner's generic rule reads a
    # missing use_sliding_window as true).
    "smollm3": {"use_sliding_window": False},
})
# The same config classes' defaults for a multimodal wrapper's text_config, which the
# wrapper's config class builds with CONFIG_MAPPING[model_type](**text_config)
# (transformers 5.19 configuration_llava.py:81-83), so every field the file leaves out
# takes the class's default, and vLLM reads that object (config.py get_hf_text_config,
# llava.py:569-572). llava-hf's Llava 1.5 files name only max_position_embeddings and
# vocab_size in a llama text_config: LlamaConfig (configuration_llama.py:64-71) fills
# hidden_size 4096, 32 layers, 32 heads, and (:87-90) head_dim = hidden // heads, one KV
# head per head, the tuner's own rules. A top-level config.json without them is still
# refused (test_model.py test_config_lacking_fields_names_them).
TEXT_CONFIG_DEFAULTS = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32,
              "max_position_embeddings": 2048},
}
# The other names a config class accepts for a field, as transformers 5.19 resolves them
# (model_type: {name in config.json: field it sets}), applied before CONFIG_DEFAULTS so
# that a default never stands beside the same field under its other name. GPT-2 and
# GPT-J: the classes' attribute_map (configuration_gpt2.py:71-76,
# configuration_gptj.py:45-50), so "max_position_embeddings" in a file sets n_positions.
# Bloom: attribute_map (configuration_bloom.py:53-56) and the n_embed keyword that
# BloomConfig.__post_init__ (:75-78) takes as hidden_size (bloomz-560m names n_embed).
# A name given here wins over the field's own, as when the class loads the file
# (configuration_utils.py:155-172 sets the declared fields, then the other names).
_GPT2_NAMES = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions",
               "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}
CONFIG_ATTRIBUTE_MAP = {
    "gpt2": _GPT2_NAMES,
    "gptj": _GPT2_NAMES,
    "bloom": {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
              "n_embed": "hidden_size"},
    # ERNIE 4.5 MoE: Ernie4_5_MoeConfig's attribute_map (configuration_ernie4_5_moe.py:61)
    # answers num_experts / num_experts_per_tok with the file's moe_num_experts / moe_k,
    # the routed experts ernie45_moe.py:136, 186-187 builds.
    "ernie4_5_moe": {"moe_num_experts": "num_experts", "moe_k": "num_experts_per_tok"},
}
# vLLM 0.32.0 config/model.py:2561-2578: a config with none of MAX_LEN_KEYS serves
# 2,048 tokens ("Assuming the model's maximum length is 2048") unless max_model_len is
# given. Applied to Bloom only, whose ALiBi attention has no position table (BloomConfig
# has no length field; bloomz-560m's file carries seq_length, bigscience/bloom's none);
# other families without a length stay refused.
VLLM_DEFAULT_MAX_LEN = 2048
DEFAULT_MAX_LEN_MODEL_TYPES = ("bloom",)
# model_type: (config key of the pattern or None, its default): layer i slides
# unless (i + 1) is a multiple of the pattern.
LAYER_PATTERN_DEFAULTS = {"gemma2": (None, 2), "gemma3_text": ("sliding_window_pattern", 6),
                          "cohere2": ("sliding_window_pattern", 4),
                          # configuration_gemma4.py:190-195: 5:1, not read from the file
                          "gemma4_text": (None, 6)}
# model_types whose config class writes a mixed layer_types from other fields when
# config.json has none, by a rule the tuner does not derive: such a file that slides
# is refused until it names its layer_types. SmolLM3: the NoPE layers of
# no_rope_layers slide, the RoPE layers stay full (configuration_smollm3.py:101-113).
LAYER_TYPES_NEEDED_MODEL_TYPES = ("smollm3",)
# Layer types (config.json `layer_types`, transformers >= 4.53) the tuner understands.
FULL_LAYER = "full_attention"
SLIDING_LAYER = "sliding_attention"
# transformers 5.19 configuration_utils.py:92-95 _LEGACY_LAYER_TYPE_REMAP, applied to
# every config's layer_types at load (:398 remap_legacy_layer_types): "attention" is
# read as full_attention ("mamba" becomes linear_attention, which stays refused).
LEGACY_FULL_LAYER = "attention"
# Hybrid families whose vLLM 0.32.0 model file builds each layer from one per-layer
# field of the config, so that field decides the KV layout, not the family's name.
# vLLM 0.32.0 config/model.py:2023-2031 ModelConfig.is_hybrid: an IsHybrid model is
# not treated as hybrid when the (top-level) config's layer_types are all "attention"
# or "full_attention" ("Handle granite-4.0-micro case which uses hybrid config but
# does not actually contain any non-attention layers"); then no Mamba page alignment
# runs (platforms/interface.py:786-787 _align_hybrid_block_size only if is_hybrid)
# and every layer is a plain Attention, so the checkpoint is described as the
# attention layout its fields give. Any other entry is refused naming it.
# model_type: HybridLayerList.


@dataclass(frozen=True)
class HybridLayerList:
    """How a hybrid family's vLLM model file picks each layer's class (HYBRID_LAYER_LISTS).

    fields: the config.json names of the per-layer list, the one the config class reads
        first (an attribute_map name wins over the field's own, see CONFIG_ATTRIBUTE_MAP).
    file: vLLM's model file and the lines that pick each layer's class.
    other: what vLLM builds for an entry other than full attention ({entry or None: what}).
    lifts: UNMODELLED_STRUCTURES fields that only size those other layers, so they show
        nothing when no layer is one.
    indices: a field of attention-layer indices the config class writes the list from
        when the file has none, or None.
    default: what the config class writes when the file has neither (None: no list,
        which vLLM's model file cannot index).
    """
    fields: tuple
    file: str
    other: dict
    lifts: tuple
    indices: str | None
    default: str | None


HYBRID_LAYER_LISTS = {
    # Granite 4.0 (GraniteMoeHybridForCausalLM, registry.py:127): granitemoehybrid.py:
    # 322-325 ALL_DECODER_LAYER_TYPES has full_attention and linear_attention (Mamba2)
    # only, :351 picks config.layer_types[layer_idx]; transformers 5.19
    # GraniteMoeHybridConfig (configuration_granitemoehybrid.py:54) answers
    # layers_block_type with layer_types, and (:106-107) writes every layer
    # linear_attention when the file has no list. granite-4.0-micro / -350m / -1b
    # name every layer "attention".
    "granitemoehybrid": HybridLayerList(
        fields=("layers_block_type", "layer_types"),
        file="granitemoehybrid.py:322-325, 351",
        other={"mamba": "a Mamba2 layer (GraniteMoeHybridMambaDecoderLayer), which "
               "keeps a recurrent state per request, not a KV cache",
               "linear_attention": "a Mamba2 layer (GraniteMoeHybridMambaDecoderLayer), "
               "which keeps a recurrent state per request, not a KV cache"},
        lifts=("mamba_d_state",),
        indices=None,
        default="linear_attention",
    ),
    # LFM2 (Lfm2ForCausalLM, registry.py:146): lfm2.py:331-333 builds
    # Lfm2AttentionDecoderLayer where layer_types[i] == "full_attention", else
    # Lfm2ShortConvDecoderLayer (a conv state per request). transformers 5.19
    # Lfm2Config (configuration_lfm2.py:82-88) writes layer_types from full_attn_idxs
    # when the file has none, and every layer full_attention when it has neither.
    "lfm2": HybridLayerList(
        fields=("layer_types",),
        file="lfm2.py:331-333",
        other={None: "a short-convolution layer (Lfm2ShortConvDecoderLayer), which "
               "keeps a conv state per request, not a KV cache"},
        lifts=(),
        indices="full_attn_idxs",
        default=FULL_LAYER,
    ),
    # LFM2-MoE (Lfm2MoeForCausalLM, registry.py:147): lfm2_moe.py:433-437, the same
    # rule; Lfm2MoeConfig (configuration_lfm2_moe.py:83-87) writes no list.
    "lfm2_moe": HybridLayerList(
        fields=("layer_types",),
        file="lfm2_moe.py:433-437",
        other={None: "a short-convolution layer (Lfm2MoeShortConvDecoderLayer), "
               "which keeps a conv state per request, not a KV cache"},
        lifts=(),
        indices=None,
        default=None,
    ),
}
# Structures whose KV cache (or recurrent state) vLLM builds in a way the tuner does
# not model, each recognised by the config field that shows it, whatever the
# model_type: (field, does this value show the structure, what vLLM does with it).
# Read in vLLM 0.33.0 (commit 4ba787ec9). `layer_types` entries other than
# full/sliding attention are checked beside these. A DeepSeek-V4 config's own fields
# (index_topk, compress_ratios) are checked by gpufleet.deepseek_v4 instead.
UNMODELLED_STRUCTURES = (
    # Read in vLLM 0.32.0. MiMo-V2-Flash also sets attention_chunk_size, so this
    # comes first, to name what vLLM actually builds.
    ("hybrid_layer_pattern", lambda v, text: v is not None,
     "sliding-window layers with their own KV heads and head sizes (MiMo-V2): layers "
     "marked 1 are built with swa_num_key_value_heads, swa_head_dim and "
     "swa_v_head_dim and a window, the others with num_key_value_heads, head_dim and "
     "v_head_dim, K and V of different sizes, so pages of two sizes "
     "(MiMoV2DecoderLayer in vllm/model_executor/models/mimo_v2.py)"),
    ("linear_attn_config", lambda v, text: isinstance(v, dict) and bool(v.get("kda_layers")),
     "hybrid linear attention (Kimi Linear, Kimi-K3): the kda_layers keep a recurrent "
     "state per request, not a KV cache, only the full_attn_layers an MLA cache "
     "(is_kda_layer in vllm/transformers_utils/configs/kimi_linear.py, "
     "vllm/models/kimi_k3/)"),
    ("attention_chunk_size", lambda v, text: v is not None,
     "chunked local attention (Llama 4): the RoPE layers are ChunkedLocalAttention "
     "layers whose cache keeps only the current chunk, the NoPE layers (no_rope_layers) "
     "full attention (vllm/model_executor/models/llama4.py)"),
    ("num_kv_shared_layers", lambda v, text: is_int(v) and v > 0,
     "cross-layer KV sharing (Gemma 3n, Gemma 4 E2B/E4B): the last "
     "num_kv_shared_layers layers read an "
     "earlier layer's KV cache (kv_sharing_target_layer_name in "
     "vllm/model_executor/models/gemma3n.py, gemma4.py:471-491), so there are fewer "
     "caches than layers"),
    # Modelled for PER_KIND_HEAD_MODEL_TYPES (Gemma 4's gemma4_text); refused for any
    # other model_type that carries them (Gemma 4 unified, diffusion Gemma), whose
    # files gpufleet has not read.
    ("global_head_dim", lambda v, text: v is not None and v != text.get("head_dim")
     and text.get("model_type") not in PER_KIND_HEAD_MODEL_TYPES,
     "full-attention layers with their own head size (a Gemma 4 variant): pages of two "
     "sizes, one per layer kind (Gemma4Config in vllm/model_executor/models/config.py)"),
    ("num_global_key_value_heads",
     lambda v, text: v is not None and v != text.get("num_key_value_heads")
     and text.get("model_type") not in PER_KIND_HEAD_MODEL_TYPES,
     "full-attention layers with their own KV head count (a Gemma 4 variant): pages of "
     "two sizes, one per layer kind (Gemma4Config in vllm/model_executor/models/"
     "config.py)"),
    # transformers' per-layer overrides (configuration_utils.py HeterogeneousConfigMixin:
    # "a sparse mapping from layer indices to configuration attribute overrides"), which
    # vLLM reads per layer (ModelArchitectureConfig.__getitem__, config/model_arch.py)
    # where the model file asks for them. Read for PER_KIND_HEAD_MODEL_TYPES
    # (heads_per_kind); transformers 5.24 saves Gemma 4's full layers this way.
    ("per_layer_config", lambda v, text: bool(v)
     and text.get("model_type") not in PER_KIND_HEAD_MODEL_TYPES,
     "per-layer overrides of the config (transformers' per_layer_config): layers with "
     "their own head size, KV heads or window, which vLLM reads per layer "
     "(config/model_arch.py ModelArchitectureConfig)"),
    ("use_bidirectional_attention", lambda v, text: v == "all",
     "bidirectional attention on every layer (an embedding Gemma 4): not causal, and "
     "transformers 5.19 halves the sliding window at load time "
     "(configuration_gemma4.py:186-188)"),
    ("full_attention_interval", lambda v, text: v is not None,
     "hybrid linear attention (Qwen3-Next, Qwen3.5): Gated DeltaNet layers keep a "
     "recurrent state per request, not a KV cache (vllm/model_executor/models/"
     "qwen3_next.py, qwen3_5.py)"),
    ("hybrid_override_pattern", lambda v, text: v is not None,
     "a Mamba2 hybrid (Nemotron-H): 'M' layers keep a Mamba state per request, only "
     "'*' layers a KV cache (vllm/model_executor/models/nemotron_h.py)"),
    ("ssm_state_size", lambda v, text: v is not None,
     "Mamba/SSM layers: a recurrent state per request, not a KV cache "
     "(vllm/model_executor/models/mamba2.py, nemotron_h.py, jamba.py)"),
    ("mamba_d_state", lambda v, text: v is not None,
     "Mamba/SSM layers: a recurrent state per request, not a KV cache "
     "(vllm/model_executor/models/falcon_h1.py, zamba2.py, granitemoehybrid.py)"),
    ("attn_layer_period", lambda v, text: v is not None,
     "a Mamba hybrid (Jamba): attention every attn_layer_period layers, Mamba state in "
     "the others (vllm/model_executor/models/jamba.py)"),
    ("block_configs", lambda v, text: v is not None,
     "per-layer blocks (DeciLM / Llama-Nemotron NAS): layers without attention (no_op) "
     "and a KV head count per layer (n_heads_in_group) (vllm/model_executor/models/"
     "nemotron_nas.py)"),
    # Read in vLLM 0.32.0: vllm/models/minimax_m3/nvidia/model.py:99-107
    # _sparse_attention_layer_ids (layers whose sparse_attention_freq entry is not 0)
    # and common/indexer.py:102-150 MiniMaxM3IndexerCache (a key-only side cache per
    # such layer, an MLAAttentionSpec of one head beside the layer's KV cache). That
    # function reads only sparse_attention_freq, not use_sparse_attention.
    ("sparse_attention_config",
     lambda v, text: isinstance(v, dict) and any(v.get("sparse_attention_freq") or []),
     "sparse attention with an indexer (MiniMax-M3): the layers marked in "
     "sparse_attention_freq keep an index-key cache (MiniMaxM3IndexerCache) beside "
     "their KV cache, so pages of two kinds (vllm/models/minimax_m3/)"),
    ("index_topk", lambda v, text: v is not None,
     "sparse attention with an indexer (DeepSeek-V3.2, GLM-5): every layer keeps an "
     "indexer key cache (DeepseekV32IndexerCache) beside the MLA latent "
     "(vllm/model_executor/models/deepseek_v2.py)"),
)


def _structure_facts(field, value, text):
    """What this config itself says about the refused structure, for the message."""
    if field == "block_configs" and isinstance(value, list):
        no_attn = sum(1 for b in value if isinstance(b, dict) and isinstance(
            b.get("attention"), dict) and b["attention"].get("no_op"))
        return f"{len(value)} blocks, {no_attn} without attention"
    if field == "hybrid_layer_pattern" and isinstance(value, list):
        return (f"{len(value)} layers: {value.count(1)} sliding-window, "
                f"{value.count(0)} full")
    if field == "linear_attn_config" and isinstance(value, dict):
        kda, full = value.get("kda_layers") or [], value.get("full_attn_layers") or []
        return f"{len(kda)} KDA layers, {len(full)} full attention"
    if field == "sparse_attention_config" and isinstance(value, dict):
        freq = value.get("sparse_attention_freq") or []
        return (f"{len(freq)} layers, {sum(1 for f in freq if f)} with the sparse index "
                "branch")
    if field == "hybrid_override_pattern" and isinstance(value, str):
        return (f"{len(value)} layers: {value.count('M')} Mamba, {value.count('*')} "
                "attention")
    if isinstance(value, (list, dict)) or (isinstance(value, str) and len(value) > 40):
        return f"{type(value).__name__} of {len(value)}"
    return repr(value)


def hybrid_layer_list(text, model_type, wrapped, source):
    """For HYBRID_LAYER_LISTS families: the config with its layer list read as vLLM
    reads it, when every layer is full attention (the fields that only size the other
    layers dropped, layer_types written out); else UnsupportedModelError naming the
    first entry that is not. Other families' configs are returned as they are."""
    spec = HYBRID_LAYER_LISTS.get(model_type)
    if spec is None:
        return text
    num_layers = positive_int(first_of(text, "num_hidden_layers"), "num_hidden_layers",
                              source)
    field = next((f for f in spec.fields if text.get(f) is not None), None)
    indices = spec.indices
    how = ""
    if field is not None:
        layers = text[field]
        if not isinstance(layers, list) or len(layers) != num_layers:
            raise ModelError(f"{source}: {field} is {layers!r}; it must be a list with "
                             f"one entry per layer ({num_layers})")
    elif indices is not None and text.get(indices) is not None:
        picked = text[indices]
        if not isinstance(picked, list) or not all(is_int(i) for i in picked):
            raise ModelError(f"{source}: {indices} is {picked!r}; it must be a list of "
                             "layer indices")
        field = "layer_types"
        layers = [FULL_LAYER if i in picked else "conv" for i in range(num_layers)]
        how = f", written by the config class from {indices} {picked}"
    elif spec.default is not None:
        field = "layer_types"
        layers = [spec.default] * num_layers
        how = (f", written by the config class, config.json having no "
               f"{' or '.join(spec.fields + ((indices,) if indices else ()))}")
    else:
        raise UnsupportedModelError(
            f"{source}: {model_type} has no layer_types; vLLM's {spec.file} builds "
            "each layer from that list, which this config class does not write. Name "
            "the layers in config.json, or run vLLM once with --kv-cache-memory-bytes "
            "and read its 'KV cache size' line instead.")
    others = [(i, k) for i, k in enumerate(layers) if k not in (FULL_LAYER, LEGACY_FULL_LAYER)]
    if others:
        i, entry = others[0]
        what = spec.other.get(entry, spec.other.get(None)) or (
            f"no layer class vLLM's {spec.file.split(':')[0]} has (it builds "
            "full_attention and linear_attention layers only)")
        kinds = [str(k) for _name, k in others]
        counts = ", ".join(f"{kinds.count(k)} x {k}" for k in sorted(set(kinds)))
        raise UnsupportedModelError(
            f"{source}: {field} has {counts} of {num_layers} layers{how}; "
            f"{field}[{i}] is {entry!r}: {what} (vLLM 0.32.0 {spec.file}). "
            "gpufleet's tuner models this family only when every layer is full "
            "attention; run vLLM once with --kv-cache-memory-bytes and read its 'KV "
            "cache size' line instead.")
    if wrapped:
        raise UnsupportedModelError(
            f"{source}: every entry of the text config's {field} is attention, but vLLM "
            "0.32.0 decides whether a model is hybrid from the top-level config's "
            "layer_types (config/model.py:2023-2031 ModelConfig.is_hybrid), which a "
            "multimodal wrapper does not have: vLLM still aligns the attention block "
            "size to a Mamba/conv state page (platforms/interface.py:786-787 "
            "_align_hybrid_block_size), "
            "which gpufleet's tuner does not model. Run vLLM once with "
            "--kv-cache-memory-bytes and read its 'KV cache size' line instead.")
    dropped = set(spec.fields) | set(spec.lifts) | {indices}
    out = {k: v for k, v in text.items() if k not in dropped}
    out["layer_types"] = [FULL_LAYER] * num_layers
    return out


def refuse_unmodelled(text):
    """UnsupportedModelError naming the field, if the config shows a structure the
    tuner does not model; called before the model_type is looked at."""
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list):
        modelled = {FULL_LAYER, SLIDING_LAYER, LEGACY_FULL_LAYER}
        other = sorted({str(k) for k in layer_types} - modelled)
        if other:
            counts = ", ".join(f"{layer_types.count(k)} x {k}" for k in other)
            first = next(i for i, k in enumerate(layer_types) if str(k) not in modelled)
            raise UnsupportedModelError(
                f"layer_types has {counts} (e.g. Mamba or linear attention layers, "
                "which keep a recurrent state per request, not a KV cache; the first, "
                f"layer_types[{first}], is {layer_types[first]!r}); gpufleet's "
                "tuner models only full_attention and sliding_attention layers. Run "
                "vLLM once with --kv-cache-memory-bytes and read its 'KV cache size' "
                "line instead.")
    for field, shows, what in UNMODELLED_STRUCTURES:
        value = text.get(field)
        if shows(value, text):
            raise UnsupportedModelError(
                f"{field} is set ({_structure_facts(field, value, text)}): {what}. "
                "gpufleet's tuner does not model this, so it does not predict the KV "
                "cache; run vLLM once with --kv-cache-memory-bytes and read its 'KV "
                "cache size' line instead.")


def config_class_names(text, model_type):
    """The config's fields under the names its config class stores them by
    (CONFIG_ATTRIBUTE_MAP); another name wins over the field's own, as in transformers."""
    names = CONFIG_ATTRIBUTE_MAP.get(model_type)
    if not names:
        return text
    out = {k: v for k, v in text.items() if k not in names}
    for other, field in names.items():
        if text.get(other) is not None:
            out[field] = text[other]
    return out


def layer_kinds_of(cfg, num_layers, model_type):
    """Per-layer attention kinds: list of "full" / "sliding", or raise."""
    layer_types = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if not layer_types and model_type in LAYER_PATTERN_DEFAULTS:
        key, default = LAYER_PATTERN_DEFAULTS[model_type]
        pattern = default if key is None or cfg.get(key) is None else positive_int(
            cfg[key], key, "config.json")
        layer_types = [SLIDING_LAYER if (i + 1) % pattern else FULL_LAYER
                       for i in range(num_layers)]
    if layer_types:
        if not isinstance(layer_types, list):
            raise ModelError(f"layer_types is {layer_types!r}; it must be a list with one "
                             "entry per layer")
        if len(layer_types) != num_layers:
            raise ModelError(f"layer_types has {len(layer_types)} entries for "
                             f"{num_layers} layers")
        kinds = []
        for kind in layer_types:
            if kind in (FULL_LAYER, LEGACY_FULL_LAYER):
                kinds.append("full")
            else:  # refuse_unmodelled let only full and sliding layers through
                if not window:
                    raise ModelError("layer_types has sliding_attention but "
                                     "sliding_window is not set")
                kinds.append("sliding")
        return kinds
    # Qwen2-style configs carry sliding_window but switch it off (use_sliding_window
    # false); vLLM then treats every layer as full attention.
    if window and cfg.get("use_sliding_window", True) and model_type not in (
            "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if cfg.get("sliding_window_pattern") or \
                model_type in LAYER_TYPES_NEEDED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"{model_type} interleaves sliding and full layers but this config.json "
                "has no layer_types list; gpufleet needs layer_types to know which "
                "layers slide (newer transformers write it)")
        return ["sliding"] * num_layers
    return ["full"] * num_layers


def pooling_kind(architectures, model_type, has_st_files):
    """Return (kind, native_pooling) where kind is "generative" or "pooling"."""
    arch = architectures[0] if architectures else ""
    if arch.endswith(GENERATIVE_SUFFIXES) or arch in GENERATIVE_ARCHITECTURES:
        return ("pooling", False) if has_st_files else ("generative", False)
    if arch.endswith(POOLING_SUFFIXES) or model_type in ENCODER_ONLY_MODEL_TYPES:
        return "pooling", True
    return ("pooling", False) if has_st_files else ("generative", False)


# Per-family rules: what a family's config class or vLLM model file does to the fields
# describe_config reads, beyond the tables above (CONFIG_DEFAULTS, CONFIG_ATTRIBUTE_MAP,
# ...). Each rule takes the config (already a fresh dict, defaults and other names
# applied) and the source for messages, and changes the dict in place or raises.
# FAMILY_RULES maps a model_type to its rule: adding a family's special case is one
# function and one entry.
def _gpt2_rule(text, source):
    # vLLM 0.32.0 gpt2.py:200-202 asserts these three off (GPT2Config's defaults).
    on = [k for k in ("add_cross_attention", "scale_attn_by_inverse_layer_idx",
                      "reorder_and_upcast_attn") if text.get(k)]
    if on:
        raise UnsupportedModelError(
            f"{source}: {', '.join(on)} is set; vLLM's GPT-2 (gpt2.py) refuses such a "
            "checkpoint (it asserts each of add_cross_attention, "
            "scale_attn_by_inverse_layer_idx and reorder_and_upcast_attn is false)")


def _gpt_bigcode_rule(text, source):
    # transformers 5.19 GPTBigCodeConfig (configuration_gpt_bigcode.py:83) writes
    # num_key_value_heads = 1 if multi_query (default true) else n_head, and vLLM
    # reads that attribute: multi-query attention, one KV head.
    if first_of(text, "n_head_kv", "num_kv_heads", "num_key_value_heads") is None:
        text["num_key_value_heads"] = 1 if text.get("multi_query", True) else first_of(
            text, "num_attention_heads", "n_head")


def _falcon_rule(text, source):
    # vLLM 0.32.0 FalconModelArchConfigConvertor (model_arch_config_convertor.py:
    # 536-549, for falcon, RefinedWeb and RefinedWebModel): multi-query attention,
    # one KV head, whatever n_head_kv / num_kv_heads say (FalconConfig sets
    # num_kv_heads to the head count when it is absent).
    if text.get("multi_query") and not text.get("new_decoder_architecture"):
        for field in ("n_head_kv", "num_kv_heads"):
            text.pop(field, None)
        text["num_key_value_heads"] = 1


def _cohere2_rule(text, source):
    # transformers 5.19 Cohere2Config (configuration_cohere2.py:93) sets head_dim to
    # hidden_size // num_attention_heads whatever config.json says, and vLLM 0.32.0
    # commandr.py:186-189 reads that attribute.
    text.pop("head_dim", None)


def _hybrid_layer_list_rule(text, source):
    # vLLM 0.32.0 granitemoehybrid.py:241, lfm2.py:124, lfm2_moe.py:205: the head
    # size is hidden_size // num_attention_heads, whatever head_dim says.
    text.pop("head_dim", None)
    if text.get("num_local_experts") == 0:
        # granitemoehybrid.py:168: experts only when num_local_experts > 0 (the
        # dense Granite 4.0 checkpoints write 0 experts, 0 per token).
        text.pop("num_local_experts")
        text.pop("num_experts_per_tok", None)


def _chatglm_rule(text, source):
    # vLLM 0.32.0 chatglm.py:61-65: multi_query_group_num KV heads only with
    # multi_query_attention (ChatGLMConfig's default is false), else one per head.
    if not text.get("multi_query_attention"):
        text.pop("multi_query_group_num", None)


FAMILY_RULES = {
    "gpt2": _gpt2_rule,
    "gpt_bigcode": _gpt_bigcode_rule,
    **dict.fromkeys(FALCON_MODEL_TYPES, _falcon_rule),
    "cohere2": _cohere2_rule,
    **dict.fromkeys(HYBRID_LAYER_LISTS, _hybrid_layer_list_rule),
    "chatglm": _chatglm_rule,
}


def heads_per_kind(text, model_type, layer_kinds, kv_heads, head_size, num_heads, source):
    """Each layer kind's KV heads and head size, for PER_KIND_HEAD_MODEL_TYPES, when
    they differ between the kinds; None otherwise."""
    if model_type not in PER_KIND_HEAD_MODEL_TYPES:
        return None
    if text.get("per_layer_config"):
        layers = _per_layer_heads(text["per_layer_config"], layer_kinds, kv_heads,
                                  head_size, num_heads, source)
    else:
        full_head = positive_int(text.get("global_head_dim"), "global_head_dim", source)
        full_kv = kv_heads
        if text.get("attention_k_eq_v") and \
                text.get("num_global_key_value_heads") is not None:
            full_kv = positive_int(text["num_global_key_value_heads"],
                                   "num_global_key_value_heads", source,
                                   extra=f" dividing num_attention_heads ({num_heads})")
            _check_kv_divides(full_kv, "num_global_key_value_heads", num_heads, source)
        layers = [(full_kv, full_head) if kind == "full" else (kv_heads, head_size)
                  for kind in layer_kinds]
    heads = {}
    for kind, pair in zip(layer_kinds, layers):
        if heads.setdefault(kind, pair) != pair:
            raise UnsupportedModelError(
                f"{source}: per_layer_config gives {kind} layers different KV heads or "
                f"head sizes ({heads[kind]} and {pair}, as KV heads x head size); "
                "gpufleet's tuner models one of each per layer kind. Run vLLM once with "
                "--kv-cache-memory-bytes and read its 'KV cache size' line instead.")
    if len(set(heads.values())) <= 1:
        return None
    return {kind: {"num_kv_heads": kv, "head_size": size}
            for kind, (kv, size) in heads.items()}


# The per-layer overrides _per_layer_heads reads; any other one is refused, since
# vLLM may read it per layer too (a window, a rope) and the tuner would not.
PER_LAYER_HEAD_FIELDS = ("head_dim", "num_key_value_heads")


def _per_layer_heads(per_layer, layer_kinds, kv_heads, head_size, num_heads, source):
    """(KV heads, head size) of every layer from transformers' per_layer_config, a
    sparse mapping from layer index (a string in JSON) to the fields that differ from
    the config's own: what Gemma4TextConfig writes when it saves (transformers 5.24),
    and what it and vLLM read back in place of global_head_dim /
    num_global_key_value_heads (configuration_gemma4.py:212: derived only when the file
    has no per_layer_config)."""
    if not isinstance(per_layer, dict):
        raise ModelError(f"{source}: per_layer_config is {per_layer!r}; it must map layer "
                         "indices to the fields that differ, such as "
                         "{\"5\": {\"head_dim\": 512}}")
    layers = [(kv_heads, head_size)] * len(layer_kinds)
    for key, fields in per_layer.items():
        where = f"per_layer_config[{key!r}]"
        if not str(key).isdigit() or int(key) >= len(layer_kinds) or \
                not isinstance(fields, dict):
            raise ModelError(f"{source}: {where} must be a layer index below "
                             f"{len(layer_kinds)} mapped to the fields that differ")
        other = sorted(set(fields) - set(PER_LAYER_HEAD_FIELDS))
        if other:
            raise UnsupportedModelError(
                f"{source}: {where} overrides {', '.join(other)}; gpufleet's tuner reads "
                f"only {' and '.join(PER_LAYER_HEAD_FIELDS)} per layer. Run vLLM once "
                "with --kv-cache-memory-bytes and read its 'KV cache size' line instead.")
        kv = positive_int(fields.get("num_key_value_heads", kv_heads),
                          f"{where}.num_key_value_heads", source)
        _check_kv_divides(kv, f"{where}.num_key_value_heads", num_heads, source)
        layers[int(key)] = (kv, positive_int(fields.get("head_dim", head_size),
                                             f"{where}.head_dim", source))
    return layers


def _check_kv_divides(kv, field, num_heads, source):
    if num_heads % kv:
        raise ModelError(f"{source}: {field} {kv} does not divide num_attention_heads "
                         f"{num_heads}; grouped-query attention needs it to (check the "
                         "config)")
