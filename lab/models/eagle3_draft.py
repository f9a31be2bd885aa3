"""A tiny random EAGLE-3 draft for a lab Llama, in the layout vLLM 0.32.0 loads
(vllm/model_executor/models/llama_eagle3.py, Eagle3LlamaForCausalLM).

    python eagle3_draft.py TARGET_CONFIG_JSON OUT_DIR

Runs with the lab image's own python (torch and safetensors are there, nothing else is
needed): tests/slow/test_tune_speculative_cpu.py starts it in gpufleet/vllm-cpu:lab.
The draft has the target's hidden size, heads, KV heads, head size and vocabulary, one
decoder layer (`midlayer.*`, whose q/k/v take 2 x hidden: the embedding and the hidden
state concatenated), `fc` over three auxiliary hidden states (vLLM's default), `norm`
and its own `lm_head`; no `embed_tokens`, so vLLM shares the target's
(llm_base_proposer.py: "Detected EAGLE model without its own embed_tokens"). The draft
vocabulary equals the target's, so no d2t/t2d maps. Weights are random (seed 0): the
draft is for sizing and starting, its tokens are noise.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file


def main(target_config, out):
    with open(target_config, encoding="utf-8") as handle:
        target = json.load(handle)
    hidden, heads = target["hidden_size"], target["num_attention_heads"]
    kv = target.get("num_key_value_heads", heads)
    head = target.get("head_dim") or hidden // heads
    inter, vocab = target["intermediate_size"], target["vocab_size"]
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "hidden_size": hidden, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": head, "intermediate_size": inter,
              "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": vocab,
              "max_position_embeddings": target.get("max_position_embeddings", 2048),
              "rms_norm_eps": target.get("rms_norm_eps", 1e-6), "hidden_act": "silu",
              "torch_dtype": "bfloat16", "rope_theta": 10000.0,
              "tie_word_embeddings": False}
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(size):
        return torch.ones(size, dtype=torch.bfloat16)

    tensors = {
        "midlayer.self_attn.q_proj.weight": rand(heads * head, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv * head, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv * head, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * head),
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden),
        "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, inter),
        "midlayer.input_layernorm.weight": ones(hidden),
        "midlayer.hidden_norm.weight": ones(hidden),
        "midlayer.post_attention_layernorm.weight": ones(hidden),
        "norm.weight": ones(hidden),
        "fc.weight": rand(hidden, 3 * hidden),
        "lm_head.weight": rand(vocab, hidden),
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "model.safetensors"):
        os.chmod(os.path.join(out, name), 0o644)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
