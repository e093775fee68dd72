"""The decode attention of the slot cache equals transformers' SDPA attention: grouped-query heads read in
place, each row's mask hiding its own columns."""

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tritonforge.runtime.engine.transformers.slot_attention import slot_decode_attention


def test_one_token_a_row_with_grouped_heads_and_a_mask_per_row_equals_sdpa():
    torch.manual_seed(0)
    rows, heads, kv_heads, length, dim = 3, 8, 2, 7, 16
    module = nn.Module().eval()
    module.num_key_value_groups = heads // kv_heads  # what transformers' SDPA reads to repeat the heads
    query = torch.randn(rows, heads, 1, dim)
    cache = torch.randn(2, rows, kv_heads, length + 5, dim)  # a cache longer than the step reads
    key, value = cache[0, :, :, :length], cache[1, :, :, :length]  # views, as the slot cache returns them
    visible = torch.arange(length)[None, :] <= torch.tensor([2, 6, 4])[:, None]  # each row's own length
    mask = torch.zeros(rows, 1, 1, length).masked_fill(~visible[:, None, None, :], torch.finfo(torch.float32).min)

    ours, _ = slot_decode_attention(module, query, key, value, mask, scaling=0.3)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert ours.shape == expected.shape == (rows, 1, heads, dim)
    torch.testing.assert_close(ours, expected)


def test_prefill_goes_to_sdpa():
    torch.manual_seed(0)
    module = nn.Module().eval()
    module.num_key_value_groups = 2
    query, key, value = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    ours, _ = slot_decode_attention(module, query, key, value, None, is_causal=True)
    expected, _ = sdpa_attention_forward(module, query, key, value, None, is_causal=True)
    torch.testing.assert_close(ours, expected)
