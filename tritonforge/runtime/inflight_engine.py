"""An in-flight batching engine on Hugging Face transformers: the embedded stand-in for TensorRT-LLM.

One background thread owns the model. Each iteration it
1. takes new requests and cancellations from thread-safe queues,
2. prefills each admitted request on its own (batch of one, so its first token is exactly `generate`'s) and
   copies its KV cache into a free slot of a preallocated cache (`SlotCache`),
3. runs ONE batched forward pass that decodes the next token of every slot, each row at its own position
   (per-row position ids, a 4-D attention mask over the columns each row has written),
4. processes and samples every row's logits at once with its own parameters (`SlotSampler`), copies the
   chosen tokens to the host (the step's one sync), reports them, and frees the slots of finished requests.

A request that arrives while others generate therefore joins at the next step, as in TensorRT-LLM. Joining
and leaving move no cache: a request owns its slot until it ends. The cache is bounded explicitly: at most
`max_batch_size` sequences (slots) of at most `max_seq_len` tokens run at once; the rest wait in a queue of
`max_queue_size` (0 = unbounded).

transformers' own continuous batching manager is not used: it applies one sampling configuration to the whole
batch, and this engine must serve per-request seeds, penalties, min_tokens, bad and stop words.
"""

from __future__ import annotations

import contextlib
import heapq
import inspect
import logging

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from ..spec.errors import EngineShuttingDown
from ..spec.limits import EngineLimits
from .generation import EngineStats, EngineThread, GenerationRequest, GenerationResult, check_limits
from .sampling import SlotSampler

logger = logging.getLogger(__name__)

CACHE_LENGTH_STEP = 256  # the cache's length grows by doubling from this, up to max_seq_len


class _SlotLayer(CacheLayerMixin):
    """One layer's keys and values for every slot: [slots, kv_heads, capacity, head_dim], written in place."""

    is_sliding = False

    def __init__(self, owner: SlotCache):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a SlotCache layer is filled by SlotCache.store, before any decode step")

    def allocate(self, keys: torch.Tensor, values: torch.Tensor, slots: int, capacity: int) -> None:
        self.keys = keys.new_zeros((slots, keys.shape[1], capacity, keys.shape[3]))
        self.values = values.new_zeros((slots, values.shape[1], capacity, values.shape[3]))
        self.device, self.is_initialized = keys.device, True

    def grow(self, capacity: int) -> None:
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((old.shape[0], old.shape[1], capacity, old.shape[3]))
            new[:, :, : old.shape[2]] = old
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Decode: write each row's new key and value [rows, heads, 1, dim] at that row's own position; return
        the rows' caches up to the step's longest length (views: no copy)."""
        owner = self.owner
        rows = owner.row_index  # [rows]
        self.keys[rows, :, owner.positions] = key_states[:, :, 0]
        self.values[rows, :, owner.positions] = value_states[:, :, 0]
        return self.keys[: owner.rows, :, : owner.length], self.values[: owner.rows, :, : owner.length]

    def get_mask_sizes(self, query_length, *args) -> tuple[int, int]:
        return self.owner.length, 0

    def get_seq_length(self) -> int:
        return self.owner.length - 1

    def get_max_length(self) -> int:
        return self.keys.shape[2] if self.is_initialized else -1


class SlotCache(Cache):
    """A KV cache of fixed slots, one per running sequence. A prefill's cache is copied into its slot
    (`store`); a decode step over slots [0, rows) writes each row's new entry at `positions` and attends to
    the first `length` columns, with a mask that hides each row's columns past its own length (`prepare`).
    A finished sequence just leaves its slot; what it wrote is never read again (the next sequence writes
    its own columns before its mask shows them)."""

    def __init__(self, num_layers: int, slots: int, max_len: int):
        super().__init__(layers=[_SlotLayer(self) for _ in range(num_layers)])
        self.slots, self.max_len = slots, max_len
        self.rows, self.length = 0, 0
        self.positions = self.row_index = None

    def store(self, slot: int, cache: DynamicCache) -> None:
        """Copy a prefilled batch-of-one DynamicCache into `slot`."""
        length = cache.layers[0].keys.shape[2]
        for layer, source in zip(self.layers, cache.layers, strict=True):
            if not layer.is_initialized:
                layer.allocate(source.keys, source.values, self.slots, min(self.max_len, CACHE_LENGTH_STEP))
            self.reserve(length)
            layer.keys[slot, :, :length] = source.keys[0]
            layer.values[slot, :, :length] = source.values[0]

    def reserve(self, length: int) -> None:
        """Room for `length` columns: grow by doubling (rarely; each growth copies the cache once)."""
        capacity = self.layers[0].keys.shape[2]
        if length <= capacity:
            return
        while capacity < length:
            capacity *= 2
        for layer in self.layers:
            layer.grow(min(capacity, self.max_len))

    def prepare(self, rows: int, positions: torch.Tensor, length: int) -> None:
        """The next decode step covers slots [0, rows), row r writing at positions[r], reading `length`
        columns."""
        self.reserve(length)
        self.rows, self.positions, self.length = rows, positions, length
        self.row_index = torch.arange(rows, device=positions.device)


def check_cache_layers(model) -> None:
    """Refuse models whose cache is not one full-attention layer list (sliding windows, linear attention):
    the slot cache holds every position of every layer."""
    cache = DynamicCache(config=model.config)
    if cache.layers and not all(type(layer) is DynamicLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise ValueError(f"the transformers engine runs models whose layers all use full attention; "
                         f"{model.config.model_type} has cache layers {kinds}")


class _Sequence:
    """A running request and its state."""

    __slots__ = ("request", "slot", "tokens", "generated", "log_probs", "finish_reason")

    def __init__(self, request: GenerationRequest, slot: int):
        self.request = request
        self.slot = slot
        self.tokens = list(request.prompt_ids)
        self.generated: list[int] = []
        self.log_probs: list[float] = []
        self.finish_reason: str | None = None


class _Features:
    """How many running sequences use each optional sampling step: a step skips the ops nobody uses."""

    def __init__(self):
        self.sampling = self.top_k = self.top_p = self.penalised = self.biased = self.log_probs = 0

    def add(self, request: GenerationRequest, sign: int) -> None:
        params = request.sampling
        sampling = not params.greedy
        self.sampling += sign * sampling
        self.top_k += sign * (sampling and params.top_k > 1)
        self.top_p += sign * (sampling and params.top_p < 1)
        self.penalised += sign * params.penalised
        self.biased += sign * (request.embedding_bias is not None)
        self.log_probs += sign * request.return_log_probs


class InflightBatchingEngine(EngineThread):
    def __init__(self, model, limits: EngineLimits):
        super().__init__("inflight-engine")
        check_cache_layers(model)
        self.model = model
        self.limits = limits
        self.device = next(model.parameters()).device
        slots = limits.max_batch_size or 1
        self._slots: list[_Sequence | None] = [None] * slots
        self._free = list(range(slots))  # a heap: the lowest free slot first keeps the decoded rows few
        self._lengths = [0] * slots  # tokens in each slot's cache
        self._features = _Features()
        self._cache = SlotCache(model.config.num_hidden_layers, slots, limits.max_seq_len)
        self._sampler = SlotSampler(slots, model.config.vocab_size, self.device)
        forward = inspect.signature(model.forward).parameters
        # transformers 5.x renames `past_key_values` to `cache` (the old name warns on every call)
        self._cache_argument = "cache" if "cache" in forward else "past_key_values"
        self._keep_last_logits = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}
        self._thread.start()

    # ---- client side (any thread) -------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise RequestError for a request this engine must refuse; called before `submit`."""
        check_limits(request, self.limits, vocab_size=self.model.config.vocab_size, pending=self.pending())

    # ---- engine thread ------------------------------------------------------------------------------------

    def _running(self) -> list[_Sequence]:
        return [sequence for sequence in self._slots if sequence is not None]

    def _loop(self) -> None:
        with torch.inference_mode(), _attention_backends(self.device):
            while not self._stopping.is_set():
                if not self._running() and self._idle():
                    self._wait_for_work()
                    continue
                try:
                    self._iteration()
                except Exception as error:  # noqa: BLE001 - a broken step must end its requests, not the thread
                    logger.exception("engine step failed")
                    for sequence in self._running():
                        sequence.request.sink.finish(None, error)
                        self._release(sequence)
        self._take_new()  # answers the stops and moves the last requests to _waiting, which ends them below
        for sequence in self._running():
            sequence.request.sink.finish(None, EngineShuttingDown())
        for request in self._waiting:
            request.sink.finish(None, EngineShuttingDown())

    def _iteration(self) -> None:
        self._apply_cancellations(self._take_new())
        prefilled = 0
        while self._waiting and self._free:
            request = self._waiting.pop(0)
            if request.sink.cancelled():
                request.sink.finish(GenerationResult([], [], "cancelled"), None)
                continue
            self._prefill(request)
            prefilled += 1
            # A prefill is a forward pass over a whole prompt: stops (the liveness probe's too) and cancels wait
            # for one of them, not for every prefill of the iteration.
            self._apply_cancellations(self._take_new())
        if self._running():
            self._decode_step()
        running = self._running()
        self.stats = EngineStats(waiting=self.pending(), scheduled=len(running), context=prefilled,
                                 kv_tokens=sum(len(sequence.tokens) for sequence in running))

    def _apply_cancellations(self, ids: set[str]) -> None:
        if ids:
            for sequence in self._running():
                if sequence.finish_reason is None and sequence.request.request_id in ids:
                    sequence.finish_reason = "cancelled"
            for request in [r for r in self._waiting if r.request_id in ids]:
                self._waiting.remove(request)
                request.sink.finish(GenerationResult([], [], "cancelled"), None)
        self._retire_finished()

    def _prefill(self, request: GenerationRequest) -> None:
        request.sink.scheduled()
        slot = heapq.heappop(self._free)
        sequence = _Sequence(request, slot)
        self._slots[slot] = sequence
        self._features.add(request, +1)
        self._sampler.admit(slot, request.sampling, request.prompt_ids, request.embedding_bias)
        input_ids = torch.tensor([request.prompt_ids], device=self.device)
        cache = DynamicCache(config=self.model.config)
        output = self.model(input_ids=input_ids, use_cache=True, **{self._cache_argument: cache},
                            **self._keep_last_logits)
        self._cache.store(slot, cache)
        self._lengths[slot] = len(request.prompt_ids)
        steps = torch.zeros(1, dtype=torch.long, device=self.device)
        self._sample([sequence], output.logits[:, -1], slice(slot, slot + 1), steps, request_features(request))
        self._retire_finished()

    def _decode_step(self) -> None:
        rows = max(sequence.slot for sequence in self._running()) + 1
        sequences = self._slots[:rows]
        lengths = self._lengths[:rows]
        # One copy to the device: each row's last token, its position (= its cache length) and its step.
        # A free slot inside [0, rows) decodes a dummy token at position 0 of its own (unused) cache.
        host = torch.tensor([[s.tokens[-1] if s else 0 for s in sequences], lengths,
                             [len(s.generated) if s else 0 for s in sequences]], dtype=torch.long)
        host = host.to(self.device, non_blocking=True)
        input_ids, positions, steps = host[0, :, None], host[1], host[2]  # [rows, 1], [rows], [rows]
        length = max(lengths) + 1
        columns = torch.arange(length, device=self.device)
        visible = columns[None, :] <= positions[:, None]  # [rows, length]: the row's cache and its new token
        dtype = self.model.dtype
        mask = torch.zeros(visible.shape, dtype=dtype, device=self.device).masked_fill_(
            ~visible, torch.finfo(dtype).min)[:, None, None, :]  # [rows, 1, 1, length], additive
        self._cache.prepare(rows, positions, length)
        output = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions[:, None],
                            use_cache=True, **{self._cache_argument: self._cache})
        for sequence in sequences:
            if sequence is not None:
                self._lengths[sequence.slot] += 1
        self._sample(sequences, output.logits[:, -1], slice(0, rows), steps, self._features)
        self._retire_finished()

    def _sample(self, sequences: list[_Sequence | None], logits: torch.Tensor, rows: slice, steps: torch.Tensor,
                features: _Features) -> None:
        """Choose, record and report the next token of every sequence from its row of logits [rows, vocab]."""
        banned: list[tuple[int, int]] = []
        live = []
        for row, sequence in enumerate(sequences):
            if sequence is None or sequence.finish_reason is not None:
                continue
            request = sequence.request
            if request.sink.cancelled():
                sequence.finish_reason = "cancelled"
                continue
            live.append((row, sequence))
            if request.end_id is not None and len(sequence.generated) < request.sampling.min_tokens:
                banned.append((row, request.end_id))
            if request.bad_sequences:
                banned.extend((row, token) for token in _banned_tokens(sequence.tokens, request.bad_sequences))
        if not live:
            return
        vocab = logits.shape[-1]
        banned = [(row, token) for row, token in banned if 0 <= token < vocab]
        logits = self._sampler.process(logits.float(), rows, biased=bool(features.biased),
                                       penalised=bool(features.penalised), banned=banned)
        tokens = self._sampler.choose(logits, rows, steps, sampling=bool(features.sampling),
                                      top_k=bool(features.top_k), top_p=bool(features.top_p))
        if features.penalised:
            self._sampler.record(rows, tokens)
        if features.log_probs:
            log_probs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
            chosen, chosen_log_probs = torch.stack((tokens.double(), log_probs.double())).tolist()  # the sync
            chosen = [int(token) for token in chosen]
        else:
            chosen, chosen_log_probs = tokens.tolist(), None  # the sync
        for row, sequence in live:
            log_prob = chosen_log_probs[row] if sequence.request.return_log_probs else 0.0
            self._accept(sequence, chosen[row], log_prob)

    def _accept(self, sequence: _Sequence, token: int, log_prob: float) -> None:
        request = sequence.request
        if request.end_id is not None and token == request.end_id:
            sequence.finish_reason = "end_id"
            return
        sequence.tokens.append(token)
        sequence.generated.append(token)
        sequence.log_probs.append(log_prob)
        if request.stop_sequences and _ends_with_any(sequence.tokens, request.stop_sequences):
            sequence.finish_reason = "stop_words"
        elif len(sequence.generated) >= request.max_new_tokens:
            sequence.finish_reason = "length"
        elif request.stream:  # a token that ends the request goes out with `finish`, flagged final
            request.sink.tokens([token], [log_prob])

    def _retire_finished(self) -> None:
        for sequence in self._slots:
            if sequence is not None and sequence.finish_reason is not None:
                self._release(sequence)
                sequence.request.sink.finish(
                    GenerationResult(sequence.generated, sequence.log_probs, sequence.finish_reason), None)

    def _release(self, sequence: _Sequence) -> None:
        """Free the sequence's slot: nothing moves on the device."""
        self._slots[sequence.slot] = None
        self._lengths[sequence.slot] = 0
        self._features.add(sequence.request, -1)
        heapq.heappush(self._free, sequence.slot)


def _attention_backends(device: torch.device):
    """On CUDA, SDPA without its cuDNN backend, which builds an execution plan for each new shape: the decode
    step's shape changes with its length and row count, and a first H200 run crawled (11 tokens/s at one
    stream) with cuDNN attention in its profile."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def request_features(request: GenerationRequest) -> _Features:
    features = _Features()
    features.add(request, +1)
    return features


def _ends_with_any(tokens: list[int], sequences: list[list[int]]) -> bool:
    return any(len(tokens) >= len(s) and tokens[-len(s):] == s for s in sequences if s)


def _banned_tokens(tokens: list[int], sequences: list[list[int]]) -> list[int]:
    """The last token of every bad sequence whose other tokens end the text so far."""
    banned = []
    for sequence in sequences:
        if sequence and (len(sequence) == 1 or tokens[-(len(sequence) - 1):] == sequence[:-1]):
            banned.append(sequence[-1])
    return banned
