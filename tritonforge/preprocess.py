"""The preprocessing model's logic: prompts (or chat messages) and word lists in, engine tensors out.

Tensor names are NVIDIA's (../INTERFACE.md), plus one of ours: ``MESSAGES`` (the ensemble's ``messages``),
a JSON list of ``{"role", "content"}`` objects rendered with the tokenizer's chat template. A request sends
``QUERY`` or ``MESSAGES``, not both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import RequestError
from .model_configs import PREPROCESSING_MAP
from .tokenization import (
    PromptEncoder,
    decode_utf8,
    default_end_id,
    default_pad_id,
    encode_phrases,
    load_tokenizer,
    pad_word_lists,
)

# Client-facing names, so that errors name what the client sent (through the ensemble or the BLS):
# the ensemble's own wiring, model input → client input.
CLIENT_NAMES = PREPROCESSING_MAP


@dataclass(frozen=True, kw_only=True)
class PreprocessLimits:
    max_input_len: int
    max_output_len: int

    def __post_init__(self):
        if self.max_input_len < 1 or self.max_output_len < 1:
            raise ValueError(f"limits must be positive: {self}")


def batch_rows(inputs: dict[str, np.ndarray], name: str) -> int:
    value = inputs.get(name)
    return 0 if value is None else int(value.shape[0])


def scalar_rows(inputs: dict[str, np.ndarray], name: str, batch: int) -> list | None:
    """A [B, 1] (or [B]) input as B Python scalars, or None when absent."""
    value = inputs.get(name)
    if value is None:
        return None
    flat = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(-1, 1)
    field = CLIENT_NAMES.get(name, name)
    if flat.shape[0] != batch:
        raise RequestError(field, f"has {flat.shape[0]} rows, the request has {batch}")
    if flat.shape[1] != 1:
        raise RequestError(field, f"must hold one value per row, got {flat.shape[1]}")
    return [item.item() if isinstance(item, np.generic) else item for item in flat[:, 0]]


class Preprocessor:
    def __init__(self, tokenizer_dir: str, limits: PreprocessLimits, add_special_tokens: bool = True):
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.limits = limits
        self.encoder = PromptEncoder(self.tokenizer, limits.max_input_len, add_special_tokens)
        self.end_id = default_end_id(self.tokenizer)
        self.pad_id = default_pad_id(self.tokenizer)

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch = max(batch_rows(inputs, "QUERY"), batch_rows(inputs, "MESSAGES"))
        queries = scalar_rows(inputs, "QUERY", batch)
        messages = scalar_rows(inputs, "MESSAGES", batch)
        if queries is None and messages is None:
            raise RequestError("text_input", "is required (or send chat messages in 'messages')")
        if queries is not None and messages is not None:
            raise RequestError("messages", "send either text_input or messages, not both")
        output_lens = scalar_rows(inputs, "REQUEST_OUTPUT_LEN", batch)
        if output_lens is None:
            raise RequestError("max_tokens", "is required")
        end_ids = scalar_rows(inputs, "END_ID", batch) or [self.end_id] * batch
        pad_ids = scalar_rows(inputs, "PAD_ID", batch) or [self.pad_id] * batch

        prompt_ids = []
        for row in range(batch):
            prefix = f"[{row}]" if batch > 1 else ""
            if queries is not None:
                text = decode_utf8(f"text_input{prefix}", queries[row])
                prompt_ids.append(self.encoder.encode(text, field=f"text_input{prefix}"))
            else:
                text = decode_utf8(f"messages{prefix}", messages[row])
                prompt_ids.append(self.encoder.encode_chat(text, field=f"messages{prefix}"))
            max_tokens = int(output_lens[row])
            if not 1 <= max_tokens <= self.limits.max_output_len:
                raise RequestError(f"max_tokens{prefix}",
                                   f"must be in [1, {self.limits.max_output_len}], got {max_tokens}")

        width = max(len(ids) for ids in prompt_ids)
        input_id = np.empty((batch, width), dtype=np.int32)
        for row, ids in enumerate(prompt_ids):
            input_id[row, : len(ids)] = ids
            input_id[row, len(ids):] = pad_ids[row]
        return {
            "INPUT_ID": input_id,
            "REQUEST_INPUT_LEN": np.array([[len(ids)] for ids in prompt_ids], dtype=np.int32),
            "REQUEST_OUTPUT_LEN": np.array([[int(n)] for n in output_lens], dtype=np.int32),
            "BAD_WORDS_IDS": self._word_lists(inputs, "BAD_WORDS_DICT", batch),
            "STOP_WORDS_IDS": self._word_lists(inputs, "STOP_WORDS_DICT", batch),
            "OUT_END_ID": np.array([[int(v)] for v in end_ids], dtype=np.int32),
            "OUT_PAD_ID": np.array([[int(v)] for v in pad_ids], dtype=np.int32),
        }

    def _word_lists(self, inputs: dict[str, np.ndarray], name: str, batch: int) -> np.ndarray:
        value = inputs.get(name)
        field = CLIENT_NAMES[name]
        if value is None:
            return np.zeros((batch, 2, 0), dtype=np.int32)
        rows = value.reshape(value.shape[0], -1)
        if rows.shape[0] != batch:
            raise RequestError(field, f"has {rows.shape[0]} rows, the request has {batch}")
        blocks = []
        for row in range(batch):
            prefix = f"[{row}]" if batch > 1 else ""
            phrases = [decode_utf8(f"{field}{prefix}", item) for item in rows[row]]
            blocks.append(encode_phrases(self.tokenizer, phrases, field))
        return pad_word_lists(blocks)
