"""The preprocessing model's logic: prompts (or chat messages) and word lists in, engine tensors out.

Tensor names are NVIDIA's (docs/reference/tensors.md#preprocessing-the-tokenizer), plus one of ours:
``MESSAGES`` (the ensemble's ``messages``), a JSON list of ``{"role", "content"}`` objects rendered with the
tokenizer's chat template. A request sends ``QUERY`` or ``MESSAGES``, not both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...facts.contract import (
    BAD_WORDS,
    BAD_WORDS_LIST,
    DECODER_TEXT_INPUT,
    EMBEDDING_BIAS,
    EMBEDDING_BIAS_WEIGHTS,
    EMBEDDING_BIAS_WORDS,
    END_ID,
    INPUT_IDS,
    INPUT_LENGTHS,
    MAX_TOKENS,
    MESSAGES,
    MESSAGES_WIRING,
    PAD_ID,
    PRE_BAD_WORDS_IDS,
    PRE_DECODER_INPUT_ID,
    PRE_EMBEDDING_BIAS,
    PRE_INPUT_ID,
    PRE_OUT_END_ID,
    PRE_OUT_PAD_ID,
    PRE_OUT_PROMPT_TABLE_EXTRA_IDS,
    PRE_REQUEST_DECODER_INPUT_LEN,
    PRE_REQUEST_INPUT_LEN,
    PRE_REQUEST_OUTPUT_LEN,
    PRE_STOP_WORDS_IDS,
    PREPROCESSING_FROM_CLIENT,
    PROMPT_TABLE_EXTRA_ID,
    PROMPT_TABLE_EXTRA_IDS,
    REQUEST_OUTPUT_LEN,
    STOP_WORDS,
    STOP_WORDS_LIST,
    TEXT_INPUT,
)
from ...facts.errors import RequestError, UnsupportedError
from ...facts.limits import EngineLimits
from .tokenization import (
    PromptEncoder,
    decode_utf8,
    default_end_id,
    default_pad_id,
    encode_phrases,
    load_tokenizer,
    pad_word_lists,
)

# The request fields preprocessing reads, by their client names (errors name these), and the tensor each has on
# the preprocessing model. The BLS reads the same fields under the client names themselves.
PREPROCESSING_TENSORS = {client: tensor for tensor, client in {**PREPROCESSING_FROM_CLIENT, **MESSAGES_WIRING}.items()}
CLIENT_TENSORS = {client: client for client in PREPROCESSING_TENSORS}


class RequestFields:
    """One request's inputs, read by client field name through the model's own tensor names."""

    def __init__(self, inputs: dict[str, np.ndarray], tensors: dict[str, str]):
        self.inputs = inputs
        self.tensors = tensors

    def get(self, field: str) -> np.ndarray | None:
        return self.inputs.get(self.tensors[field])

    def rows(self, field: str) -> int:
        value = self.get(field)
        return 0 if value is None else int(value.shape[0])

    def scalars(self, field: str, batch: int) -> list | None:
        """A [B, 1] (or [B]) input as B Python scalars, or None when absent."""
        value = self.get(field)
        if value is None:
            return None
        flat = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(-1, 1)
        if flat.shape[0] != batch:
            raise RequestError(field, f"has {flat.shape[0]} rows, the request has {batch}")
        if flat.shape[1] != 1:
            raise RequestError(field, f"must hold one value per row, got {flat.shape[1]}")
        return [item.item() if isinstance(item, np.generic) else item for item in flat[:, 0]]


MAX_WORDS = 256  # stop / bad phrases per row
MAX_WORD_BYTES = 64 * 1024  # all stop (or bad) phrases of a request together


@dataclass(frozen=True)
class EncodedRequest:
    """A request's rows, tokenized and checked: what preprocessing sends the engine through the ensemble, and
    what the BLS sends it directly."""

    prompt_ids: list[list[int]]
    max_tokens: list[int]
    end_ids: list[int]
    pad_ids: list[int]
    stop_words: np.ndarray  # [batch, 2, n]: NVIDIA's word-list layout (flat ids, end offsets), n = 0 when none
    bad_words: np.ndarray
    embedding_bias: np.ndarray  # [batch, vocab], or [batch, 0] when none
    prompt_table_extra_ids: np.ndarray | None  # [batch, width] uint64, only when the request sent ids

    @property
    def batch(self) -> int:
        return len(self.prompt_ids)

    def preprocessing_outputs(self) -> dict[str, np.ndarray]:
        """The preprocessing model's outputs: prompts padded to one width with each row's pad id."""
        width = max(len(ids) for ids in self.prompt_ids)
        input_id = np.empty((self.batch, width), dtype=np.int32)
        for row, ids in enumerate(self.prompt_ids):
            input_id[row, : len(ids)] = ids
            input_id[row, len(ids):] = self.pad_ids[row]
        outputs = {
            PRE_INPUT_ID: input_id,
            PRE_REQUEST_INPUT_LEN: _column([len(ids) for ids in self.prompt_ids]),
            # A decoder-only model has no decoder prompt: one pad id, as NVIDIA's preprocessing sends.
            PRE_DECODER_INPUT_ID: _column(self.pad_ids),
            PRE_REQUEST_DECODER_INPUT_LEN: np.ones((self.batch, 1), dtype=np.int32),
            PRE_REQUEST_OUTPUT_LEN: _column(self.max_tokens),
            PRE_BAD_WORDS_IDS: self.bad_words,
            PRE_STOP_WORDS_IDS: self.stop_words,
            PRE_EMBEDDING_BIAS: self.embedding_bias,
            PRE_OUT_END_ID: _column(self.end_ids),
            PRE_OUT_PAD_ID: _column(self.pad_ids),
        }
        if self.prompt_table_extra_ids is not None:
            outputs[PRE_OUT_PROMPT_TABLE_EXTRA_IDS] = self.prompt_table_extra_ids
        return outputs

    def engine_inputs(self, row: int) -> dict[str, np.ndarray]:
        """One row as the engine's inputs (tensorrt_llm names); empty word lists and bias left out."""
        one = slice(row, row + 1)
        inputs = {
            INPUT_IDS: np.array([self.prompt_ids[row]], dtype=np.int32),
            INPUT_LENGTHS: _column([len(self.prompt_ids[row])]),
            REQUEST_OUTPUT_LEN: _column([self.max_tokens[row]]),
            END_ID: _column([self.end_ids[row]]),
            PAD_ID: _column([self.pad_ids[row]]),
        }
        if self.stop_words.shape[-1]:
            inputs[STOP_WORDS_LIST] = self.stop_words[one]
        if self.bad_words.shape[-1]:
            inputs[BAD_WORDS_LIST] = self.bad_words[one]
        if self.embedding_bias.shape[-1]:
            inputs[EMBEDDING_BIAS] = self.embedding_bias[one]
        if self.prompt_table_extra_ids is not None:
            inputs[PROMPT_TABLE_EXTRA_IDS] = self.prompt_table_extra_ids[one, : len(self.prompt_ids[row])]
        return inputs


def _column(values: list[int]) -> np.ndarray:
    return np.array([[int(value)] for value in values], dtype=np.int32)


class Preprocessor:
    """Prompts (or chat messages), word lists and sampling ids in; an `EncodedRequest` out."""

    def __init__(self, tokenizer_dir: str, limits: EngineLimits, add_special_tokens: bool = True):
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.limits = limits
        self.encoder = PromptEncoder(self.tokenizer, limits.max_input_len, add_special_tokens)
        self.end_id = default_end_id(self.tokenizer)
        self.pad_id = default_pad_id(self.tokenizer)

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The preprocessing model: its input tensors in, its output tensors out."""
        return self.encode(inputs, PREPROCESSING_TENSORS).preprocessing_outputs()

    def encode(self, inputs: dict[str, np.ndarray], tensors: dict[str, str]) -> EncodedRequest:
        """Read a request's fields through `tensors` (client field → this model's tensor name), check them
        against the limits, and tokenize them."""
        fields = RequestFields(inputs, tensors)
        batch = max(fields.rows(TEXT_INPUT), fields.rows(MESSAGES))
        queries = fields.scalars(TEXT_INPUT, batch)
        messages = fields.scalars(MESSAGES, batch)
        if queries is None and messages is None:
            raise RequestError(TEXT_INPUT, "is required (or send chat messages in 'messages')")
        if queries is not None and messages is not None:
            raise RequestError(MESSAGES, "send either text_input or messages, not both")
        output_lens = fields.scalars(MAX_TOKENS, batch)
        if output_lens is None:
            raise RequestError(MAX_TOKENS, "is required")
        if fields.get(DECODER_TEXT_INPUT) is not None and any(fields.scalars(DECODER_TEXT_INPUT, batch)):
            raise UnsupportedError(DECODER_TEXT_INPUT, "encoder-decoder models are not supported by this "
                                                         "repository's models")
        end_ids = fields.scalars(END_ID, batch) or [self.end_id] * batch
        pad_ids = fields.scalars(PAD_ID, batch) or [self.pad_id] * batch

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

        extra_ids = fields.scalars(PROMPT_TABLE_EXTRA_ID, batch)
        table_ids = None
        if extra_ids is not None:  # sent only when given, as NVIDIA's: ids past the vocabulary get the row's id
            vocab = len(self.tokenizer)
            width = max(len(ids) for ids in prompt_ids)
            table_ids = np.zeros((batch, width), dtype=np.uint64)
            for row, ids in enumerate(prompt_ids):
                table_ids[row, : len(ids)] = np.where(np.array(ids) >= vocab, extra_ids[row], 0)
        return EncodedRequest(
            prompt_ids=prompt_ids, max_tokens=[int(n) for n in output_lens], end_ids=[int(v) for v in end_ids],
            pad_ids=[int(v) for v in pad_ids], stop_words=self._word_lists(fields, STOP_WORDS, batch),
            bad_words=self._word_lists(fields, BAD_WORDS, batch),
            embedding_bias=self._embedding_bias(fields, batch), prompt_table_extra_ids=table_ids)

    def _embedding_bias(self, fields: RequestFields, batch: int) -> np.ndarray:
        """Dense [batch, vocab] bias from words and weights, [batch, 0] (none) when not given. Each word is
        tokenized without special tokens (NVIDIA's adds BOS, which biases BOS on every word)."""
        words, weights = fields.get(EMBEDDING_BIAS_WORDS), fields.get(EMBEDDING_BIAS_WEIGHTS)
        if words is None and weights is None:
            return np.zeros((batch, 0), dtype=np.float32)
        if words is None or weights is None:
            raise RequestError(EMBEDDING_BIAS_WEIGHTS if weights is None else EMBEDDING_BIAS_WORDS,
                               "must be sent together with embedding_bias_words and embedding_bias_weights")
        words, weights = words.reshape(words.shape[0], -1), weights.reshape(weights.shape[0], -1)
        if words.shape != weights.shape or words.shape[0] != batch:
            raise RequestError(EMBEDDING_BIAS_WEIGHTS, f"must have one weight per word, got shape "
                                                         f"{list(weights.shape)} for words {list(words.shape)}")
        bias = np.zeros((batch, len(self.tokenizer)), dtype=np.float32)
        for row in range(batch):
            for word, weight in zip(words[row], weights[row]):
                text = decode_utf8(EMBEDDING_BIAS_WORDS, word)
                if not np.isfinite(weight):
                    raise RequestError(EMBEDDING_BIAS_WEIGHTS, f"must be finite, got {weight}")
                for token in self.tokenizer(text, add_special_tokens=False).input_ids if text else []:
                    bias[row, token] += weight
        return bias

    def _word_lists(self, fields: RequestFields, field: str, batch: int) -> np.ndarray:
        value = fields.get(field)
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
