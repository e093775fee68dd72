"""The postprocessing model's logic: token ids in, the exact UTF-8 bytes of their text out.

Stateless by design: each call decodes the tokens it is given with the byte table of
`tritonforge.detokenization`, so any number of instances can decode the chunks of one stream and the chunks
still concatenate to the full text, byte for byte. A streamed chunk may end inside a multi-byte character;
the next chunk carries the rest (see the README, "Streaming text").
"""

from __future__ import annotations

import numpy as np

from .detokenization import TokenBytes
from .errors import RequestError
from .tokenization import load_tokenizer


class Postprocessor:
    def __init__(self, tokenizer_dir: str):
        self.token_bytes = TokenBytes(load_tokenizer(tokenizer_dir))

    def __call__(self, tokens_batch: np.ndarray, sequence_length: np.ndarray) -> np.ndarray:
        """TOKENS_BATCH [B, beams, T] and SEQUENCE_LENGTH [B, beams] → OUTPUT [B, beams] of bytes."""
        if tokens_batch.ndim == 2:  # [B, T]: one beam
            tokens_batch = tokens_batch[:, None, :]
        sequence_length = sequence_length.reshape(tokens_batch.shape[0], -1)
        if sequence_length.shape[1] != tokens_batch.shape[1]:
            raise RequestError("SEQUENCE_LENGTH", f"has {sequence_length.shape[1]} beams, TOKENS_BATCH has "
                                                  f"{tokens_batch.shape[1]}")
        out = np.empty(sequence_length.shape, dtype=object)
        for row in range(tokens_batch.shape[0]):
            for beam in range(tokens_batch.shape[1]):
                length = int(sequence_length[row, beam])
                ids = tokens_batch[row, beam, : max(length, 0)].tolist()
                out[row, beam] = self.token_bytes.decode_sequence(ids)
        return out
