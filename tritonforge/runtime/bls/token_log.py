"""A row's generated tokens with their log probabilities and likeliest alternatives (`num_top_log_probs`), kept
as the engine sends them and handed to the client per response: each response carries the tokens it adds.

The engine answers `output_ids`, `output_log_probs` [beams, tokens] and `top_token_ids` / `top_log_probs`
[beams, tokens, k]; the client gets `token_ids`, `token_bytes`, `token_log_probs` [tokens] and
`top_token_ids`, `top_token_bytes`, `top_log_probs` [tokens, k], each with the response's batch dimension.
Bytes, not text: a token may hold part of a character, and its bytes are what the response's text is made of.
With `return_prompt_log_probs` the log starts with the prompt's tokens, as the engine's first response scores
them (`prompt_log_probs`, NaN for the first token, and `prompt_top_*`).
"""

from __future__ import annotations

import numpy as np

from ...facts.contract import (
    MAX_TOP_LOG_PROBS,
    NUM_TOP_LOG_PROBS,
    OUTPUT_LOG_PROBS,
    PROMPT_LOG_PROBS,
    PROMPT_TOP_LOG_PROBS,
    PROMPT_TOP_TOKEN_IDS,
    RETURN_PROMPT_LOG_PROBS,
    TOKEN_BYTES,
    TOKEN_IDS,
    TOKEN_LOG_PROBS,
    TOP_LOG_PROBS,
    TOP_TOKEN_BYTES,
    TOP_TOKEN_IDS,
)
from ...facts.errors import RequestError
from ..text.detokenization import TokenBytes


def requested_top_log_probs(inputs: dict[str, np.ndarray], prompt_log_probs: bool) -> int | None:
    """The request's `num_top_log_probs` (one value for every row); None when it did not ask (0 when it asked
    only for the prompt's log probabilities, `prompt_log_probs`)."""
    value = inputs.get(NUM_TOP_LOG_PROBS)
    if value is None or value.size == 0:
        return 0 if prompt_log_probs else None
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

    def __init__(self, top: int, token_bytes: TokenBytes, prompt_ids: list[int] | None = None):
        self.top = top
        self.token_bytes = token_bytes
        self.prompt_ids = prompt_ids  # the prompt's tokens, logged first once the engine scores them
        self.ids: list[int] = []
        self.log_probs: list[float] = []
        self.top_ids: list[np.ndarray] = []  # one [k] row per token
        self.top_log_probs: list[np.ndarray] = []
        self.sent = 0  # tokens given to responses so far

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: list[int], tensors: dict[str, np.ndarray]) -> None:
        """The tokens of one engine response, with what it sent of them; the prompt's before the first."""
        if self.prompt_ids is not None:
            if PROMPT_LOG_PROBS not in tensors:
                raise RequestError(RETURN_PROMPT_LOG_PROBS, "this engine does not return the prompt's log "
                                                            "probabilities")
            self._log(self.prompt_ids, tensors[PROMPT_LOG_PROBS], tensors.get(PROMPT_TOP_TOKEN_IDS),
                      tensors.get(PROMPT_TOP_LOG_PROBS))
            self.prompt_ids = None
        log_probs = tensors.get(OUTPUT_LOG_PROBS)
        if log_probs is None:
            raise RuntimeError("the engine sent no output_log_probs (asked for num_top_log_probs)")
        self._log(ids, log_probs, tensors.get(TOP_TOKEN_IDS), tensors.get(TOP_LOG_PROBS))

    def _log(self, ids: list[int], log_probs: np.ndarray, top_ids: np.ndarray | None,
             top_log_probs: np.ndarray | None) -> None:
        count = len(ids)
        if self.top:
            if top_ids is None or top_log_probs is None:
                raise RequestError(NUM_TOP_LOG_PROBS, "this engine returns no likeliest tokens beside the chosen "
                                                      "one; ask for 0")
            self.top_ids.extend(top_ids.reshape(-1, top_ids.shape[-1])[:count, :self.top])
            self.top_log_probs.extend(top_log_probs.reshape(-1, top_log_probs.shape[-1])[:count, :self.top])
        self.log_probs.extend(log_probs.reshape(-1)[:count].tolist())
        self.ids.extend(ids)

    @property
    def unsent(self) -> bool:
        return len(self.ids) > self.sent

    def outputs(self, end: int | None = None) -> dict[str, np.ndarray]:
        """The client's tensors for the tokens past those sent, up to `end` (None: all), which then count as sent
        (the sender holding the row calls it)."""
        start, end = self.sent, len(self.ids) if end is None else end
        self.sent = end
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
