"""Decode attention over the slot cache: one query token a row, grouped-query heads read in place.

transformers' SDPA path repeats every key and value head for the query heads that share it (`repeat_kv`: a
copy of the step's whole cache, per layer and step) and then runs a fused kernel made for long queries. A
decode step has one query token a row: two batched matmuls on views of the cache (each group of query heads
against its own key-value head) and a softmax do the same work without copying the cache. Measured on an H200
(bench/engine_gpu.py, 1B Llama, 128 rows) the copies and the fused kernel were most of a step's GPU time.

Prefill (several query tokens) goes to transformers' own SDPA function, with SDPA's masks.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SLOT_ATTENTION = "tritonforge_slot_decode"  # the name the engine's model runs its attention under


def slot_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          **kwargs) -> tuple[torch.Tensor, None]:
    """query [rows, heads, q_len, dim]; key, value [rows, kv_heads, length, dim] (views of the slot cache);
    attention_mask additive, [rows, 1, q_len, length]. Returns [rows, q_len, heads, dim], as transformers'
    attention functions do."""
    rows, heads, query_len, dim = query.shape
    if query_len != 1 or module.training:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kv_heads = key.shape[1]
    grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)  # query head h reads key-value head h // group
    scale = dim ** -0.5 if scaling is None else scaling
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale  # [rows, kv_heads, group, length]
    if attention_mask is not None:
        scores = scores + attention_mask  # [rows, 1, 1, length]: every head of a row alike
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    output = torch.matmul(weights, value)  # [rows, kv_heads, group, dim]
    return output.reshape(rows, 1, heads, dim), None


def use_slot_attention(model) -> None:
    """Run `model`'s attention through `slot_decode_attention` (registered with transformers once)."""
    if SLOT_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(SLOT_ATTENTION, slot_decode_attention)
        AttentionMaskInterface.register(SLOT_ATTENTION, sdpa_mask)
    model.set_attn_implementation(SLOT_ATTENTION)
