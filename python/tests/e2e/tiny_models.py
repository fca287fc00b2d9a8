"""Tiny random-weight models for the real-engine tests, made at test time
with transformers from a config (nothing downloaded): the three attention
layouts kvoffload must carry through vLLM.

  llama       Llama-style, full attention only: one KV-cache group.
  gemma3      Gemma-3-style text model, sliding-window and full layers: a
              full group and sliding groups.
  qwen3_next  Qwen3-Next-style hybrid, gated-DeltaNet (linear attention,
              a recurrent state) and full-attention layers.

Sizes are chosen for vLLM's CPU attention (head_dim 64: head_dim 16 is not
a supported CPU attention configuration) and to keep a step cheap."""
from __future__ import annotations

import os
from typing import Callable

VOCAB = 512


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=64, num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=8192)
    return LlamaForCausalLM(cfg)


def _gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=64, num_hidden_layers=3, vocab_size=VOCAB, max_position_embeddings=8192,
                           sliding_window=128, layer_types=["sliding_attention", "sliding_attention",
                                                            "full_attention"])
    return Gemma3ForCausalLM(cfg)


def _qwen3_next():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    cfg = Qwen3NextConfig(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=64, num_hidden_layers=4, vocab_size=VOCAB, max_position_embeddings=8192,
                          layer_types=["linear_attention", "linear_attention", "linear_attention",
                                       "full_attention"],
                          linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=64,
                          linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                          decoder_sparse_step=1, mlp_only_layers=[])
    return Qwen3NextForCausalLM(cfg)


MODELS: dict[str, Callable] = {"llama": _llama, "gemma3": _gemma3, "qwen3_next": _qwen3_next}


def make(name: str, root: str, seed: int = 0) -> str:
    """Save model `name` with random bf16 weights under root/name (once);
    returns the directory."""
    import torch
    d = os.path.join(root, name)
    if os.path.exists(os.path.join(d, "config.json")):
        return d
    torch.manual_seed(seed)
    m = MODELS[name]().to(torch.bfloat16)
    m.save_pretrained(d + ".tmp")
    os.replace(d + ".tmp", d)
    return d
