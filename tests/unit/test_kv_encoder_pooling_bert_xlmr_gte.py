"""Encoder-only pooling families (issue #14 item 5): BERT and XLM-RoBERTa cross-encoders,
GTE-new (mGTE).

Every config here is a published config.json copied from a named repository at a commit
(tests/fixtures/models/SOURCES.md, the section for this file, which says how close each
is to the hub's own file). Each expected number was derived by hand from the vLLM file
named in the test's comment, read in vLLM 0.32.0 (the wheel the lab image installs),
with that image's transformers 5.19.0. Line numbers are from those files.

All three build EncoderOnlyAttention layers, which vLLM gives an EncoderOnlyAttentionSpec
that needs no KV cache (vllm/v1/kv_cache_interface.py): the tuner plans no KV pool, only
the pooling runner (registry.py `_SEQUENCE_CLASSIFICATION_MODELS` :311 BERT, :327
XLM-RoBERTa; `_EMBEDDING_MODELS` :224 GteNewModel). The context is the engine's:
model_arch_config_convertor.py:394-427 derive_max_model_len_and_key, then
config/model.py:2129-2141, 2552-2557 (tokenizer_config.json's model_max_length for a
pooling model with position_embedding_type "absolute") and :2580-2616 (a rope factor).
"""
import json
import shutil

import pytest

from test_model_families import MODELS, check_encoder_only, load
from gpufleet import model as m
from gpufleet import model_families
from gpufleet import tune as t
from gpufleet import kv_memory
from helpers import pinning_lock

GiB = 1024 ** 3


def no_kv_cache(desc):
    """The encoder-only layout: no KV bytes, no cache groups, at 16 bits and at fp8."""
    for kv_dtype in ("auto", "fp8"):
        layout = kv_memory.kv_layout(desc, tp=1, block_size=16, kv_cache_dtype=kv_dtype)
        assert layout["per_token_layer_bytes"] == 0 and layout["groups"] == []


def pooling_plan(desc, extra_args=None, lock=None):
    """The tuner's plan on vLLM CPU (as test_tune.py plans all-MiniLM-L6-v2)."""
    result = t.plan(desc, [], kv_cache_memory_bytes=GiB, extra_args=extra_args, lock=lock)
    assert result["args"][:2] == ["--runner", "pooling"] and "--convert" not in result["args"]
    assert result["prediction"]["kv_cache_tokens"] is None
    assert any("encoder-only" in r for r in result["reasons"])
    return result


def test_ms_marco_minilm_bert_cross_encoder_has_no_kv_cache(tmp_path, monkeypatch):
    # cross-encoder/ms-marco-MiniLM-L-6-v2 (BertForSequenceClassification, model_type
    # bert). registry.py:311 -> bert.py:782 BertForSequenceClassification, a BertModel
    # (:368) of config.num_hidden_layers 6 BertLayers (:140); bert.py:243-248
    # BertSelfAttention: total_num_heads = num_attention_heads 12, head_dim = hidden_size
    # 384 // 12 = 32; :266 EncoderOnlyAttention: no KV cache. Context: max_position_embeddings
    # 512 (bert.py:57 sizes the position table by it); position_embedding_type "absolute"
    # also makes vLLM read tokenizer_config.json's model_max_length (512 on the hub).
    cfg = load("ms-marco-minilm-l-6-v2")
    desc = m.describe_config(cfg, weights_bytes=1)
    check_encoder_only(desc, "BertForSequenceClassification", "bert", (6, 12, 32))
    assert desc["num_kv_heads"] == 12 and desc["max_position_embeddings"] == 512
    assert desc["torch_dtype"] == "float32" and desc["hidden_size"] == 384
    no_kv_cache(desc)
    folder = tmp_path / "ms-marco"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    desc = m.describe_model_dir(str(folder), weights_bytes=90_000_000)
    assert desc["max_position_embeddings"] == 512
    assert pooling_plan(desc)["settings"]["max_model_len"] == 512
    # control: read as a decoder (bert outside ENCODER_ONLY_MODEL_TYPES), the same config
    # would need 2 x 12 x 32 x 2 = 1,536 bytes per token per layer, which vLLM does not
    # allocate
    monkeypatch.setattr(model_families, "ENCODER_ONLY_MODEL_TYPES",
                        model_families.ENCODER_ONLY_MODEL_TYPES - {"bert"})
    decoder = m.describe_config(cfg, weights_bytes=1)
    assert decoder["attention"] == "mha"
    assert kv_memory.kv_layout(decoder, tp=1, block_size=16)["per_token_layer_bytes"] == 1536


def test_bge_reranker_base_xlm_roberta_classifier_takes_the_tokenizer_cap(tmp_path):
    # BAAI/bge-reranker-base (XLMRobertaForSequenceClassification, model_type
    # xlm-roberta). registry.py:327-330 -> roberta.py:271 RobertaForSequenceClassification,
    # whose self.roberta is a BertModel (:307) with RobertaEmbedding: bert.py:243-248
    # head_dim = 768 // 12 = 64, 12 heads, :266 EncoderOnlyAttention (no KV cache),
    # 12 layers. max_position_embeddings 514 (roberta.py starts positions at
    # pad_token_id + 1; the engine still derives 514, convertor :394-427).
    cfg = load("bge-reranker-base")
    desc = m.describe_config(cfg, weights_bytes=1)
    check_encoder_only(desc, "XLMRobertaForSequenceClassification", "xlm-roberta",
                       (12, 12, 64))
    assert desc["max_position_embeddings"] == 514
    assert desc["torch_dtype_from_config"] is False  # the file names no torch_dtype
    no_kv_cache(desc)
    # config/model.py:2129-2141, 2552-2557: runner pooling and position_embedding_type
    # "absolute" (this file says so) -> min(514, tokenizer_config.json model_max_length
    # 512). The fixture's tokenizer_config.json is the one published beside this config.
    folder = tmp_path / "bge-reranker-base"
    shutil.copytree(MODELS / "bge-reranker-base", folder)
    desc = m.describe_model_dir(str(folder), weights_bytes=1_112_000_000)
    assert desc["max_position_embeddings"] == 512
    assert pooling_plan(desc)["settings"]["max_model_len"] == 512
    # control: without the tokenizer file the engine (and the tuner) keep 514
    (folder / "tokenizer_config.json").unlink()
    assert m.describe_model_dir(str(folder), weights_bytes=1)["max_position_embeddings"] == 514


def test_gte_multilingual_base_new_model_is_encoder_only_with_ntk_stretched_context():
    # Alibaba-NLP/gte-multilingual-base (model_type "new", remote code NewConfig;
    # architectures ["NewModel", "NewForTokenClassification"]). vLLM 0.32.0 runs it as
    # GteNewModel (registry.py:224; its docs ask for --hf-overrides '{"architectures":
    # ["GteNewModel"]}' because "NewModel" is not a registry name) -> bert_with_rope.py:559,
    # a BertWithRope of num_hidden_layers 12 blocks (:432); :110-116 head_dim =
    # hidden_size 768 // num_attention_heads 12 = 64, :137 EncoderOnlyAttention: no KV
    # cache. models/config.py:487-505 GteNewModelConfig sets the rotary embedding only.
    cfg = load("gte-multilingual-base")
    desc = m.describe_config(cfg, weights_bytes=1)
    assert desc["architectures"] == ["NewModel", "NewForTokenClassification"]
    assert desc["model_type"] == "new" and desc["known_architecture"] is True
    assert desc["kind"] == "pooling" and desc["native_pooling"] is True
    assert desc["attention"] == "encoder_only"
    assert (desc["num_layers"], desc["num_attention_heads"], desc["head_size"]) == (12, 12, 64)
    assert desc["torch_dtype"] == "float16"
    no_kv_cache(desc)
    # Context: max_position_embeddings 8192; rope_scaling {"type": "ntk", "factor": 8.0}
    # becomes rope_parameters (transformers 5.19 configuration_utils.py:585-590, the
    # rope_scaling setter), whose legacy "type" vLLM renames rope_type
    # (transformers_utils/config.py:586-587). "ntk" is not among the types vLLM leaves
    # unstretched (config/model.py:2590-2602), so the engine derives 8192 x 8 = 65,536,
    # and so does the tuner (tune.model_max_len).
    assert desc["max_position_embeddings"] == 8192
    assert desc["rope_scaling"] == {"factor": 8.0, "type": "ntk"}
    assert t.model_max_len(desc) == 65536
    # control: without the rope scaling the context is the file's 8,192
    plain = m.describe_config({k: v for k, v in cfg.items() if k != "rope_scaling"},
                              weights_bytes=1)
    assert t.model_max_len(plain) == 8192
    # its config class is the repository's (NewConfig): planned only with the flag
    result = pooling_plan(dict(desc, weights_bytes=611_000_000),
                          extra_args=["--trust-remote-code"], lock=pinning_lock(desc))
    assert result["settings"]["max_model_len"] == 65536


# The config's own architecture name -> the registry name vLLM serves it by, where they
# differ (gte-multilingual-base names the remote-code class NewModel; vLLM's registry
# entry is GteNewModel, registry.py:224).
REGISTRY_NAME = {"NewModel": "GteNewModel"}


def _documented(paragraph, heading):
    """The architecture names listed under `heading` in docs/tuning.md's count."""
    block = paragraph.split(heading, 1)[1].split("\n\n", 2)[1]
    return [name.strip("`") for name in block.rstrip(".").split(", ")]


def test_the_documented_architecture_lists_are_the_fixtures():
    """docs/tuning.md's count names exactly the architectures whose real config.json is a
    fixture here: those described, and those refused by the field that shows their
    structure (UnsupportedModelError). Neither list can drift from the fixtures."""
    described, refused = set(), set()
    for config in sorted(MODELS.glob("*/config.json")):
        cfg = json.loads(config.read_text())
        name = (cfg.get("architectures") or [cfg.get("model_type")])[0]
        name = REGISTRY_NAME.get(name, name)
        try:
            m.describe_config(cfg, weights_bytes=1)
            described.add(name)
        except m.UnsupportedModelError:
            refused.add(name)
        except m.ModelError:
            pass  # outside the table (mimo-7b-base: MiMo's remote-code config, unread)
    # gte-Qwen2-7B-instruct without its sentence-transformers files is refused, but
    # Qwen2ForCausalLM is described on its own configs: a name counts once.
    refused -= described
    text = (MODELS.parents[2] / "docs" / "tuning.md").read_text()
    paragraph = text.split("Count (vLLM 0.32.0's registry", 1)[1].split("\n## ", 1)[0]
    doc_described = _documented(paragraph, "Described and tested on their own real")
    doc_refused = _documented(paragraph, "Refused on their real config by the field")
    assert sorted(doc_described) == sorted(described)
    assert sorted(doc_refused) == sorted(refused)
    assert f"**{len(described)} registry\narchitectures**" in paragraph
    assert f"**{len(refused)} more**" in paragraph
    assert f"{len(described) + len(refused)} in all" in paragraph


@pytest.mark.parametrize("name, remote", [
    ("gte-multilingual-base", "configuration.NewConfig"),
    ("internlm2_5-7b", "configuration_internlm2.InternLM2Config"),
    ("exaone-3.5-7.8b-instruct", "configuration_exaone.ExaoneConfig"),
])
def test_a_config_class_only_the_repository_defines_needs_trust_remote_code(name, remote):
    # transformers 5.19 has no config class for model_type new, internlm2 or exaone
    # (models/auto/auto_mappings.py CONFIG_MAPPING_NAMES), nor has vLLM 0.32.0
    # (transformers_utils/config.py _CONFIG_REGISTRY), so HFConfigParser.parse's
    # AutoConfig.from_pretrained needs trust_remote_code for the auto_map class, else
    # "Failed to load the model config": the plan is refused before the deploy, and
    # the flag is never added on the user's behalf.
    desc = m.describe_config(load(name), weights_bytes=GiB)
    assert desc["remote_config_class"] == remote
    with pytest.raises(t.TuneError, match=r"only with --trust-remote-code.*add "
                       r"--trust-remote-code to extra_args") as err:
        t.plan(desc, [], kv_cache_memory_bytes=GiB, max_model_len=512)
    assert remote in str(err.value)
    result = t.plan(desc, [], kv_cache_memory_bytes=GiB, max_model_len=512,
                    extra_args=["--trust-remote-code"], lock=pinning_lock(desc))
    assert "--trust-remote-code" in result["args"]
    assert any(r.startswith("--trust-remote-code (extra_args)") for r in result["reasons"])


@pytest.mark.parametrize("name", ["chatglm3-6b", "kimi-k2-instruct", "phi-3-medium-4k-instruct",
                                  "llama-3.1-8b"])
def test_configs_whose_class_transformers_or_vllm_has_need_no_remote_code(name):
    # control: auto_map alone is not the rule. chatglm and kimi_k2 are in vLLM's
    # _CONFIG_REGISTRY (its own ChatGLMConfig, DeepseekV3Config), phi3 is in transformers'
    # mapping (the local class wins without trust_remote_code), llama names none.
    desc = m.describe_config(load(name), weights_bytes=GiB)
    assert desc["remote_config_class"] is None
