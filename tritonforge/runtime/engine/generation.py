"""What every engine shares: a generation request, its result, where its tokens go, and the checks made
before a request is accepted. Free of torch, so request handling loads without it (the replay engine)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from ...facts.contract import (
    BEAM_WIDTH,
    INPUT_IDS,
    MAX_TOP_LOG_PROBS,
    NUM_RETURN_SEQUENCES,
    NUM_TOP_LOG_PROBS,
    REQUEST_OUTPUT_LEN,
)
from ...facts.errors import QueueFullError, RequestError, UnsupportedError
from ...facts.limits import EngineLimits
from .guided import GuidedDecoding
from .sampling import SamplingParams


class TopTokens(NamedTuple):
    """The likeliest tokens at one generated token's step, likeliest first, with their log probabilities."""

    ids: list[int]
    log_probs: list[float]


class TokenSink(Protocol):
    """Where one request's results go. Called from the engine thread.

    A streaming request's tokens arrive through `tokens` while it runs; the tokens of the step that ends it
    arrive only with `finish` (`result.token_ids` past those already streamed), so that the last response
    with data can carry the final flag, as the tensorrtllm backend's does.
    """

    def scheduled(self) -> None:
        """The engine took the request from its queue and starts its prefill."""

    def tokens(self, token_ids: list[int], log_probs: list[float], top: list[TopTokens] | None = None) -> None:
        """New tokens of a streaming request that goes on (`top`: the likeliest at each one's step, for a request
        with `num_top_log_probs`)."""

    def prompt(self, log_probs: list[float], top: list[TopTokens] | None) -> None:
        """A request with `return_prompt_log_probs`, before any token: each prompt token's log probability (NaN
        for the first) and, with `num_top_log_probs`, the likeliest tokens at its place."""

    def finish(self, result: GenerationResult | None, error: Exception | None) -> None:
        """Called exactly once: the whole result, or the error that ended the request."""

    def cancelled(self) -> bool:
        """True once the client went away; the engine then drops the request."""


@dataclass(kw_only=True)
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    sink: TokenSink
    end_id: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_sequences: list[list[int]] = field(default_factory=list)
    bad_sequences: list[list[int]] = field(default_factory=list)
    stream: bool = False
    return_log_probs: bool = False
    num_top_log_probs: int = 0  # the likeliest tokens returned beside each generated token (implies log probs)
    return_prompt_log_probs: bool = False  # the prompt's log probabilities too (`TokenSink.prompt`)
    embedding_bias: np.ndarray | None = None  # [vocab] added to the logits of every step
    guided_decoding: GuidedDecoding | None = None  # the grammar the answer must follow
    grammar: object = None  # the engine's compiled `guided_decoding`, set by its `validate`
    lora_task_id: int | None = None  # the LoRA adapter to run with (NVIDIA's task id); None: the base model


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]  # generated tokens only; the end id is not included
    log_probs: list[float]
    finish_reason: str  # "length" | "end_id" | "stop_words" | "cancelled"
    top: list[TopTokens] | None = None  # with `num_top_log_probs`: one per generated token


@dataclass(frozen=True)
class EngineStats:
    """What the engine runs, as the tensorrtllm backend reports it: published after every step (one
    attribute assignment, so readers in other threads see a whole snapshot)."""

    waiting: int = 0  # queued, not yet scheduled
    scheduled: int = 0  # running sequences
    context: int = 0  # sequences prefilled in the last step
    kv_tokens: int = 0  # tokens held in the KV cache by the running sequences


class EngineThread:
    """The client side every engine shares: requests and cancellations go into thread-safe queues that the
    engine's own thread (`_loop`, written by the subclass) drains between steps."""

    def __init__(self, name: str):
        self._incoming: queue.Queue[GenerationRequest] = queue.Queue()
        # (request id, called by the engine's thread once it has taken the cancel, or None)
        self._cancels: queue.Queue[tuple[str, Callable[[], None] | None]] = queue.Queue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._waiting: list[GenerationRequest] = []  # engine thread only
        self.stats = EngineStats()  # replaced by the engine thread after each step
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def submit(self, request: GenerationRequest) -> None:
        self._incoming.put(request)
        self._wake.set()

    def cancel(self, request_id: str, taken: Callable[[], None] | None = None) -> None:
        """Stop the running or waiting request with this id (the `stop` input of the engine model). `taken`
        is called from the engine's thread when it takes the cancel: an engine whose thread is stuck does
        not acknowledge stops, so a liveness probe that sends one sees the engine wedged."""
        self._cancels.put((request_id, taken))
        self._wake.set()

    def pending(self) -> int:
        return self._incoming.qsize() + len(self._waiting)

    def shutdown(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        raise NotImplementedError

    # ---- engine thread ------------------------------------------------------------------------------------

    def _idle(self) -> bool:
        return self._incoming.empty() and self._cancels.empty() and not self._waiting

    def _wait_for_work(self) -> None:
        self._wake.wait(timeout=0.5)
        self._wake.clear()

    def _take_new(self) -> set[str]:
        """Move new requests to `_waiting`; return the request ids cancelled since the last call."""
        while not self._incoming.empty():
            self._waiting.append(self._incoming.get_nowait())
        cancelled = set()
        while not self._cancels.empty():
            request_id, taken = self._cancels.get_nowait()
            cancelled.add(request_id)
            if taken is not None:
                taken()
        return cancelled


def check_limits(request: GenerationRequest, limits: EngineLimits, *, vocab_size: int, pending: int) -> None:
    """The checks every engine makes before accepting a request; each error names the tensor at fault."""
    prompt_len = len(request.prompt_ids)
    if prompt_len == 0:
        raise RequestError(INPUT_IDS, "must not be empty")
    if prompt_len > limits.max_input_len:
        raise RequestError(INPUT_IDS, f"prompt has {prompt_len} tokens, more than max_input_len "
                                        f"{limits.max_input_len}")
    if request.max_new_tokens < 1:
        raise RequestError(REQUEST_OUTPUT_LEN, f"must be >= 1, got {request.max_new_tokens}")
    if prompt_len + request.max_new_tokens > limits.max_seq_len:
        raise RequestError(REQUEST_OUTPUT_LEN, f"prompt ({prompt_len}) + request_output_len "
                                                 f"({request.max_new_tokens}) exceeds max_seq_len "
                                                 f"{limits.max_seq_len}")
    if any(not 0 <= token < vocab_size for token in request.prompt_ids):
        raise RequestError(INPUT_IDS, f"token ids must be in [0, {vocab_size})")
    if not 0 <= request.num_top_log_probs <= MAX_TOP_LOG_PROBS:
        raise RequestError(NUM_TOP_LOG_PROBS, f"must be in [0, {MAX_TOP_LOG_PROBS}], got {request.num_top_log_probs}")
    if limits.max_queue_size and pending >= limits.max_queue_size:
        raise QueueFullError(limits.max_queue_size)


def check_supported(*, beam_width: int, num_return_sequences: int) -> None:
    if beam_width != 1:
        raise UnsupportedError(BEAM_WIDTH, f"beam search is not supported by the transformers engine, "
                                             f"got {beam_width}; use 1 or the TensorRT-LLM engine")
    if num_return_sequences != 1:
        raise UnsupportedError(NUM_RETURN_SEQUENCES, f"only 1 sequence per request is supported by the "
                                                       f"transformers engine, got {num_return_sequences}")
