"""A replay engine, for benchmarking only: it streams pre-set token ids at a fixed step time.

It stands in for the engine step when the question is how much of an engine's token rate survives the
pipeline around it (tokenization, detokenization, Triton's scheduling), at rates the transformers engine
cannot reach: it models an in-flight batching engine whose every step takes `step_ms` and gives one token
to each running request, up to `max_batch_size` of them. At 128 streams, 8.5 ms a step is ~15k tokens/s,
the rate of TensorRT-LLM on one GPU at which docs/performance.md measures the pipeline.

It answers through the same `EngineService` as the transformers engine, so its tensors, streaming,
`stop` input and cancellation behave alike. It computes nothing: the tokens are a slice of `token_ids`
(text tokenized at build time) starting at an offset taken from the prompt, so different prompts stream
different text. It ignores sampling, end_id, stop and bad words; every request runs to `request_output_len`.

One Python stub cannot send a real engine's ~15k responses/s, so the model may run as several instances
(`--engine-instances`). They then share one batch of `max_batch_size` through `SharedBatch`: a request
runs only while it holds one of the batch's slots, whichever instance Triton gave it to, so the whole
engine streams at most `max_batch_size` tokens a step, as one real engine would.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
import time

from ....facts.contract import GUIDED_DECODING_GUIDE_TYPE, LORA_TASK_ID, RETURN_PROMPT_LOG_PROBS
from ....facts.errors import EngineShuttingDown, UnsupportedError
from ....facts.limits import EngineLimits
from ..generation import EngineStats, EngineThread, GenerationRequest, GenerationResult, TopTokens, check_limits

logger = logging.getLogger(__name__)


IMPOSSIBLE_LOG_PROB = -9999.0  # what OpenAI answers for a token of no probability


class _Replay:
    def __init__(self, request: GenerationRequest, offset: int, slot: int | None):
        self.request = request
        self.offset = offset
        self.slot = slot  # its SharedBatch slot, when the instances share the batch
        self.generated: list[int] = []


class SharedBatch:
    """`slots` batch slots shared by the processes that open the same file: slot i is a lock on byte i
    (fcntl byte-range locks: the kernel frees a dead process's slots). Locks of one process do not exclude
    each other, so each process also remembers the slots it holds."""

    def __init__(self, path: str, slots: int):
        self.slots = slots
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._held: set[int] = set()

    @classmethod
    def for_model(cls, model_directory: str, slots: int) -> SharedBatch:
        """The batch of the model served from `model_directory`: one lock file per model directory."""
        digest = hashlib.sha256(os.path.realpath(model_directory).encode()).hexdigest()[:16]
        return cls(os.path.join(tempfile.gettempdir(), f"tritonforge-replay-batch-{digest}.lock"), slots)

    def acquire(self) -> int | None:
        for slot in range(self.slots):
            if slot in self._held:
                continue
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
            except OSError:
                continue
            self._held.add(slot)
            return slot
        return None

    def release(self, slot: int) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, slot)
        self._held.discard(slot)

    def close(self) -> None:
        """Close; the last instance to close removes the file (its own creation)."""
        os.close(self._fd)
        try:
            probe = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            fcntl.lockf(probe, fcntl.LOCK_EX | fcntl.LOCK_NB, self.slots, 0)  # no slot held by anyone
            os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(probe)


class ReplayEngine(EngineThread):
    """Same interface as `InflightBatchingEngine`: validate, submit, cancel, shutdown."""

    def __init__(self, token_ids: list[int], *, step_ms: float, limits: EngineLimits, vocab_size: int,
                 shared_batch: SharedBatch | None = None):
        if not token_ids:
            raise ValueError("the replay engine needs at least one token id to replay")
        if step_ms <= 0:
            raise ValueError(f"replay step_ms must be > 0, got {step_ms}")
        super().__init__("replay-engine")
        self.token_ids = token_ids
        self.step_s = step_ms / 1000
        self.limits = limits
        self.vocab_size = vocab_size
        self._running: list[_Replay] = []
        self.shared_batch = shared_batch
        self._thread.start()

    def validate(self, request: GenerationRequest) -> None:
        check_limits(request, self.limits, vocab_size=self.vocab_size, pending=self.pending())
        if request.guided_decoding is not None:  # its tokens are a recording: no grammar could hold them
            raise UnsupportedError(GUIDED_DECODING_GUIDE_TYPE, "guided decoding is not supported by the replay "
                                                               "engine, which streams recorded tokens")
        if request.lora_task_id is not None:
            raise UnsupportedError(LORA_TASK_ID, "the replay engine streams recorded tokens and applies no LoRA "
                                                 "adapter")
        if request.return_prompt_log_probs:
            raise UnsupportedError(RETURN_PROMPT_LOG_PROBS, "the replay engine runs no model over the prompt")

    def _loop(self) -> None:
        next_step = time.monotonic()
        while not self._stopping.is_set():
            if not self._running and self._idle():
                self._wait_for_work()
                next_step = time.monotonic()
                continue
            try:
                self._step()
            except Exception as error:  # noqa: BLE001 - a broken step must end its requests, not the thread
                logger.exception("replay step failed")
                self._end_running(error)
            # A fixed cadence: time spent in the step counts toward the step; a step that overran starts
            # the next at once (no burst of catch-up steps).
            next_step = max(next_step + self.step_s, time.monotonic())
            time.sleep(max(0.0, next_step - time.monotonic()))
        self._take_new()  # answers the stops and moves the last requests to _waiting, which ends them below
        self._end_running(EngineShuttingDown())
        for request in self._waiting:
            request.sink.finish(None, EngineShuttingDown())

    def _end_running(self, error: Exception) -> None:
        """End every running request with `error`, freeing its batch slot."""
        for replay in self._running:
            self._release(replay)
            replay.request.sink.finish(None, error)
        self._running = []

    def _admit(self) -> int | None | bool:
        """A slot for one more running request: its SharedBatch slot, None (no sharing), or False (full)."""
        if self.shared_batch is not None:
            slot = self.shared_batch.acquire()
            return False if slot is None else slot
        return None if len(self._running) < self.limits.max_batch_size else False

    def _alternatives(self, token: int, request: GenerationRequest) -> TopTokens:
        """Fixed values, as a recording has no distribution: the recorded token is certain (log prob 0) and the
        ids after it are the alternatives, at OpenAI's log prob of the impossible."""
        ids = [(token + i) % self.vocab_size for i in range(min(request.num_top_log_probs, self.vocab_size))]
        return TopTokens(ids, [0.0] + [IMPOSSIBLE_LOG_PROB] * (len(ids) - 1))

    def _release(self, replay: _Replay) -> None:
        if replay.slot is not None:
            self.shared_batch.release(replay.slot)

    def _step(self) -> None:
        cancelled = self._take_new()
        for request in [r for r in self._waiting if r.request_id in cancelled or r.sink.cancelled()]:
            self._waiting.remove(request)
            request.sink.finish(GenerationResult([], [], "cancelled"), None)
        while self._waiting:
            slot = self._admit()
            if slot is False:
                break
            request = self._waiting.pop(0)
            request.sink.scheduled()
            self._running.append(_Replay(request, sum(request.prompt_ids) % len(self.token_ids), slot))
        admitted = len([r for r in self._running if not r.generated])
        still_running = []
        for replay in self._running:
            request = replay.request
            if request.request_id in cancelled or request.sink.cancelled():
                self._release(replay)
                request.sink.finish(GenerationResult(replay.generated, [0.0] * len(replay.generated),
                                                     "cancelled"), None)
                continue
            token = self.token_ids[(replay.offset + len(replay.generated)) % len(self.token_ids)]
            replay.generated.append(token)
            if len(replay.generated) >= request.max_new_tokens:  # the last token goes out with `finish`
                self._release(replay)
                top = [self._alternatives(t, request) for t in replay.generated] if request.num_top_log_probs else None
                request.sink.finish(GenerationResult(replay.generated, [0.0] * len(replay.generated), "length", top),
                                    None)
                continue
            if request.stream and request.num_top_log_probs:
                request.sink.tokens([token], [0.0], [self._alternatives(token, request)])
            elif request.stream:
                request.sink.tokens([token], [0.0])
            still_running.append(replay)
        self._running = still_running
        self.stats = EngineStats(waiting=self.pending(), scheduled=len(self._running), context=admitted,
                                 kv_tokens=sum(len(r.request.prompt_ids) + len(r.generated) for r in self._running))
