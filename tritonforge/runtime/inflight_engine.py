"""An in-flight batching engine on Hugging Face transformers: the embedded stand-in for TensorRT-LLM.

One background thread owns the model. Each iteration it
1. takes new requests and cancellations from thread-safe queues,
2. prefills each admitted request on its own (batch of one, so its first token is exactly `generate`'s),
   then merges its KV cache into the running batch (left-padded, with an attention mask),
3. runs ONE batched forward pass that decodes the next token of every running sequence,
4. applies each request's own sampling, reports tokens, and drops finished sequences from the batch.

A request that arrives while others generate therefore joins at the next step, as in TensorRT-LLM. The cache
is bounded explicitly: at most `max_batch_size` sequences of at most `max_seq_len` tokens run at once; the rest
wait in a queue of `max_queue_size` (0 = unbounded).

transformers' own continuous batching manager is not used: it applies one sampling configuration to the whole
batch, and this engine must serve per-request seeds, penalties, min_tokens, bad and stop words.
"""

from __future__ import annotations

import logging

import torch

from ..spec.limits import EngineLimits
from .generation import EngineStats, EngineThread, GenerationRequest, GenerationResult, check_limits
from .sampling import apply_penalties, choose_token

logger = logging.getLogger(__name__)


class _Sequence:
    """A running request and its state."""

    def __init__(self, request: GenerationRequest, device: torch.device):
        self.request = request
        self.tokens = list(request.prompt_ids)
        self.generated: list[int] = []
        self.log_probs: list[float] = []
        self.generator = request.sampling.make_generator(device)
        self.finish_reason: str | None = None


class InflightBatchingEngine(EngineThread):
    def __init__(self, model, limits: EngineLimits):
        super().__init__("inflight-engine")
        self.model = model
        self.limits = limits
        self.device = next(model.parameters()).device
        self._running: list[_Sequence] = []
        self._cache = None  # DynamicCache of the running batch, rows left-padded
        self._attention_mask: torch.Tensor | None = None  # [batch, cache_len + 1]
        self._thread.start()

    # ---- client side (any thread) -------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise RequestError for a request this engine must refuse; called before `submit`."""
        check_limits(request, self.limits, vocab_size=self.model.config.vocab_size, pending=self.pending())

    # ---- engine thread ------------------------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode():
            while not self._stopping.is_set():
                if not self._running and self._idle():
                    self._wait_for_work()
                    continue
                try:
                    self._iteration()
                except Exception as error:  # noqa: BLE001 - a broken step must end its requests, not the thread
                    logger.exception("engine step failed")
                    for sequence in self._running:
                        sequence.request.sink.finish(None, error)
                    self._running, self._cache, self._attention_mask = [], None, None
        self._take_new()  # answers the stops and moves the last requests to _waiting, which ends them below
        for sequence in self._running:
            sequence.request.sink.finish(None, RuntimeError("the engine is shutting down"))
        for request in self._waiting:
            request.sink.finish(None, RuntimeError("the engine is shutting down"))

    def _iteration(self) -> None:
        self._apply_cancellations(self._take_new())
        prefilled = 0
        while self._waiting and len(self._running) < self.limits.max_batch_size:
            request = self._waiting.pop(0)
            if request.sink.cancelled():
                request.sink.finish(GenerationResult([], [], "cancelled"), None)
                continue
            self._prefill(request)
            prefilled += 1
            # A prefill is a forward pass over a whole prompt: stops (the liveness probe's too) and cancels wait
            # for one of them, not for every prefill of the iteration.
            self._apply_cancellations(self._take_new())
        if self._running:
            self._decode_step()
        self.stats = EngineStats(waiting=self.pending(), scheduled=len(self._running), context=prefilled,
                                 kv_tokens=sum(len(sequence.tokens) for sequence in self._running))

    def _apply_cancellations(self, ids: set[str]) -> None:
        for sequence in self._running:
            if sequence.finish_reason is None and sequence.request.request_id in ids:
                sequence.finish_reason = "cancelled"
        for request in [r for r in self._waiting if r.request_id in ids]:
            self._waiting.remove(request)
            request.sink.finish(GenerationResult([], [], "cancelled"), None)
        self._retire_finished()

    def _prefill(self, request: GenerationRequest) -> None:
        from transformers import DynamicCache

        request.sink.scheduled()
        sequence = _Sequence(request, self.device)
        input_ids = torch.tensor([request.prompt_ids], device=self.device)
        cache = DynamicCache(config=self.model.config)
        output = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        self._accept(sequence, output.logits[0, -1])
        mask = torch.ones((1, input_ids.shape[1] + 1), dtype=torch.long, device=self.device)
        self._merge(sequence, output.past_key_values, mask)
        self._retire_finished()

    def _merge(self, sequence: _Sequence, cache, mask: torch.Tensor) -> None:
        """Append one sequence's cache to the running batch, left-padding the shorter side."""
        if not self._running:
            self._running, self._cache, self._attention_mask = [sequence], cache, mask
            return
        old_len, new_len = self._attention_mask.shape[1], mask.shape[1]
        width = max(old_len, new_len)
        for old_layer, new_layer in zip(self._cache.layers, cache.layers):
            old_layer.keys = torch.cat([_left_pad(old_layer.keys, width - 1), _left_pad(new_layer.keys, width - 1)])
            old_layer.values = torch.cat([_left_pad(old_layer.values, width - 1),
                                          _left_pad(new_layer.values, width - 1)])
        self._attention_mask = torch.cat([_left_pad_mask(self._attention_mask, width),
                                          _left_pad_mask(mask, width)])
        self._running.append(sequence)

    def _decode_step(self) -> None:
        batch = len(self._running)
        last = torch.tensor([[s.tokens[-1]] for s in self._running], device=self.device)  # [batch, 1]
        mask = self._attention_mask  # [batch, cache_len + 1]: the new token is the last column
        positions = (mask.sum(dim=1, keepdim=True) - 1)  # [batch, 1]: real tokens before the new one
        cache_position = torch.tensor([mask.shape[1] - 1], device=self.device)
        output = self.model(input_ids=last, attention_mask=mask, position_ids=positions,
                            past_key_values=self._cache, cache_position=cache_position, use_cache=True)
        self._cache = output.past_key_values
        logits = output.logits[:, -1, :]  # [batch, vocab]
        for row in range(batch):
            self._accept(self._running[row], logits[row])
        ones = torch.ones((batch, 1), dtype=mask.dtype, device=self.device)
        self._attention_mask = torch.cat([mask, ones], dim=1)
        self._retire_finished()

    def _accept(self, sequence: _Sequence, logits: torch.Tensor) -> None:
        """Pick, record and report one sequence's next token from its row of logits [vocab]."""
        request = sequence.request
        if sequence.finish_reason is not None:
            return
        if request.sink.cancelled():
            sequence.finish_reason = "cancelled"
            return
        logits = logits.float()
        if request.embedding_bias is not None:
            bias = torch.as_tensor(request.embedding_bias[: logits.shape[-1]], device=logits.device)
            logits = logits.clone()
            logits[: bias.shape[0]] += bias
        logits = apply_penalties(logits, request.sampling, sequence.tokens, sequence.generated, request.end_id)
        for banned in _banned_tokens(sequence.tokens, request.bad_sequences):
            logits[banned] = float("-inf")
        token = choose_token(logits, request.sampling, sequence.generator)
        log_prob = float(torch.log_softmax(logits, dim=-1)[token]) if request.return_log_probs else 0.0
        if request.end_id is not None and token == request.end_id:
            sequence.finish_reason = "end_id"
            return
        sequence.tokens.append(token)
        sequence.generated.append(token)
        sequence.log_probs.append(log_prob)
        if _ends_with_any(sequence.tokens, request.stop_sequences):
            sequence.finish_reason = "stop_words"
        elif len(sequence.generated) >= request.max_new_tokens:
            sequence.finish_reason = "length"
        elif request.stream:  # a token that ends the request goes out with `finish`, flagged final
            request.sink.tokens([token], [log_prob])

    def _retire_finished(self) -> None:
        keep = [row for row, s in enumerate(self._running) if s.finish_reason is None]
        if len(keep) == len(self._running):
            return
        for sequence in self._running:
            if sequence.finish_reason is not None:
                sequence.request.sink.finish(
                    GenerationResult(sequence.generated, sequence.log_probs, sequence.finish_reason), None)
        if not keep:
            self._running, self._cache, self._attention_mask = [], None, None
            return
        index = torch.tensor(keep, device=self.device)
        self._running = [self._running[row] for row in keep]
        mask = self._attention_mask.index_select(0, index)
        # Columns that are padding in every remaining row are dead weight: cut them.
        first = int((mask.sum(dim=0) > 0).nonzero()[0])
        self._attention_mask = mask[:, first:]
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]


def _left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Left-pad a [batch, heads, seq, dim] cache tensor along seq to `length`."""
    missing = length - tensor.shape[2]
    if missing == 0:
        return tensor
    pad = tensor.new_zeros(tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([pad, tensor], dim=2)


def _left_pad_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - mask.shape[1]
    if missing == 0:
        return mask
    return torch.cat([mask.new_zeros(mask.shape[0], missing), mask], dim=1)


def _ends_with_any(tokens: list[int], sequences: list[list[int]]) -> bool:
    return any(len(tokens) >= len(s) and tokens[-len(s):] == s for s in sequences if s)


def _banned_tokens(tokens: list[int], sequences: list[list[int]]) -> list[int]:
    """The last token of every bad sequence whose other tokens end the text so far."""
    banned = []
    for sequence in sequences:
        if sequence and (len(sequence) == 1 or tokens[-(len(sequence) - 1):] == sequence[:-1]):
            banned.append(sequence[-1])
    return banned
