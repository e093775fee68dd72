"""The preprocessing model's logic: prompts (or chat messages) and word lists in, engine tensors out.

Tensor names are NVIDIA's (../INTERFACE.md), plus one of ours: ``MESSAGES`` (the ensemble's ``messages``),
a JSON list of ``{"role", "content"}`` objects rendered with the tokenizer's chat template. A request sends
``QUERY`` or ``MESSAGES``, not both.
"""

from __future__ import annotations

import numpy as np

from .contract import CLIENT_NAME
from .errors import RequestError, UnsupportedError
from .limits import EngineLimits
from .tokenization import (
    PromptEncoder,
    decode_utf8,
    default_end_id,
    default_pad_id,
    encode_phrases,
    load_tokenizer,
    pad_word_lists,
)


def batch_rows(inputs: dict[str, np.ndarray], name: str) -> int:
    value = inputs.get(name)
    return 0 if value is None else int(value.shape[0])


def scalar_rows(inputs: dict[str, np.ndarray], name: str, batch: int) -> list | None:
    """A [B, 1] (or [B]) input as B Python scalars, or None when absent."""
    value = inputs.get(name)
    if value is None:
        return None
    flat = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(-1, 1)
    field = CLIENT_NAME.get(name, name)
    if flat.shape[0] != batch:
        raise RequestError(field, f"has {flat.shape[0]} rows, the request has {batch}")
    if flat.shape[1] != 1:
        raise RequestError(field, f"must hold one value per row, got {flat.shape[1]}")
    return [item.item() if isinstance(item, np.generic) else item for item in flat[:, 0]]


MAX_WORDS = 256  # stop / bad phrases per row
MAX_WORD_BYTES = 64 * 1024  # all stop (or bad) phrases of a request together


class Preprocessor:
    def __init__(self, tokenizer_dir: str, limits: EngineLimits, add_special_tokens: bool = True):
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
        if inputs.get("DECODER_QUERY") is not None and any(scalar_rows(inputs, "DECODER_QUERY", batch)):
            raise UnsupportedError("decoder_text_input", "encoder-decoder models are not supported by this "
                                                         "repository's models")
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
        outputs = {
            "INPUT_ID": input_id,
            "REQUEST_INPUT_LEN": np.array([[len(ids)] for ids in prompt_ids], dtype=np.int32),
            # A decoder-only model has no decoder prompt: one pad id, as NVIDIA's preprocessing sends.
            "DECODER_INPUT_ID": np.array([[int(v)] for v in pad_ids], dtype=np.int32),
            "REQUEST_DECODER_INPUT_LEN": np.ones((batch, 1), dtype=np.int32),
            "REQUEST_OUTPUT_LEN": np.array([[int(n)] for n in output_lens], dtype=np.int32),
            "BAD_WORDS_IDS": self._word_lists(inputs, "BAD_WORDS_DICT", batch),
            "STOP_WORDS_IDS": self._word_lists(inputs, "STOP_WORDS_DICT", batch),
            "EMBEDDING_BIAS": self._embedding_bias(inputs, batch),
            "OUT_END_ID": np.array([[int(v)] for v in end_ids], dtype=np.int32),
            "OUT_PAD_ID": np.array([[int(v)] for v in pad_ids], dtype=np.int32),
        }
        extra_ids = scalar_rows(inputs, "PROMPT_TABLE_EXTRA_ID", batch)
        if extra_ids is not None:  # sent only when given, as NVIDIA's: ids past the vocabulary get the row's id
            vocab = len(self.tokenizer)
            outputs["OUT_PROMPT_TABLE_EXTRA_IDS"] = np.where(
                input_id >= vocab, np.array(extra_ids, dtype=np.uint64)[:, None], 0).astype(np.uint64)
        return outputs

    def _embedding_bias(self, inputs: dict[str, np.ndarray], batch: int) -> np.ndarray:
        """Dense [batch, vocab] bias from words and weights, [batch, 0] (none) when not given. Each word is
        tokenized without special tokens (NVIDIA's adds BOS, which biases BOS on every word)."""
        words, weights = inputs.get("EMBEDDING_BIAS_WORDS"), inputs.get("EMBEDDING_BIAS_WEIGHTS")
        if words is None and weights is None:
            return np.zeros((batch, 0), dtype=np.float32)
        if words is None or weights is None:
            raise RequestError("embedding_bias_weights" if weights is None else "embedding_bias_words",
                               "must be sent together with embedding_bias_words and embedding_bias_weights")
        words, weights = words.reshape(words.shape[0], -1), weights.reshape(weights.shape[0], -1)
        if words.shape != weights.shape or words.shape[0] != batch:
            raise RequestError("embedding_bias_weights", f"must have one weight per word, got shape "
                                                         f"{list(weights.shape)} for words {list(words.shape)}")
        bias = np.zeros((batch, len(self.tokenizer)), dtype=np.float32)
        for row in range(batch):
            for word, weight in zip(words[row], weights[row]):
                text = decode_utf8("embedding_bias_words", word)
                if not np.isfinite(weight):
                    raise RequestError("embedding_bias_weights", f"must be finite, got {weight}")
                for token in self.tokenizer(text, add_special_tokens=False).input_ids if text else []:
                    bias[row, token] += weight
        return bias

    def _word_lists(self, inputs: dict[str, np.ndarray], name: str, batch: int) -> np.ndarray:
        value = inputs.get(name)
        field = CLIENT_NAME[name]
        if value is None:
            return np.zeros((batch, 2, 0), dtype=np.int32)
        rows = value.reshape(value.shape[0], -1)
        if rows.shape[0] != batch:
            raise RequestError(field, f"has {rows.shape[0]} rows, the request has {batch}")
        # Sized before anything is decoded or tokenized: a megabyte of phrases must not cost seconds of CPU.
        if rows.shape[1] > MAX_WORDS:
            raise RequestError(field, f"has {rows.shape[1]} phrases per row, more than {MAX_WORDS}")
        size = sum(len(item) for item in rows.reshape(-1))
        if size > MAX_WORD_BYTES:
            raise RequestError(field, f"holds {size} bytes of phrases, more than {MAX_WORD_BYTES}")
        blocks = []
        for row in range(batch):
            prefix = f"[{row}]" if batch > 1 else ""
            phrases = [decode_utf8(f"{field}{prefix}", item) for item in rows[row]]
            blocks.append(encode_phrases(self.tokenizer, phrases, field))
        return pad_word_lists(blocks)
