"""The postprocessing model's logic: token ids in, their text out, always valid UTF-8.

Stateless by design, as the real engine streams only the new tokens of each step and any instance may
decode any chunk: each call decodes the tokens it is given with the byte table of
`tritonforge.runtime.text.detokenization` (so SentencePiece word spaces survive), then turns bytes that do not form a
character into U+FFFD, as the tokenizer's own decode does. A streamed chunk therefore equals its exact text
whenever its edges fall between characters; a character whose bytes straddle two chunks shows as U+FFFD in
each (the BLS keeps such characters whole). See docs/design/streaming.md.
"""

from __future__ import annotations

import numpy as np

from ...facts.contract import (
    POST_OUTPUT,
    POST_SEQUENCE_LENGTH,
    POST_TOKENS_BATCH,
    TOKEN_BYTES,
    TOP_TOKEN_BYTES,
    TOP_TOKEN_IDS,
)
from ...facts.errors import RequestError
from .detokenization import token_bytes_of


class Postprocessor:
    def __init__(self, tokenizer_dir: str):
        self.token_bytes = token_bytes_of(tokenizer_dir)

    def __call__(self, tokens_batch: np.ndarray, sequence_length: np.ndarray) -> np.ndarray:
        """TOKENS_BATCH [B, beams, T] and SEQUENCE_LENGTH [B, beams] → OUTPUT [B * beams] of UTF-8 bytes.

        Flat, as NVIDIA's postprocessing answers (clients read `text_output[0]`)."""
        if tokens_batch.ndim == 2:  # [B, T]: one beam
            tokens_batch = tokens_batch[:, None, :]
        sequence_length = sequence_length.reshape(tokens_batch.shape[0], -1)
        if sequence_length.shape[1] != tokens_batch.shape[1]:
            raise RequestError(POST_SEQUENCE_LENGTH, f"has {sequence_length.shape[1]} beams, TOKENS_BATCH has "
                                                  f"{tokens_batch.shape[1]}")
        out = np.empty(sequence_length.shape, dtype=object)
        for row in range(tokens_batch.shape[0]):
            for beam in range(tokens_batch.shape[1]):
                length = int(sequence_length[row, beam])
                ids = tokens_batch[row, beam, : max(length, 0)].tolist()
                out[row, beam] = self.token_bytes.decode_text(ids).encode("utf-8")
        return out.reshape(-1)

    def answer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request's outputs: OUTPUT, and with the engine's likeliest tokens (`top_token_ids`, the ensemble's
        `num_top_log_probs`) the bytes of every token and alternative."""
        tokens_batch, sequence_length = inputs[POST_TOKENS_BATCH], inputs[POST_SEQUENCE_LENGTH]
        outputs = {POST_OUTPUT: self(tokens_batch, sequence_length)}
        if TOP_TOKEN_IDS in inputs:
            outputs.update(self.log_prob_bytes(tokens_batch, sequence_length, inputs[TOP_TOKEN_IDS]))
        return outputs

    def log_prob_bytes(self, tokens_batch: np.ndarray, sequence_length: np.ndarray,
                       top_token_ids: np.ndarray) -> dict[str, np.ndarray]:
        """TOKEN_BYTES [B, beams, T]: each token's bytes (part of a character at times; none past its beam's
        length), and TOP_TOKEN_BYTES, each of the likeliest tokens' beside it, in `top_token_ids`' shape: what
        names a log probability's token, as the BLS names it. Call after `__call__`, which checks the shapes."""
        if tokens_batch.ndim == 2:  # [B, T]: one beam
            tokens_batch = tokens_batch[:, None, :]
        lengths = sequence_length.reshape(tokens_batch.shape[0], tokens_batch.shape[1], 1)
        valid = np.arange(tokens_batch.shape[2]) < lengths
        token_bytes = self.token_bytes.token_bytes
        return {
            TOKEN_BYTES: np.array([token_bytes(int(token)) if keep else b""
                                   for token, keep in zip(tokens_batch.reshape(-1), valid.reshape(-1))],
                                  dtype=object).reshape(tokens_batch.shape),
            TOP_TOKEN_BYTES: np.array([token_bytes(int(token)) for token in top_token_ids.reshape(-1)],
                                      dtype=object).reshape(top_token_ids.shape),
        }
