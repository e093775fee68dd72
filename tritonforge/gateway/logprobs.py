"""Log probabilities as OpenAI writes them: each generated token named by its text, with its log probability
and the likeliest tokens at its step.

The BLS answers them per response (`num_top_log_probs`: `token_bytes`, `token_log_probs`, `top_token_bytes`,
`top_log_probs`), and so does the ensemble, with the engine's `output_log_probs` (NVIDIA's name, with
`return_log_probs`) in place of `token_log_probs`; `read_token_log_probs` turns one response's into
`TokenLogProb`s, and the builders below write a
chat choice's `logprobs` (`{"content": [...]}`, each token with its UTF-8 `bytes`) or a completion choice's
(`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`). A token holding part of a character is named by
its bytes decoded with U+FFFD for the part; its `bytes` are exact, and a client joins them to rebuild the text.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..facts.contract import BLS_MODEL, OUTPUT_LOG_PROBS, TOKEN_BYTES, TOKEN_LOG_PROBS, TOP_LOG_PROBS, TOP_TOKEN_BYTES

# JSON has no -inf: a token the model gives no chance (a grammar banned it) is written with OpenAI's floor.
LOWEST_LOG_PROB = -9999.0


def token_log_probs_output(model: str) -> str:
    """The output that holds each token's log probability: the BLS's own, or the engine's through the ensemble."""
    return TOKEN_LOG_PROBS if model == BLS_MODEL else OUTPUT_LOG_PROBS


def log_prob_outputs(model: str) -> tuple[str, ...]:
    """What the gateway reads of `model`'s response to a request with log probabilities, beside text and counts."""
    return TOKEN_BYTES, token_log_probs_output(model), TOP_TOKEN_BYTES, TOP_LOG_PROBS


class TokenLogProb(NamedTuple):
    """One generated token: its bytes, its log probability, and the likeliest (bytes, log prob) at its step."""

    token: bytes
    log_prob: float
    top: list[tuple[bytes, float]]


def read_token_log_probs(as_numpy: Callable[[str], np.ndarray | None],
                         log_probs_output: str = TOKEN_LOG_PROBS) -> list[TokenLogProb]:
    """The tokens one response adds, with their log probabilities (none: a response without tokens);
    `as_numpy`: the response's output by name (tritonclient's `InferResult.as_numpy`); `log_probs_output`: the
    one with the tokens' log probabilities (`token_log_probs_output`)."""
    tokens = as_numpy(TOKEN_BYTES)
    if tokens is None:
        return []
    tokens = tokens.reshape(-1)
    log_probs = as_numpy(log_probs_output).reshape(-1)
    top_bytes, top_log_probs = as_numpy(TOP_TOKEN_BYTES), as_numpy(TOP_LOG_PROBS)
    read = []
    for index, token in enumerate(tokens):
        top = []
        if top_bytes is not None and top_bytes.size:
            top = [(bytes(alternative), float(value))
                   for alternative, value in zip(top_bytes.reshape(len(tokens), -1)[index],
                                                 top_log_probs.reshape(len(tokens), -1)[index])
                   if value > -math.inf]
        read.append(TokenLogProb(bytes(token), float(log_probs[index]), top))
    return read


def token_text(token: bytes) -> str:
    return token.decode("utf-8", errors="replace")


def _finite(value: float) -> float | None:
    """A log probability for JSON: None for a token nothing predicts (an echoed prompt's first)."""
    if math.isnan(value):
        return None
    return value if value > -math.inf else LOWEST_LOG_PROB


def chat_logprobs(tokens: list[TokenLogProb]) -> dict:
    """A chat choice's (or chunk's) `logprobs`."""
    return {"content": [{"token": token_text(entry.token), "logprob": _finite(entry.log_prob),
                         "bytes": list(entry.token),
                         "top_logprobs": [{"token": token_text(token), "logprob": _finite(value),
                                           "bytes": list(token)} for token, value in entry.top]}
                        for entry in tokens],
            "refusal": None}


def completion_logprobs(tokens: list[TokenLogProb], offset: int = 0) -> dict:
    """A completion choice's (or chunk's) `logprobs`; `offset`: the characters of the choice's text before the
    first token, where `text_offset` counts from."""
    offsets = []
    for entry in tokens:
        offsets.append(offset)
        offset += len(token_text(entry.token))
    return {"tokens": [token_text(entry.token) for entry in tokens],
            "token_logprobs": [_finite(entry.log_prob) for entry in tokens],
            "top_logprobs": [None if math.isnan(entry.log_prob) else
                             {token_text(token): _finite(value) for token, value in entry.top} for entry in tokens],
            "text_offset": offsets}


def choice_logprobs(kind_is_chat: bool, tokens: list[TokenLogProb], offset: int = 0) -> dict:
    return chat_logprobs(tokens) if kind_is_chat else completion_logprobs(tokens, offset)
