"""vllm_tune: every bad config.json field, safetensors header and option is a clear
error. Each case was a traceback or a wrong answer at f11dbb6.
"""
import json
import struct

import pytest

from gpufleet import engine_args, model, tune
from helpers import run_module

GiB = 1024 ** 3
RTX_4090 = [{"name": "NVIDIA GeForce RTX 4090", "memory_total_mib": 24564,
             "compute_capability": "8.9"}]
BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "hidden_size": 4096, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
        "vocab_size": 128256, "intermediate_size": 14336}


# --------------------------------------------------------------------------------------
# vllm_tune: config.json fields
# --------------------------------------------------------------------------------------

BAD_FIELDS = [
    ("num_hidden_layers", 0), ("num_hidden_layers", -2), ("num_hidden_layers", True),
    ("num_hidden_layers", 3.5), ("num_hidden_layers", "32"), ("num_hidden_layers", [32]),
    ("num_attention_heads", 0), ("num_attention_heads", False), ("num_attention_heads", "x"),
    ("num_key_value_heads", 0), ("num_key_value_heads", -8), ("num_key_value_heads", 2.5),
    ("num_key_value_heads", 3),  # does not divide 32 attention heads
    ("hidden_size", 0), ("hidden_size", "4096"), ("hidden_size", 4001),  # not a multiple of 32
    ("head_dim", 0), ("head_dim", -128), ("head_dim", True), ("head_dim", [128]),
    ("max_position_embeddings", 0), ("max_position_embeddings", -1),
    ("max_position_embeddings", 1.5), ("max_position_embeddings", None),
    ("sliding_window", 0), ("sliding_window", -4096), ("sliding_window", "4096"),
    ("intermediate_size", -1), ("vocab_size", "big"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 0}),
    ("rope_scaling", {"rope_type": "yarn", "factor": -4}),
    ("rope_scaling", {"rope_type": "yarn", "factor": "4"}),
    ("rope_scaling", {"rope_type": "yarn", "factor": True}),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4,
                      "original_max_position_embeddings": 0}),
    ("rope_scaling", "linear"),
    ("quantization_config", {"quant_method": "awq", "bits": 0}),
    ("quantization_config", {"quant_method": "awq", "bits": "four"}),
    ("quantization_config", {"quant_method": "awq", "bits": True}),
    ("quantization_config", {"quant_method": "awq", "bits": 4, "group_size": 0}),
    ("quantization_config", {"quant_method": "awq", "bits": 4, "group_size": 1.5}),
    ("quantization_config", {"quant_method": "gptq", "bits": 4, "group_size": -2}),
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": [128, 0]}),
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": 128}),
]


@pytest.mark.parametrize("field,value", BAD_FIELDS,
                         ids=[f"{f}={v!r}" for f, v in BAD_FIELDS])
def test_bad_config_field_is_a_clear_error(field, value):
    cfg = dict(BASE, **{field: value})
    if field == "sliding_window":
        cfg["model_type"] = "mistral"
    with pytest.raises(model.ModelError) as exc:
        desc = model.describe_config(cfg, weights_bytes=GiB)
        tune.plan(desc, RTX_4090)  # where the old code crashed, if describe passed
    assert field.split("_config")[0] in str(exc.value) or field in str(exc.value)


def test_model_dir_errors_name_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(BASE, num_hidden_layers=-1)))
    with pytest.raises(model.ModelError, match=r"config\.json.*num_hidden_layers"):
        model.describe_model_dir(str(tmp_path), weights_bytes=GiB)


def _safetensors(path, header=None, raw=None, length=None):
    body = raw if raw is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body)


BAD_HEADERS = [
    ("not-json", dict(raw=b"\xff\xfe not json"), "not JSON"),
    ("list", dict(header=[1, 2]), "JSON object"),
    ("entry-not-mapping", dict(header={"w": 5}), "'w'"),
    ("dtype-unknown", dict(header={"w": {"dtype": "Q7", "shape": [2],
                                         "data_offsets": [0, 4]}}), "dtype"),
    ("shape-not-list", dict(header={"w": {"dtype": "F16", "shape": "2",
                                          "data_offsets": [0, 4]}}), "shape"),
    ("shape-negative", dict(header={"w": {"dtype": "F16", "shape": [-2],
                                          "data_offsets": [0, 4]}}), "shape"),
    ("shape-bool", dict(header={"w": {"dtype": "F16", "shape": [True],
                                      "data_offsets": [0, 2]}}), "shape"),
    ("shape-float", dict(header={"w": {"dtype": "F16", "shape": [1.5],
                                       "data_offsets": [0, 3]}}), "shape"),
    ("offsets-bool", dict(header={"w": {"dtype": "F16", "shape": [1],
                                        "data_offsets": [False, True]}}), "data_offsets"),
    ("offsets-float", dict(header={"w": {"dtype": "F16", "shape": [1],
                                         "data_offsets": [0, 2.0]}}), "data_offsets"),
    ("size-disagrees", dict(header={"w": {"dtype": "F16", "shape": [4],
                                          "data_offsets": [0, 4]}}), "shape"),
    ("length-absurd", dict(raw=b"{}", length=2 ** 63), "implausible"),
    ("length-zero", dict(raw=b"", length=0), "header"),
]


@pytest.mark.parametrize("case,kwargs,fragment", BAD_HEADERS,
                         ids=[c for c, _, _ in BAD_HEADERS])
def test_bad_safetensors_header_is_a_clear_error(tmp_path, case, kwargs, fragment):
    path = tmp_path / "model.safetensors"
    _safetensors(path, **kwargs)
    with pytest.raises(model.ModelError) as exc:
        model.safetensors_file_info(str(path))
    assert fragment in str(exc.value) and "model.safetensors" in str(exc.value)


def test_a_good_safetensors_header_still_reads(tmp_path):
    path = tmp_path / "model.safetensors"
    _safetensors(path, header={"__metadata__": {"format": "pt"},
                               "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                               "b": {"dtype": "F32", "shape": [], "data_offsets": [12, 16]}})
    assert model.safetensors_file_info(str(path)) == {"bytes": 16,
                                                      "dtypes": {"BF16": 12, "F32": 4}}


# --------------------------------------------------------------------------------------
# vllm_tune: options
# --------------------------------------------------------------------------------------

BAD_OPTIONS = [
    ({"tensor_parallel_size": -2}, "tensor_parallel_size"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"tensor_parallel_size": 1.5}, "tensor_parallel_size"),
    ({"tensor_parallel_size": "1.5"}, "tensor_parallel_size"),
    ({"tensor_parallel_size": True}, "tensor_parallel_size"),
    ({"tensor_parallel_size": "two"}, "tensor_parallel_size"),
    ({"overhead_bytes": -1}, "overhead_bytes"),
    ({"max_model_len": True}, "max_model_len"),
    ({"max_model_len": 1.5}, "max_model_len"),
    ({"target_concurrency": True}, "target_concurrency"),
    ({"kv_cache_memory_bytes": True}, "kv_cache_memory_bytes"),
    ({"gpu_memory_utilization": True}, "gpu_memory_utilization"),
]


@pytest.mark.parametrize("kwargs,fragment", BAD_OPTIONS,
                         ids=[f"{k}={v!r}" for kw, _ in BAD_OPTIONS for k, v in kw.items()])
def test_bad_tune_option_is_a_clear_error(kwargs, fragment):
    desc = model.describe_config(BASE, weights_bytes=16 * GiB)
    with pytest.raises(tune.TuneError, match=fragment):
        tune.plan(desc, RTX_4090 * 2, **kwargs)


@pytest.mark.parametrize("weights", [-1, 0, True, 1.5])
def test_bad_weights_bytes_is_a_clear_error(weights):
    with pytest.raises(model.ModelError, match="weights_bytes"):
        model.describe_config(BASE, weights_bytes=weights)


@pytest.mark.parametrize("args,fragment", [
    ({"tensor_parallel_size": -2}, "tensor_parallel_size"),
    ({"tensor_parallel_size": 1.5}, "tensor_parallel_size"),
    ({"weights_bytes": -5}, "weights_bytes"),
    ({"overhead_bytes": -1}, "overhead_bytes"),
    ({"model_config": dict(BASE, num_hidden_layers=0)}, "num_hidden_layers"),
])
def test_vllm_tune_module_fails_clearly(args, fragment, monkeypatch):
    import vllm_tune
    params = {"model_config": BASE, "weights_bytes": 16 * GiB, "gpus": RTX_4090 * 2}
    params.update(args)
    result, failed = run_module(vllm_tune.main, params, monkeypatch)
    assert failed and fragment in result["msg"], result
    assert "--tensor-parallel-size" not in json.dumps(result.get("args", []))


# vllm_tune: no secret in extra_args
@pytest.mark.parametrize("extra", [["--api-key", "KEY-VALUE-1234"], ["--api-key=KEY-VALUE-1234"],
                                   ["--enforce-eager", "--api-key", "KEY-VALUE-1234"]])
def test_an_api_key_in_extra_args_is_refused_without_the_key(extra):
    from gpufleet import tune

    with pytest.raises(tune.TuneError, match="vllm_server_api_key") as exc:
        engine_args.check_extra_args(extra)
    assert "KEY-VALUE-1234" not in str(exc.value)
    assert engine_args.models_with_secret_args([{"name": "a", "extra_args": extra},
                                         {"name": "b", "extra_args": ["--api-key-file-x"]},
                                         {"name": "c"}]) == ["a"]


def test_other_extra_args_pass():
    from gpufleet import tune

    assert engine_args.check_extra_args(["--tool-call-parser", "hermes", "--api-keys-are-elsewhere"]) == [
        "--tool-call-parser", "hermes", "--api-keys-are-elsewhere"]
    with pytest.raises(tune.TuneError, match="list of strings"):
        engine_args.check_extra_args("--enforce-eager")
