"""Sampling parameters of one request (validation), and the logits processing of one decoding step for a
whole batch at once, each row with its own parameters (`SlotSampler`).

Semantics follow TensorRT-LLM so that both engines answer a request alike:
- decoding is greedy unless the request asks for sampling with ``top_k > 1`` or ``0 < top_p < 1``;
  ``temperature`` then scales the logits (``temperature == 0`` forces greedy);
- ``repetition_penalty`` divides positive / multiplies negative logits of every token seen (prompt included);
- ``presence_penalty`` and ``frequency_penalty`` subtract from the logits of generated tokens, once and per
  occurrence; ``min_tokens`` masks the end id until that many tokens exist.

A seed picks a noise stream: the draw for a row's n-th token depends only on (seed, n, the processed
logits), not on the other rows of the batch nor on the device's random state. The same seed, prompt and
parameters therefore give the same tokens whenever the logits are the same; a batch's composition changes
the logits only by the rounding of batched kernels (none on the tests' CPU float32, rarely a token on GPU
bf16). Without a seed a request draws a random one.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...facts.errors import RequestError

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

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or bool(self.presence_penalty) or bool(self.frequency_penalty)

    def resolved_seed(self) -> int:
        """The request's seed, or a random one: a request without a seed still samples reproducibly within
        itself, from one counter-based noise stream (`gumbel_noise`)."""
        return self.seed if self.seed is not None else secrets.randbits(64)


# Columns of `SlotSampler.table`, one row per slot (float64: the 32-bit seed halves and top_k are exact).
_GREEDY, _TEMPERATURE, _TOP_K, _TOP_P, _REPETITION, _PRESENCE, _FREQUENCY, _SEED_LO, _SEED_HI = range(9)
_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) on int64 tensors holding values in [0, 2^32).
    Multipliers stay below 2^31 so that no product leaves int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x6A09E667) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seed_lo: torch.Tensor, seed_hi: torch.Tensor, step: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel noise [rows, vocab] that is a pure function of (seed, step, token id): counter-based, so a
    row's noise is the same whatever else runs in the batch, and one batched op serves every row.
    argmax(scores + noise) samples from softmax(scores) (the Gumbel-max trick)."""
    import torch

    key = _mix32(seed_lo ^ _mix32(seed_hi ^ _mix32(step & _MASK32)))  # [rows]
    token = _mix32(torch.arange(vocab, device=step.device) + 0x9E3779B9)  # [vocab]
    bits = _mix32(_mix32(key[:, None] ^ token[None, :]) ^ _mix32(key ^ 0x5BD1E995)[:, None])  # [rows, vocab]
    return -torch.log(-torch.log(uniform_from_bits(bits)))


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """32 random bits → a float32 uniform strictly inside (0, 1). 23 bits: (n + 0.5) / 2^23 is exact in float32.
    With 24 the largest rounded to 1.0, whose Gumbel noise is +inf: that token won whatever its score, even a
    masked one's (NaN)."""
    import torch

    return ((bits >> 9).to(torch.float32) + 0.5) * 2.0**-23


class SlotSampler:
    """The sampling parameters and penalty state of every slot of a batch, as tensors on the model's device,
    so that one step processes and samples all rows with a handful of batched ops and no host sync.

    `rows` below selects the slots of the logits' rows: a slice for the contiguous slots of a decode step,
    a tensor of slot indices for the requests prefilled together. Every op has a shape fixed by the rows and
    the vocabulary and none syncs with the host, so that a decode step can be captured as a CUDA graph.
    Per slot: its parameters (`table`); the tokens it has seen, prompt included (`seen`, for
    repetition_penalty); the counts of tokens it generated (`counts`, for presence and frequency
    penalties); its embedding bias (`bias`). The last three exist once a request needs them;
    rows that do not use them hold neutral values (penalty 1 or 0, bias 0), which change no logit.
    """

    def __init__(self, slots: int, vocab_size: int, device: torch.device):
        import torch

        self.vocab_size = vocab_size
        self.device = device
        self.table = torch.zeros((slots, 9), dtype=torch.float64, device=device)
        # Slots never admitted hold greedy, neutral values: a step that decodes them (a dummy row of a
        # captured step) stays finite.
        self.table[:, [_GREEDY, _TEMPERATURE, _TOP_P, _REPETITION]] = 1.0
        self.seen: torch.Tensor | None = None  # [slots, vocab] bool
        self.counts: torch.Tensor | None = None  # [slots, vocab] float32
        self.bias: torch.Tensor | None = None  # [slots, vocab] float32

    def admit(self, slot: int, params: SamplingParams, prompt_ids: list[int], bias) -> None:
        import torch

        greedy = params.greedy
        seed = params.resolved_seed() if not greedy else 0
        # Greedy rows keep neutral sampling values, so the batched sampling math stays finite on them.
        self.table[slot] = torch.tensor([
            float(greedy), 1.0 if greedy else params.temperature, 0 if greedy else params.top_k,
            1.0 if greedy else params.top_p, params.repetition_penalty, params.presence_penalty,
            params.frequency_penalty, seed & _MASK32, seed >> 32], dtype=torch.float64).to(self.device)
        if params.penalised:
            if self.seen is None:
                self.seen = torch.zeros((self.table.shape[0], self.vocab_size), dtype=torch.bool, device=self.device)
                self.counts = torch.zeros((self.table.shape[0], self.vocab_size), dtype=torch.float32,
                                          device=self.device)
            self.seen[slot] = False
            self.seen[slot, torch.tensor(prompt_ids, device=self.device)] = True
            self.counts[slot] = 0
        if bias is not None and self.bias is None:
            self.bias = torch.zeros((self.table.shape[0], self.vocab_size), dtype=torch.float32, device=self.device)
        if self.bias is not None:
            self.bias[slot] = 0
            if bias is not None:
                row = torch.as_tensor(bias[: self.vocab_size], dtype=torch.float32)
                self.bias[slot, : row.shape[0]] = row.to(self.device)

    def process(self, logits: torch.Tensor, rows, *, biased: bool, penalised: bool,
                banned: list[tuple[int, int]], ban: torch.Tensor | None = None) -> torch.Tensor:
        """Embedding bias, penalties, then -inf for the banned (row, token) pairs (min_tokens' end id, bad
        words), on logits [rows, vocab] float32. Returns the processed logits. `ban`, a [rows, vocab] bool
        mask, is the fixed-shape form of `banned` that a captured step reads."""
        import torch

        if biased and self.bias is not None:
            logits = logits + self.bias[rows]
        if penalised and self.seen is not None:
            table = self.table[rows]
            repetition = table[:, _REPETITION, None].float()
            penalty = torch.where(logits > 0, logits / repetition, logits * repetition)
            logits = torch.where(self.seen[rows], penalty, logits)
            counts = self.counts[rows]
            logits = (logits - table[:, _FREQUENCY, None].float() * counts
                      - table[:, _PRESENCE, None].float() * (counts > 0).float())
        if banned:
            index = torch.tensor(banned, device=logits.device)  # [n, 2]: row, token
            logits = logits.index_put((index[:, 0], index[:, 1]), torch.tensor(-math.inf, device=logits.device))
        if ban is not None:
            logits = logits.masked_fill(ban, -math.inf)
        return logits

    def choose(self, logits: torch.Tensor, rows, steps: torch.Tensor, *, sampling: bool, top_k: bool,
               top_p: bool) -> torch.Tensor:
        """The next token of every row [rows] from processed logits [rows, vocab]: argmax for greedy rows;
        otherwise a draw from softmax(`scores`) with the noise of (seed, step). The flags say whether any row
        samples, or uses top-k or top-p: without them those ops are skipped."""
        import torch

        greedy = torch.argmax(logits, dim=-1)
        if not sampling:
            return greedy
        table = self.table[rows]
        scores = self.scores(logits, rows, top_k=top_k, top_p=top_p)
        noise = gumbel_noise(table[:, _SEED_LO].long(), table[:, _SEED_HI].long(), steps, scores.shape[-1])
        # A token masked out (-inf) stays out whatever its noise.
        sampled = torch.argmax(torch.where(torch.isneginf(scores), scores, scores + noise), dim=-1)
        return torch.where(table[:, _GREEDY] > 0, greedy, sampled)

    def scores(self, logits: torch.Tensor, rows, *, top_k: bool, top_p: bool) -> torch.Tensor:
        """What sampling rows draw from, softmax of: logits / temperature, -inf outside top-k and top-p."""
        import torch

        table = self.table[rows]
        scores = logits / table[:, _TEMPERATURE, None].float()
        if not (top_k or top_p):
            return scores
        vocab = scores.shape[-1]
        ordered, order = torch.sort(scores, dim=-1, descending=True)
        if top_k:
            k = table[:, _TOP_K].long()
            k = torch.where(k > 1, k.clamp(max=vocab), vocab)  # top_k <= 1 keeps every token
            kth = ordered.gather(1, (k - 1)[:, None])
            scores = scores.masked_fill(scores < kth, -math.inf)
            ordered = ordered.masked_fill(ordered < kth, -math.inf)
        if top_p:
            limit = table[:, _TOP_P, None].float()
            probs = torch.softmax(ordered, dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = (probs.cumsum(dim=-1) - probs >= limit) & (limit < 1)
            scores = scores.scatter(1, order, ordered.masked_fill(drop, -math.inf))
        return scores

    def record(self, rows, tokens: torch.Tensor) -> None:
        """Count the chosen tokens [rows] into the penalty state, in place (on the device: no sync). `rows`,
        a slice, gives views, which the scatters write through; a tensor of slots, an indexed write."""
        import torch

        if self.seen is None:
            return
        if not isinstance(rows, slice):
            self.seen.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.bool))
            self.counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=self.counts.dtype), accumulate=True)
            return
        index = tokens[:, None]
        seen, counts = self.seen[rows], self.counts[rows]
        seen.scatter_(1, index, True)
        counts.scatter_add_(1, index, torch.ones_like(index, dtype=counts.dtype))
