"""Write a tiny Llama model folder (config.json and a safetensors header with real
offsets), as tests/unit/test_plan_playbook.py does: what vllm_tune reads."""
import json
import pathlib
import struct
import sys

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
    "head_dim": 32, "hidden_size": 64, "intermediate_size": 128,
    "max_position_embeddings": 2048, "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": False,
}

folder = pathlib.Path(sys.argv[1])
folder.mkdir(parents=True)
(folder / "config.json").write_text(json.dumps(CONFIG))
n = 512 * 64
header = json.dumps({"model.embed_tokens.weight": {
    "dtype": "BF16", "shape": [512, 64], "data_offsets": [0, 2 * n]}}).encode()
(folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(2 * n))
