"""An in-flight batching engine on Hugging Face transformers: the embedded stand-in for TensorRT-LLM.

One background thread owns the model. Each iteration it
1. takes new requests and cancellations from thread-safe queues,
2. prefills the admitted requests together (one forward pass over their prompts, right-padded to the longest;
   a request admitted alone runs as a batch of one, exactly as `generate`) and copies each one's KV cache
   into a free slot of a preallocated cache (`SlotCache`),
3. runs ONE batched forward pass that decodes the next token of every slot, each row at its own position
   (per-row position ids, a 4-D attention mask over the columns each row has written); on CUDA that step
   is replayed as a CUDA graph (decode_graphs.py),
4. processes and samples every row's logits at once with its own parameters (`SlotSampler`), masks the tokens
   a guided row's grammar forbids (grammar.py), copies the chosen tokens to the host (the step's one sync),
   reports them, and frees the slots of finished requests.

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
import math
import os
from typing import NamedTuple, Protocol

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from ....facts.contract import GUIDED_DECODING_GUIDE_TYPE, LORA_TASK_ID, MAX_TOP_LOG_PROBS
from ....facts.errors import EngineShuttingDown, RequestError, UnsupportedError
from ....facts.limits import EngineLimits
from ..generation import EngineStats, EngineThread, GenerationRequest, GenerationResult, TopTokens, check_limits
from ..sampling import SlotSampler
from .decode_graphs import DecodeGraphs, StaticInputs, graph_bucket
from .grammar import GrammarMasks, Grammars
from .lora_layers import AdapterBank
from .slot_attention import use_slot_attention

logger = logging.getLogger(__name__)

CACHE_LENGTH_STEP = 256  # the cache's length grows by doubling from this, up to max_seq_len
PREFILL_TOKENS = 8192  # the requests prefilled together: at most this many tokens, padding included (or one)
CUDA_GRAPHS_ENV = "TRITONFORGE_CUDA_GRAPHS"  # "0": decode steps run eagerly on CUDA too
# With graphed decode steps an eager prefill costs as much as many steps. Asked for (`admission_wait_steps`),
# admissions wait while sequences run until they fill an eighth of the slots (or the free ones), or for at
# most that many decode steps: fewer prefills, at the price of a later first token. Off by default: a request
# joins at the next step, as in TensorRT-LLM.
GATHERED_ADMISSION_STEPS = 8  # what bench/engine_gpu.py measures beside the default


class _SlotLayer(CacheLayerMixin):
    """One layer's keys and values for every slot: [slots, kv_heads, capacity, head_dim], written in place."""

    is_sliding = False

    def __init__(self, owner: SlotCache):
        super().__init__()
        self.owner = owner
        self.is_initialized = False  # transformers 5 sets it too; 4.56 (NVIDIA's container's) does not

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a SlotCache layer is filled by SlotCache.store, before any decode step")

    def allocate(self, keys: torch.Tensor, values: torch.Tensor, slots: int, capacity: int) -> None:
        self.keys = keys.new_zeros((slots, keys.shape[1], capacity, keys.shape[3]))
        self.values = values.new_zeros((slots, values.shape[1], capacity, values.shape[3]))
        self.device, self.is_initialized = keys.device, True

    def grown(self, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """New keys and values of `capacity` columns holding the current ones (the layer keeps its own until
        `SlotCache.reserve` swaps every layer's at once)."""
        new = []
        for old in (self.keys, self.values):
            buffer = old.new_zeros((old.shape[0], old.shape[1], capacity, old.shape[3]))
            buffer[:, :, : old.shape[2]] = old
            new.append(buffer)
        return new[0], new[1]

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

    def get_max_cache_shape(self) -> int:  # transformers 4.56's name for get_max_length
        return self.get_max_length()


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
        self.generation = 0  # counts the reallocations of the buffers (a captured step reads their addresses)
        self._all_rows: torch.Tensor | None = None

    def store(self, slots: list[int], cache: DynamicCache) -> None:
        """Copy row r of a prefilled DynamicCache into slot `slots[r]`, every column: two copies a layer for
        the whole group (one a row cost more than the prefill itself at 128 rows). A padded row's columns
        past its prompt are never read: its mask hides them until its decode steps write them."""
        length = cache.layers[0].keys.shape[2]
        for layer, source in zip(self.layers, cache.layers, strict=True):  # every layer first, then the room
            if not layer.is_initialized:
                layer.allocate(source.keys, source.values, self.slots, min(self.max_len, CACHE_LENGTH_STEP))
        self.reserve(length)
        rows = torch.tensor(slots, device=self.layers[0].keys.device)
        for layer, source in zip(self.layers, cache.layers, strict=True):
            layer.keys[:, :, :length].index_copy_(0, rows, source.keys)
            layer.values[:, :, :length].index_copy_(0, rows, source.values)

    def reserve(self, length: int) -> None:
        """Room for `length` columns in every layer: grow by doubling (rarely; each growth copies the cache
        once). Every layer's new buffers are made before any is swapped in, so a growth that runs out of memory
        leaves the cache (and the captured steps reading its addresses) as it was."""
        capacity = min(layer.keys.shape[2] for layer in self.layers)
        if length <= capacity:
            return
        while capacity < length:
            capacity *= 2
        grown = [layer.grown(min(capacity, self.max_len)) for layer in self.layers]
        for layer, (keys, values) in zip(self.layers, grown, strict=True):
            layer.keys, layer.values = keys, values
        self.generation += 1

    def prepare(self, rows: int, positions: torch.Tensor, length: int) -> None:
        """The next decode step covers slots [0, rows), row r writing at positions[r], reading `length`
        columns."""
        self.reserve(length)
        if self._all_rows is None or self._all_rows.device != positions.device:
            self._all_rows = torch.arange(self.slots, device=positions.device)
        self.rows, self.positions, self.length = rows, positions, length
        self.row_index = self._all_rows[:rows]


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

    __slots__ = ("request", "slot", "tokens", "generated", "log_probs", "top", "finish_reason", "matcher")

    def __init__(self, request: GenerationRequest, slot: int, matcher=None):
        self.request = request
        self.slot = slot
        self.tokens = list(request.prompt_ids)
        self.generated: list[int] = []
        self.log_probs: list[float] = []
        self.top: list[TopTokens] | None = [] if request.num_top_log_probs else None
        self.finish_reason: str | None = None
        self.matcher = matcher  # a guided request's xgrammar matcher, advanced by every token it accepts


class StepFlags(NamedTuple):
    """The optional ops a step runs (those some row of it needs); a captured step is keyed by them."""

    sampling: bool
    top_k: bool
    top_p: bool
    penalised: bool
    biased: bool
    log_probs: bool
    guided: bool
    top_log_probs: bool  # the likeliest tokens of each row's step too (MAX_TOP_LOG_PROBS of them)
    lora: bool = False  # some row runs with a LoRA adapter (lora_layers.py)


class _Features:
    """How many running sequences use each optional sampling step: a step skips the ops nobody uses."""

    def __init__(self):
        self.sampling = self.top_k = self.top_p = self.penalised = self.biased = self.log_probs = self.guided = 0
        self.top_log_probs = self.lora = 0

    def add(self, request: GenerationRequest, sign: int) -> None:
        params = request.sampling
        sampling = not params.greedy
        self.sampling += sign * sampling
        self.top_k += sign * (sampling and params.top_k > 1)
        self.top_p += sign * (sampling and params.top_p < 1)
        self.penalised += sign * params.penalised
        self.biased += sign * (request.embedding_bias is not None)
        self.log_probs += sign * request.return_log_probs
        self.guided += sign * (request.grammar is not None)
        self.top_log_probs += sign * (request.num_top_log_probs > 0)
        self.lora += sign * (request.lora_task_id is not None)

    def flags(self) -> StepFlags:
        return StepFlags(self.sampling > 0, self.top_k > 0, self.top_p > 0, self.penalised > 0, self.biased > 0,
                         self.log_probs > 0, self.guided > 0, self.top_log_probs > 0, self.lora > 0)


class InflightBatchingEngine(EngineThread):
    """`cuda_graphs`: replay the decode step as a CUDA graph on a CUDA device (None: unless the environment
    sets TRITONFORGE_CUDA_GRAPHS=0). `prefill_tokens`: the most tokens (padding included) of the requests
    prefilled together in one forward pass; a longer prompt is prefilled alone. `admission_wait_steps`: how
    many decode steps waiting requests may wait to be prefilled together while others run (0: admitted at the
    next step). `tokenizer`: the model's, whose vocabulary guided decoding compiles grammars for (None: guided
    requests are refused). `mirror`: told each forward pass just before it runs, so that tensor-parallel ranks
    run the same pass (tensor_parallel.py); decode steps then run eagerly. `adapters`: the LoRA adapters
    installed in `model` (lora_layers.py), selected per request by `lora_task_id`."""

    def __init__(self, model, limits: EngineLimits, *, cuda_graphs: bool | None = None,
                 prefill_tokens: int = PREFILL_TOKENS, admission_wait_steps: int = 0, tokenizer=None,
                 mirror: StepMirror | None = None, adapters: AdapterBank | None = None):
        super().__init__("inflight-engine")
        self._mirror = mirror
        self._adapters = adapters
        check_cache_layers(model)
        use_slot_attention(model)
        self.model = model
        self.limits = limits
        self.device = next(model.parameters()).device
        self._prefill_tokens = prefill_tokens
        self._vocab_size = model.config.vocab_size
        slots = limits.max_batch_size or 1
        self._slots: list[_Sequence | None] = [None] * slots
        self._free = list(range(slots))  # a heap: the lowest free slot first keeps the decoded rows few
        # Each slot's last token, cache length (= the position it writes next) and step (tokens generated), on
        # the host (pinned on CUDA: one copy moves them to the device each step) and as a numpy view that
        # the engine updates in place: no tensor is built from Python lists on the decode path.
        self._host = torch.zeros((3, slots), dtype=torch.long, pin_memory=self.device.type == "cuda")
        self._state = self._host.numpy()
        self._occupied = np.zeros(slots, dtype=bool)
        self._features = _Features()
        self._cache = SlotCache(model.config.num_hidden_layers, slots, limits.max_seq_len)
        self._sampler = SlotSampler(slots, self._vocab_size, self.device)
        self._grammars = Grammars(tokenizer, self._vocab_size) if tokenizer is not None else None
        # Before any captured step: a step that masks reads the device bitmask at this address.
        self._masks = GrammarMasks(slots, self._grammars, self._vocab_size, self.device) if self._grammars else None
        forward = inspect.signature(model.forward).parameters
        # transformers 5.x renames `past_key_values` to `cache` (the old name warns on every call)
        self._cache_argument = "cache" if "cache" in forward else "past_key_values"
        self._keep_last_logits = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}
        self._keep_row_positions = bool(self._keep_last_logits) and _keeps_row_positions()
        if cuda_graphs is None:
            cuda_graphs = os.environ.get(CUDA_GRAPHS_ENV, "1") != "0"
        self._graphs: DecodeGraphs | None = None
        self._static: StaticInputs | None = None
        if cuda_graphs and self.device.type == "cuda" and mirror is None:  # a replay tells no other rank
            self.use_decode_graphs(capture=True)
        self._admission_wait_steps = admission_wait_steps
        self._decode_steps = 0
        self._deferred_since: int | None = None  # the decode step since which waiting requests were deferred
        self._thread.start()

    def use_decode_graphs(self, *, capture: bool) -> None:
        """Decode every slot at a bucketed length from static inputs, captured as CUDA graphs (`capture`), or
        the same step run eagerly (how the tests check that path on a CPU). Call before any request."""
        self._static = StaticInputs(len(self._slots), self._vocab_size, self.device)
        self._graphs = DecodeGraphs(self.device, capture=capture)

    @property
    def cuda_graphs(self) -> bool:
        """Whether decode steps are being replayed as CUDA graphs (False once a capture failed)."""
        return self._graphs is not None and self._graphs.capture and not self._graphs.failed

    # ---- client side (any thread) -------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise RequestError for a request this engine must refuse; called before `submit`. Compiles a guided
        request's grammar here, on the caller's thread, so that the engine's thread never waits for it."""
        check_limits(request, self.limits, vocab_size=self.model.config.vocab_size, pending=self.pending())
        if request.guided_decoding is not None:
            if self._grammars is None:
                raise UnsupportedError(GUIDED_DECODING_GUIDE_TYPE, "guided decoding is off in this engine: it was "
                                                                   "loaded without a tokenizer or without xgrammar "
                                                                   "(the server's log says which)")
            request.grammar = self._grammars.compile(request.guided_decoding)
        if request.lora_task_id is not None:
            if self._adapters is None:
                raise RequestError(LORA_TASK_ID, f"no LoRA adapter has task id {request.lora_task_id}: this engine "
                                                 f"was built without adapters (tritonforge build --lora NAME=PATH)")
            self._adapters.task_index(request.lora_task_id)

    # ---- engine thread ------------------------------------------------------------------------------------

    def _running(self) -> list[_Sequence]:
        return [sequence for sequence in self._slots if sequence is not None]

    def _loop(self) -> None:
        with torch.inference_mode(), _on_device(self.device), _attention_backends(self.device):
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
        admitting = self._admitting()
        while admitting and self._waiting and self._free:
            group = self._take_group()
            if not group:
                continue
            self._prefill(group)
            prefilled += len(group)
            # A prefill is a forward pass over whole prompts: stops (the liveness probe's too) and cancels wait
            # for one of them, not for every prefill of the iteration.
            self._apply_cancellations(self._take_new())
        if self._running():
            self._decode_step()
        running = self._running()
        self.stats = EngineStats(waiting=self.pending(), scheduled=len(running), context=prefilled,
                                 kv_tokens=sum(len(sequence.tokens) for sequence in running))

    def _admitting(self) -> bool:
        """Whether to prefill the waiting requests now: at once when nothing runs or admissions do not wait;
        else once they fill an eighth of the slots (or every free one), or have waited the steps allowed."""
        if not (self._waiting and self._free):
            self._deferred_since = None
            return False
        if not self._admission_wait_steps or not self._occupied.any():
            return True
        if len(self._waiting) >= min(len(self._free), max(1, len(self._slots) // 8)):
            self._deferred_since = None
            return True
        if self._deferred_since is None:
            self._deferred_since = self._decode_steps
        if self._decode_steps - self._deferred_since >= self._admission_wait_steps:
            self._deferred_since = None
            return True
        return False

    def _take_group(self) -> list[GenerationRequest]:
        """The waiting requests to prefill together: in arrival order, as many as free slots allow and whose
        prompts, padded to the longest, fit `prefill_tokens` (the first one always). Ends the cancelled."""
        group: list[GenerationRequest] = []
        longest = 0
        while self._waiting and len(group) < len(self._free):
            request = self._waiting[0]
            if request.sink.cancelled():
                self._waiting.pop(0)
                request.sink.finish(GenerationResult([], [], "cancelled"), None)
                continue
            length = max(longest, len(request.prompt_ids))
            if group and (len(group) + 1) * length > self._prefill_tokens:
                break
            if group and (request.return_prompt_log_probs or group[0].return_prompt_log_probs):
                break  # prefilled alone: it keeps every position's logits
            group.append(self._waiting.pop(0))
            longest = length
        return group

    def _apply_cancellations(self, ids: set[str]) -> None:
        if ids:
            for sequence in self._running():
                if sequence.finish_reason is None and sequence.request.request_id in ids:
                    sequence.finish_reason = "cancelled"
            for request in [r for r in self._waiting if r.request_id in ids]:
                self._waiting.remove(request)
                request.sink.finish(GenerationResult([], [], "cancelled"), None)
        self._retire_finished()

    def _prefill(self, group: list[GenerationRequest]) -> None:
        """One forward pass over the group's prompts, right-padded to the longest: attention is causal, so a
        prompt's padding (after it) changes none of its logits, which are read at its last real position.
        A request alone runs unpadded, as `generate` does."""
        sequences = []
        features = _Features()
        for request in group:
            request.sink.scheduled()
            slot = heapq.heappop(self._free)
            matcher = self._grammars.matcher(request.grammar) if request.grammar is not None else None
            sequence = _Sequence(request, slot, matcher)
            self._slots[slot] = sequence
            self._occupied[slot] = True
            self._features.add(request, +1)
            features.add(request, +1)
            self._sampler.admit(slot, request.sampling, request.prompt_ids, request.embedding_bias)
            sequences.append(sequence)
        lengths = [len(request.prompt_ids) for request in group]
        cache = DynamicCache(config=self.model.config)
        if len(group) == 1:
            input_ids = torch.tensor([group[0].prompt_ids], device=self.device)
            # The prompt's own log probabilities need the logits of every position, not only the last.
            keep = {} if group[0].return_prompt_log_probs else self._keep_last_logits
        else:
            longest = max(lengths)
            input_ids = torch.tensor([request.prompt_ids + [0] * (longest - length)
                                      for request, length in zip(group, lengths)], device=self.device)
            keep = {}
            if self._keep_row_positions:  # [rows, 1]: each row's last real position
                keep = {"logits_to_keep": torch.tensor([[length - 1] for length in lengths], device=self.device)}
        if self._mirror is not None:
            self._mirror.prefill(input_ids, keep, [sequence.slot for sequence in sequences])
        if self._adapters is not None:
            indices = [self._adapter_index(request) for request in group]
            for sequence, index in zip(sequences, indices):
                self._adapters.admit(sequence.slot, index)
            self._adapters.for_rows(indices)
        output = self.model(input_ids=input_ids, use_cache=True, **{self._cache_argument: cache}, **keep)
        if len(group) == 1 or keep:
            logits = output.logits[:, -1]
        else:
            logits = output.logits[torch.arange(len(group)), torch.tensor(lengths) - 1]
        if len(group) == 1 and group[0].return_prompt_log_probs:
            _send_prompt_log_probs(group[0], output.logits[0])
        self._cache.store([sequence.slot for sequence in sequences], cache)
        for sequence, length in zip(sequences, lengths):
            self._state[:, sequence.slot] = (sequence.tokens[-1], length, 0)
        del cache, output
        if len(group) == 1:
            rows = slice(sequences[0].slot, sequences[0].slot + 1)
        else:
            rows = torch.tensor([sequence.slot for sequence in sequences], device=self.device)
        live, banned = self._live_rows(sequences)
        if live:
            if features.guided:
                self._fill_masks(live)
            steps = torch.zeros(len(group), dtype=torch.long, device=self.device)
            chosen = self._choose(logits, rows, steps, features.flags(), banned=banned)
            self._accept_rows(live, chosen, features.flags())
        self._retire_finished()

    def _decode_step(self) -> None:
        rows = int(np.flatnonzero(self._occupied)[-1]) + 1
        sequences = self._slots[:rows]
        live, banned = self._live_rows(sequences)
        if live:
            length = int(self._state[1, :rows].max()) + 1  # the longest cache, and its new column
            flags = self._features.flags()
            if flags.guided:
                self._fill_masks(live)
            chosen = self._graph_step(length, flags, banned) if self._graphs is not None else None
            if chosen is None:
                chosen = self._eager_step(rows, length, flags, banned)
            self._accept_rows(live, chosen, flags, decoded=True)
            self._decode_steps += 1
        self._retire_finished()

    def _eager_step(self, rows: int, length: int, flags: StepFlags, banned) -> torch.Tensor:
        """Slots [0, rows) at `length` columns. A free slot inside decodes a dummy token at position 0 of its own
        (unused) cache."""
        if self.device.type == "cuda":
            state = self._host.to(self.device, non_blocking=True)[:, :rows]  # one copy; the host is pinned
        else:
            state = self._host[:, :rows].clone()
        input_ids, positions, steps = state[0, :, None], state[1], state[2]  # [rows, 1], [rows], [rows]
        logits = self._decode_forward(input_ids, positions, rows, length, flags.lora)
        return self._choose(logits, slice(0, rows), steps, flags, banned=banned)

    def _graph_step(self, length: int, flags: StepFlags, banned) -> torch.Tensor | None:
        """Every slot at the bucket's length, from the static inputs, replayed as a captured graph. None if
        graphs have failed: the caller runs the step eagerly."""
        bucket = graph_bucket(length, self._cache.max_len)
        self._cache.reserve(bucket)
        self._static.fill(self._host, banned)
        return self._graphs.run((bucket, flags), self._cache.generation,
                                lambda record: self._static_step(bucket, flags, record))

    def _static_step(self, bucket: int, flags: StepFlags, record: bool) -> torch.Tensor:
        """The captured step: reads only the static inputs and fixed buffers; no host sync, no shape that
        depends on data. `record` False (the warm-up) leaves the penalty counts as they were."""
        static = self._static
        logits = self._decode_forward(static.input_ids, static.positions, len(self._slots), bucket, flags.lora)
        return self._choose(logits, slice(0, len(self._slots)), static.steps, flags, banned=[], ban=static.ban,
                            record=record)

    def _decode_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: int, length: int,
                        lora: bool):
        """One decode forward pass of slots [0, rows), each row writing its token at its position; returns
        the logits [rows, vocab]."""
        if self._mirror is not None:
            self._mirror.decode(input_ids, positions, rows, length)
        if self._adapters is not None:
            self._adapters.for_slots(lora)
        mask = decode_mask(positions, length, self.model.dtype)
        self._cache.prepare(rows, positions, length)
        output = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions[:, None],
                            use_cache=True, **{self._cache_argument: self._cache})
        return output.logits[:, -1]

    def _adapter_index(self, request: GenerationRequest) -> int:
        return 0 if request.lora_task_id is None else self._adapters.task_index(request.lora_task_id)

    def _live_rows(self, sequences: list[_Sequence | None]):
        """The rows whose sequence still runs (a cancelled one is marked finished), and the (row, token) pairs
        none of them may choose: min_tokens' end id, the last token of a bad word whose start is there."""
        banned: list[tuple[int, int]] = []
        live = []
        vocab = self._vocab_size
        for row, sequence in enumerate(sequences):
            if sequence is None or sequence.finish_reason is not None:
                continue
            request = sequence.request
            if request.sink.cancelled():
                sequence.finish_reason = "cancelled"
                continue
            live.append((row, sequence))
            if request.end_id is not None and len(sequence.generated) < request.sampling.min_tokens:
                if 0 <= request.end_id < vocab:
                    banned.append((row, request.end_id))
            if request.bad_sequences:
                banned.extend((row, token) for token in _banned_tokens(sequence.tokens, request.bad_sequences)
                              if 0 <= token < vocab)
        return live, banned

    def _fill_masks(self, live: list[tuple[int, _Sequence]]) -> None:
        """Each live guided sequence's allowed tokens into its slot's bitmask row, then to the device."""
        for _, sequence in live:
            if sequence.matcher is not None:
                self._masks.fill(sequence.slot, sequence.matcher)
        self._masks.upload()

    def _choose(self, logits: torch.Tensor, rows, steps: torch.Tensor, flags: StepFlags, *, banned,
                ban: torch.Tensor | None = None, record: bool = True) -> torch.Tensor:
        """Process and sample logits [n, vocab] of slots `rows`: the tokens [n], or with log probs [2, n]
        (float64: token ids are exact), and with the top log probs [2 + 2k, n]: then the k likeliest tokens'
        log probs, then their ids. A guided row's grammar masks its logits after the request's own
        processing (bias, penalties, bans) and before temperature, top-k and top-p."""
        logits = self._sampler.process(logits.float(), rows, biased=flags.biased, penalised=flags.penalised,
                                       banned=banned, ban=ban)
        if flags.guided:
            logits = self._masks.apply(logits, rows)
        tokens = self._sampler.choose(logits, rows, steps, sampling=flags.sampling, top_k=flags.top_k,
                                      top_p=flags.top_p)
        if flags.penalised and record:
            self._sampler.record(rows, tokens)
        if flags.log_probs:
            all_log_probs = torch.log_softmax(logits, dim=-1)
            log_probs = all_log_probs.gather(1, tokens[:, None])[:, 0]
            chosen = torch.stack((tokens.double(), log_probs.double()))
            if flags.top_log_probs:
                top = torch.topk(all_log_probs, min(MAX_TOP_LOG_PROBS, all_log_probs.shape[-1]), dim=-1)
                chosen = torch.cat((chosen, top.values.T.double(), top.indices.T.double()))
            return chosen
        return tokens

    def _accept_rows(self, live: list[tuple[int, _Sequence]], chosen: torch.Tensor, flags: StepFlags, *,
                     decoded: bool = False) -> None:
        """Bring the step's tokens to the host (its one sync) and give each live row its token. `decoded`: a
        decode step, which wrote a column into every occupied slot's cache."""
        chosen_log_probs = host = None
        if flags.log_probs:
            host = chosen.tolist()  # [2 (+ 2k), n]: the step's one copy to the host
            tokens, chosen_log_probs = host[0], host[1]
        else:
            tokens = chosen.tolist()
        if decoded:
            self._state[1] += self._occupied
        for row, sequence in live:
            log_prob = chosen_log_probs[row] if sequence.request.return_log_probs else 0.0
            top = None
            if sequence.top is not None:
                width = (len(host) - 2) // 2
                ranks = range(min(sequence.request.num_top_log_probs, width))  # a vocabulary under k
                values = [host[2 + rank][row] for rank in ranks]
                ids = [int(host[2 + width + rank][row]) for rank in ranks]
                # A step of a grammar may allow fewer tokens than asked: those it bans are not alternatives.
                top = TopTokens([token for token, value in zip(ids, values) if value != -math.inf],
                                [value for value in values if value != -math.inf])
            self._accept(sequence, int(tokens[row]), log_prob, top)

    def _accept(self, sequence: _Sequence, token: int, log_prob: float, top: TopTokens | None = None) -> None:
        request = sequence.request
        matcher = sequence.matcher
        # The grammar allowed the token, unless the request's own bans (min_tokens' end id, bad words) took every
        # token it allows: the answer then ends where it is. Its stop token ends it once the text is whole.
        if matcher is not None and (not matcher.accept_token(token) or matcher.is_terminated()):
            sequence.finish_reason = "end_id"
            return
        if request.end_id is not None and token == request.end_id:
            sequence.finish_reason = "end_id"
            return
        sequence.tokens.append(token)
        sequence.generated.append(token)
        sequence.log_probs.append(log_prob)
        if sequence.top is not None:
            sequence.top.append(top)
        self._state[0, sequence.slot] = token
        self._state[2, sequence.slot] += 1
        if request.stop_sequences and _ends_with_any(sequence.tokens, request.stop_sequences):
            sequence.finish_reason = "stop_words"
        elif len(sequence.generated) >= request.max_new_tokens:
            sequence.finish_reason = "length"
        elif request.stream:  # a token that ends the request goes out with `finish`, flagged final
            request.sink.tokens([token], [log_prob], None if top is None else [top])

    def _retire_finished(self) -> None:
        for sequence in self._slots:
            if sequence is not None and sequence.finish_reason is not None:
                self._release(sequence)
                sequence.request.sink.finish(
                    GenerationResult(sequence.generated, sequence.log_probs, sequence.finish_reason, sequence.top),
                    None)

    def _release(self, sequence: _Sequence) -> None:
        """Free the sequence's slot: nothing moves on the device."""
        self._slots[sequence.slot] = None
        self._state[:, sequence.slot] = 0
        self._occupied[sequence.slot] = False
        self._features.add(sequence.request, -1)
        if sequence.matcher is not None:
            self._masks.clear(sequence.slot)
        heapq.heappush(self._free, sequence.slot)


def _send_prompt_log_probs(request: GenerationRequest, logits: torch.Tensor) -> None:
    """A prompt's log probabilities from its prefill's logits [prompt, vocab]: position i predicts token i + 1,
    so the first token has none (NaN); with `num_top_log_probs`, the likeliest tokens at each place too."""
    prompt = torch.tensor(request.prompt_ids[1:], device=logits.device)
    log_probs = torch.log_softmax(logits[:-1].float(), dim=-1)
    chosen = [math.nan, *log_probs.gather(1, prompt[:, None])[:, 0].tolist()]
    top = None
    if request.num_top_log_probs:
        values, ids = torch.topk(log_probs, min(request.num_top_log_probs, log_probs.shape[-1]), dim=-1)
        top = [TopTokens([], []), *(TopTokens(i, v) for i, v in zip(ids.tolist(), values.tolist()))]
    request.sink.prompt(chosen, top)


def decode_mask(positions: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask [rows, 1, 1, length] of a decode step: row r sees its cache and its new token, the
    columns up to positions[r]."""
    columns = torch.arange(length, device=positions.device)
    visible = columns[None, :] <= positions[:, None]  # [rows, length]
    return torch.zeros(visible.shape, dtype=dtype, device=positions.device).masked_fill_(
        ~visible, torch.finfo(dtype).min)[:, None, None, :]


class StepMirror(Protocol):
    """What an engine tells its tensor-parallel ranks before each forward pass (tensor_parallel.py)."""

    def prefill(self, input_ids: torch.Tensor, keep: dict, slots: list[int]) -> None:
        """A prefill of `input_ids` [rows, length] (`keep`: the pass's logits_to_keep argument, if any) whose
        caches go into `slots`."""

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: int, length: int) -> None:
        """A decode step of slots [0, rows): input_ids [rows, 1] written at positions [rows], `length` columns."""


def _keeps_row_positions() -> bool:
    """Whether this transformers takes `logits_to_keep` as [batch, positions] (each row its own positions)."""
    try:
        from transformers.modeling_utils import slice_logits_to_keep
    except ImportError:
        return False
    return "2D" in (slice_logits_to_keep.__doc__ or "")


def _on_device(device: torch.device):
    """The engine's GPU as its thread's current device (a new thread's is GPU 0): what CUDA makes without naming a
    device (a graph's capture stream) lands on the engine's GPU, not on GPU 0 (build --gpus)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _attention_backends(device: torch.device):
    """On CUDA, SDPA without its cuDNN backend, which builds an execution plan for each new shape: the decode
    step's shape changes with its length and row count, and a first H200 run crawled (11 tokens/s at one
    stream) with cuDNN attention in its profile."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _ends_with_any(tokens: list[int], sequences: list[list[int]]) -> bool:
    return any(len(tokens) >= len(s) and tokens[-len(s):] == s for s in sequences if s)


def _banned_tokens(tokens: list[int], sequences: list[list[int]]) -> list[int]:
    """The last token of every bad sequence whose other tokens end the text so far."""
    banned = []
    for sequence in sequences:
        if sequence and (len(sequence) == 1 or tokens[-(len(sequence) - 1):] == sequence[:-1]):
            banned.append(sequence[-1])
    return banned
