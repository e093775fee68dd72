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

from ...facts.contract import POST_SEQUENCE_LENGTH
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
