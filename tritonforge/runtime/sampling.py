"""Sampling parameters of one request: validation, and the logits processing of one decoding step.

Semantics follow TensorRT-LLM so that both engines answer a request alike:
- decoding is greedy unless the request asks for sampling with ``top_k > 1`` or ``0 < top_p < 1``;
  ``temperature`` then scales the logits (``temperature == 0`` forces greedy);
- ``repetition_penalty`` divides positive / multiplies negative logits of every token seen (prompt included);
- ``presence_penalty`` and ``frequency_penalty`` subtract from the logits of generated tokens, once and per
  occurrence; ``min_tokens`` masks the end id until that many tokens exist.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..spec.errors import RequestError

if TYPE_CHECKING:  # torch is imported where logits are touched: request validation runs without it
    import torch

MAX_SEED = 2**64 - 1


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    seed: int | None = None

    def __post_init__(self):
        for name in ("temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise RequestError(name, f"must be a finite number, got {getattr(self, name)}")
        if self.temperature < 0:
            raise RequestError("temperature", f"must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise RequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise RequestError("top_k", f"must be >= 0, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise RequestError("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        if self.min_tokens < 0:
            raise RequestError("min_tokens", f"must be >= 0, got {self.min_tokens}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise RequestError("seed", f"must be in [0, 2^64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or not (self.top_k > 1 or self.top_p < 1)

    def make_generator(self, device: torch.device) -> torch.Generator | None:
        import torch

        if self.greedy:
            return None
        generator = torch.Generator(device=device)
        # torch seeds are signed 64-bit: fold the uint64 seed into that range.
        seed = self.seed if self.seed is not None else secrets.randbits(63)
        generator.manual_seed(seed % (2**63))
        return generator


def apply_penalties(logits: torch.Tensor, params: SamplingParams, seen: list[int], generated: list[int],
                    end_id: int | None) -> torch.Tensor:
    """Penalties and min_tokens on one row of logits [vocab]. Returns a new tensor when it changes anything."""
    import torch

    if params.repetition_penalty != 1.0 and seen:
        index = torch.tensor(sorted(set(seen)), device=logits.device)
        values = logits[index]
        logits = logits.clone()
        logits[index] = torch.where(values > 0, values / params.repetition_penalty,
                                    values * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and generated:
        counts = torch.bincount(torch.tensor(generated, device=logits.device), minlength=logits.shape[-1])
        counts = counts[: logits.shape[-1]].to(logits.dtype)
        logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(logits.dtype)
    if end_id is not None and len(generated) < params.min_tokens and 0 <= end_id < logits.shape[-1]:
        logits = logits.clone()
        logits[end_id] = -math.inf
    return logits


def choose_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Greedy or sampled next token from one row of processed logits [vocab]."""
    import torch

    if params.greedy or generator is None:
        return int(torch.argmax(logits))
    scores = logits / params.temperature
    if params.top_k > 1:
        kth = torch.topk(scores, min(params.top_k, scores.shape[-1])).values[-1]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if params.top_p < 1:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) >= params.top_p
        scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, -math.inf))
    probs = torch.softmax(scores.float(), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
