"""KV layout of more model families (issue #14 item 5, slice i), each on its own config.json.

Every config here is a published config.json of that model (tests/fixtures/models/
SOURCES.md, the section for this file). Each expected number was derived by hand from
the vLLM file named in the test's comment, read in vLLM 0.32.0 (the wheel the lab image
installs), with that image's transformers 5.19.0, whose config classes fill what
config.json leaves out. Line numbers are from those files.

The tuner's bytes per token per layer are checked against 2 x kv_heads x head_size x
element bytes (check_kv_bytes), vllm/v1/kv_cache_interface.py.
"""
import pytest

from test_model_families import check_kv_bytes, kinds, load
from test_kv_falcon_neox_olmo2_deepseek_v2_granite_cohere2 import check_full_decoder
from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory
from helpers import pinning_lock

FULL, SLIDING = model_families.FULL_LAYER, model_families.SLIDING_LAYER
GiB = 1 << 30


def test_smollm3_3b_is_gqa_full_attention_nope_layers_keep_their_cache():
    # HuggingFaceTB/SmolLM3-3B (SmolLM3ForCausalLM, model_type smollm3). registry.py:727
    # runs it on the Transformers backend (TransformersForCausalLM). transformers/
    # base.py:612-676 _create_attention_instances: one Attention per layer of
    # num_hidden_layers 36 (:612), head_size = the engine's head size (:633): no head_dim
    # in the file, so hidden_size // num_attention_heads = 2048 // 16 = 128
    # (model_arch_config_convertor.py:89-116); num_kv_heads = num_key_value_heads 4
    # (:668; convertor :150-166); a per-layer window only where layer_types says
    # sliding_attention (:674-676): the file's layer_types are 36 x full_attention
    # (use_sliding_window false, sliding_window null). engine/arg_utils.py:2248-2254
    # leaves CacheConfig.sliding_window unset since layer_types is not all sliding. The
    # 9 NoPE layers (no_rope_layers 0: every 4th) skip the rotary embedding only; their
    # Attention and cache are the same. max_window_layers 28 is read by neither
    # SmolLM3Config nor vLLM. Context max_position_embeddings 65,536, rope_scaling null.
    cfg = load("smollm3-3b")
    assert cfg["no_rope_layers"].count(0) == 9 and cfg["use_sliding_window"] is False
    assert cfg["layer_types"] == ["full_attention"] * 36 and "head_dim" not in cfg
    # 2 x 4 x 128 x 2 = 2,048 bytes per token per layer
    desc = check_full_decoder(cfg, "SmolLM3ForCausalLM", "smollm3", (36, 4, 128), "gqa",
                              "bfloat16", 65536)
    assert desc["kind"] == "generative" and desc["rope_scaling"] is None
    # 4 KV heads split across TP 2: 2 per GPU; TP 4: 1 per GPU
    assert kv_memory.kv_layout(desc, tp=2, block_size=16)["per_token_layer_bytes"] == 2 * 2 * 128 * 2
    assert kv_memory.kv_layout(desc, tp=4, block_size=16)["per_token_layer_bytes"] == 2 * 1 * 128 * 2


def _smollm3_without_layer_types(**fields):
    # a hand-written variation of SmolLM3-3B's file: no layer_types, so SmolLM3Config
    # writes them at load time (configuration_smollm3.py:101-113)
    cfg = {k: v for k, v in load("smollm3-3b").items()
           if k not in ("layer_types", "use_sliding_window", "sliding_window")}
    return dict(cfg, **fields)


def test_smollm3_window_needs_use_sliding_window_whose_default_is_false(monkeypatch):
    # SmolLM3Config.use_sliding_window defaults to false (configuration_smollm3.py:87),
    # and without it the config class writes 36 x full_attention (:106-113), whatever
    # sliding_window says; vLLM then builds no window (base.py:674-676, arg_utils.py:
    # 2248-2254: layer_types is set and not all sliding).
    cfg = _smollm3_without_layer_types(sliding_window=4096)
    desc = m.describe_config(cfg, weights_bytes=1)
    assert kinds(desc) == {"full": 36} and desc["sliding_window"] is None
    # control: without CONFIG_DEFAULTS the generic rule reads a missing
    # use_sliding_window as true, and the file would be taken for a sliding one: refused
    # (below), or, without that refusal too, slid on every layer
    monkeypatch.setattr(model_families, "CONFIG_DEFAULTS", {})
    with pytest.raises(m.UnsupportedModelError, match="no layer_types list"):
        m.describe_config(cfg, weights_bytes=1)
    monkeypatch.setattr(model_families, "LAYER_TYPES_NEEDED_MODEL_TYPES", ())
    assert kinds(m.describe_config(cfg, weights_bytes=1)) == {"sliding": 36}


def test_smollm3_sliding_without_layer_types_is_refused(monkeypatch):
    # use_sliding_window true and a window, no layer_types: SmolLM3Config makes only the
    # 9 NoPE layers sliding (configuration_smollm3.py:110-111), a rule the tuner does not
    # derive, so the file is refused rather than described as sliding everywhere.
    cfg = _smollm3_without_layer_types(use_sliding_window=True, sliding_window=4096)
    with pytest.raises(m.UnsupportedModelError, match="no layer_types list"):
        m.describe_config(cfg, weights_bytes=1)
    # the same file naming the layer_types the config class writes is described
    nope = [SLIDING if r == 0 else FULL for r in cfg["no_rope_layers"]]
    desc = m.describe_config(dict(cfg, layer_types=nope), weights_bytes=1)
    assert kinds(desc) == {"full": 27, "sliding": 9} and desc["sliding_window"] == 4096
    assert desc["attention"] == "gqa+sliding"
    # control: without LAYER_TYPES_NEEDED_MODEL_TYPES every layer would be called sliding
    monkeypatch.setattr(model_families, "LAYER_TYPES_NEEDED_MODEL_TYPES", ())
    assert kinds(m.describe_config(cfg, weights_bytes=1)) == {"sliding": 36}


def test_qwen3_next_refused_by_full_attention_interval():
    # Qwen/Qwen3-Next-80B-A3B-Thinking (Qwen3NextForCausalLM, model_type qwen3_next;
    # registry.py:112). The file has no layer_types: transformers 5.19 Qwen3NextConfig
    # (configuration_qwen3_next.py:130-134) writes them from full_attention_interval 4,
    # linear_attention unless (i + 1) % 4 == 0: 36 Gated DeltaNet + 12 full layers of 48.
    # qwen3_next.py:500-516 builds QwenGatedDeltaNetAttention (a recurrent state per
    # request, not a KV cache) for the linear_attention layers, Qwen3NextAttention for
    # the others; the model is IsHybrid (:813-819).
    cfg = load("qwen3-next-80b-a3b-thinking")
    assert cfg["architectures"] == ["Qwen3NextForCausalLM"] and "layer_types" not in cfg
    assert (cfg["num_hidden_layers"], cfg["full_attention_interval"]) == (48, 4)
    with pytest.raises(m.UnsupportedModelError) as err:
        m.describe_config(cfg, weights_bytes=1)
    assert str(err.value).startswith("full_attention_interval is set (4): hybrid linear "
                                     "attention (Qwen3-Next, Qwen3.5)")
    assert "--kv-cache-memory-bytes" in str(err.value)
    # the structure, not the name: allow_unknown_architecture does not lift it
    with pytest.raises(m.UnsupportedModelError, match="full_attention_interval"):
        m.describe_config(cfg, weights_bytes=1, allow_unknown_architecture=True)
    # the layer_types the config class writes are refused too, by that field
    written = ["linear_attention" if (i + 1) % 4 else FULL for i in range(48)]
    with pytest.raises(m.UnsupportedModelError, match="layer_types has 36 x "
                       "linear_attention"):
        m.describe_config(dict(cfg, layer_types=written), weights_bytes=1,
                          allow_unknown_architecture=True)


def test_internvl3_8b_language_model_is_read_from_llm_config(monkeypatch):
    # OpenGVLab/InternVL3-8B (InternVLChatModel, model_type internvl_chat; registry.py:440
    # in _MULTIMODAL_MODELS: a generative model although its name ends in "Model"). Its
    # config class is the checkpoint's own (auto_map InternVLChatConfig, which builds
    # llm_config with Qwen2Config(**llm_config) for Qwen2ForCausalLM); vLLM 0.32.0 loads
    # it only with trust_remote_code (transformers_utils/config.py:398-419) and then
    # copies llm_config to text_config (:152-154, :421, :744-750), the text config the
    # engine reads (get_hf_text_config, :1195-1209). internvl.py:617-621 builds the
    # language model from config.text_config: Qwen2ForCausalLM, qwen2.py:150 head_dim =
    # hidden_size // heads = 3584 // 28 = 128, :269 num_kv_heads = num_key_value_heads 4,
    # :196-205 Attention without a per-layer window, :380 make_layers(28). No window:
    # use_sliding_window false, sliding_window null. Context (config/model.py:2142-2143
    # on hf_text_config, :2584-2616): max_position_embeddings 32,768 x the dynamic rope
    # factor 2 = 65,536.
    cfg = load("internvl3-8b")
    assert cfg["model_type"] == "internvl_chat" and "text_config" not in cfg
    llm = cfg["llm_config"]
    assert (llm["model_type"], llm["architectures"]) == ("qwen2", ["Qwen2ForCausalLM"])
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["InternVLChatModel"] and desc["model_type"] == "qwen2"
    assert desc["known_architecture"] is True and desc["kind"] == "generative"
    assert (desc["num_layers"], desc["num_kv_heads"], desc["head_size"]) == (28, 4, 128)
    assert kinds(desc) == {"full": 28} and desc["sliding_window"] is None
    assert desc["attention"] == "gqa" and desc["torch_dtype"] == "bfloat16"
    assert desc["max_position_embeddings"] == 32768 and t.model_max_len(desc) == 65536
    # 2 x 4 x 128 x 2 = 2,048 bytes per token per layer
    check_kv_bytes(desc, 28, 4, 128)
    # the checkpoint's config class needs --trust-remote-code, which gpufleet never adds
    assert desc["remote_config_class"] == "configuration_internvl_chat.InternVLChatConfig"
    with pytest.raises(t.TuneError, match="only with --trust-remote-code"):
        t.plan(desc, [], kv_cache_memory_bytes=GiB, max_model_len=512)
    assert "--trust-remote-code" in t.plan(desc, [], kv_cache_memory_bytes=GiB,
                                           max_model_len=512,
                                           extra_args=["--trust-remote-code"],
                                           lock=pinning_lock(desc))["args"]
    # controls: without InternVLChatModel among the generative names the "Model" ending
    # makes it a pooling model; without internvl_chat among the remote config types no
    # --trust-remote-code is asked; without llm_config among the text config keys the
    # top level has no layer count
    monkeypatch.setattr(model_families, "GENERATIVE_ARCHITECTURES", {"ChatGLMModel"})
    assert m.describe_config(cfg, weights_bytes=1)["kind"] == "pooling"
    monkeypatch.setattr(model_families, "REMOTE_CONFIG_MODEL_TYPES", {"exaone", "internlm2", "new"})
    assert m.describe_config(cfg, weights_bytes=1)["remote_config_class"] is None
    monkeypatch.setattr(m, "TEXT_CONFIG_KEYS", ("text_config",))
    with pytest.raises(m.ModelError, match="num_hidden_layers"):
        m.describe_config(cfg, weights_bytes=1)
