"""A row's generated tokens with their log probabilities and likeliest alternatives (`num_top_log_probs`), kept
as the engine sends them and handed to the client per response: each response carries the tokens it adds.

The engine answers `output_ids`, `output_log_probs` [beams, tokens] and `top_token_ids` / `top_log_probs`
[beams, tokens, k]; the client gets `token_ids`, `token_bytes`, `token_log_probs` [tokens] and
`top_token_ids`, `top_token_bytes`, `top_log_probs` [tokens, k], each with the response's batch dimension.
Bytes, not text: a token may hold part of a character, and its bytes are what the response's text is made of.
"""

from __future__ import annotations

import numpy as np

from ...facts.contract import (
    MAX_TOP_LOG_PROBS,
    NUM_TOP_LOG_PROBS,
    OUTPUT_LOG_PROBS,
    TOKEN_BYTES,
    TOKEN_IDS,
    TOKEN_LOG_PROBS,
    TOP_LOG_PROBS,
    TOP_TOKEN_BYTES,
    TOP_TOKEN_IDS,
)
from ...facts.errors import RequestError
from ..text.detokenization import TokenBytes


def requested_top_log_probs(inputs: dict[str, np.ndarray]) -> int | None:
    """The request's `num_top_log_probs` (one value for every row); None when it did not ask."""
    value = inputs.get(NUM_TOP_LOG_PROBS)
    if value is None or value.size == 0:
        return None
    values = {int(item) for item in np.asarray(value).reshape(-1)}
    if len(values) != 1:
        raise RequestError(NUM_TOP_LOG_PROBS, f"must be one value for every row, got {sorted(values)}")
    (count,) = values
    if not 0 <= count <= MAX_TOP_LOG_PROBS:
        raise RequestError(NUM_TOP_LOG_PROBS, f"must be in [0, {MAX_TOP_LOG_PROBS}], got {count}")
    return count


class TokenLog:
    """The row's tokens so far (appended by the engine stream's reader; a sender reads the part before a mark it
    was handed, which no later append moves)."""

    def __init__(self, top: int, token_bytes: TokenBytes):
        self.top = top
        self.token_bytes = token_bytes
        self.ids: list[int] = []
        self.log_probs: list[float] = []
        self.top_ids: list[np.ndarray] = []  # one [k] row per token
        self.top_log_probs: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: list[int], tensors: dict[str, np.ndarray]) -> None:
        """The tokens of one engine response, with what it sent of them."""
        count = len(ids)
        log_probs = tensors.get(OUTPUT_LOG_PROBS)
        if log_probs is None:
            raise RuntimeError("the engine sent no output_log_probs (asked for num_top_log_probs)")
        if self.top:
            top_ids, top_log_probs = tensors.get(TOP_TOKEN_IDS), tensors.get(TOP_LOG_PROBS)
            if top_ids is None or top_log_probs is None:
                raise RequestError(NUM_TOP_LOG_PROBS, "this engine returns no likeliest tokens beside the chosen "
                                                      "one; ask for 0")
            self.top_ids.extend(top_ids.reshape(-1, top_ids.shape[-1])[:count, :self.top])
            self.top_log_probs.extend(top_log_probs.reshape(-1, top_log_probs.shape[-1])[:count, :self.top])
        self.log_probs.extend(log_probs.reshape(-1)[:count].tolist())
        self.ids.extend(ids)

    def outputs(self, start: int, end: int) -> dict[str, np.ndarray]:
        """The client's tensors for tokens [start, end)."""
        ids = self.ids[start:end]
        table = self.token_bytes
        top_ids = np.array(self.top_ids[start:end], dtype=np.int32).reshape(len(ids), self.top)
        top_bytes = np.array([table.token_bytes(int(token)) for token in top_ids.reshape(-1)],
                             dtype=object).reshape(1, len(ids), self.top)
        return {
            TOKEN_IDS: np.array([ids], dtype=np.int32).reshape(1, len(ids)),
            TOKEN_BYTES: np.array([table.token_bytes(token) for token in ids], dtype=object).reshape(1, len(ids)),
            TOKEN_LOG_PROBS: np.array(self.log_probs[start:end], dtype=np.float32).reshape(1, len(ids)),
            TOP_TOKEN_IDS: top_ids.reshape(1, len(ids), self.top),
            TOP_TOKEN_BYTES: top_bytes,
            TOP_LOG_PROBS: np.array(self.top_log_probs[start:end], dtype=np.float32).reshape(1, len(ids), self.top),
        }
