"""The `tensorrt_llm_bls` model's logic: one decoupled model doing tokenize → engine → detokenize.

Same client contract as the ensemble, with what the ensemble cannot do:
- per-request incremental detokenization: every streamed chunk is complete UTF-8 characters;
- string-level stop phrases (held back until decided, never emitted), which then stop the engine's request
  through its `stop` input so its slot frees; a client's cancel does the same;
- many requests per instance, so concurrency is `max_concurrency` per instance, not one: each request's
  worker thread (of the instance's pool) starts its engine call, watches for the client's cancel and ends
  the stream; its engine responses are handled as they arrive by the reader thread of the instance's one
  gRPC stream to the engine (`engine_stream`: why not the Python backend's own BLS calls);
- streamed text coalesced under load (`_StreamOutbox`): the stream's reader only detokenizes, a few
  sender threads send. While a response of a stream is being sent, the text the engine delivers meanwhile
  waits and goes out as one chunk. A response send is a round trip to the server that one stub makes one
  at a time; at a real engine's ~15k tokens/s that, not decoding, is the limit, and coalescing turns it
  into bigger chunks instead of a growing backlog. Unloaded, every token still goes out at once.

A decoupled engine is always asked to stream, without the prompt, so a stop phrase can end generation early
even when the client asked for one non-streamed answer. Deployed non-decoupled (as NVIDIA's with
`decoupled_mode` false), the BLS answers one response per request and asks the engine for one.
"""

from __future__ import annotations

import collections
import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from ...facts.contract import (
    BATCH_INDEX,
    CUM_LOG_PROBS,
    ENGINE_FROM_CLIENT,
    ENGINE_PASSTHROUGH_OUTPUTS,
    EXCLUDE_INPUT_IN_OUTPUT,
    NUM_OUTPUT_TOKENS,
    OUTPUT_IDS,
    OUTPUT_LOG_PROBS,
    RETURN_LOG_PROBS,
    RETURN_NUM_OUTPUT_TOKENS,
    SEQUENCE_INDEX,
    SEQUENCE_LENGTH,
    STOP_WORDS,
    STREAM,
    STREAMING,
    TEXT_INPUT,
    TEXT_OUTPUT,
)
from ...facts.errors import RequestError, ResponseSendError
from ...facts.limits import EngineLimits
from ...facts.model_parameters import CANCELLATION_CHECK_PERIOD_MS
from ..text.detokenization import IncrementalDetokenizer, TokenBytes
from ..text.preprocess import CLIENT_TENSORS, EncodedRequest, Preprocessor
from ..text.stop_phrases import StopPhraseFilter
from ..text.tokenization import decode_utf8
from ..triton_adapter import RequestRows, answer_error, request_inputs, requested_outputs
from .engine_stream import EngineStream

logger = logging.getLogger(__name__)

ENGINE_OUTPUTS = [OUTPUT_IDS, SEQUENCE_LENGTH, CUM_LOG_PROBS, OUTPUT_LOG_PROBS]
# The engine's statistics outputs, passed on to the client as the engine sent them last.
ENGINE_STATISTICS = [t.name for t in ENGINE_PASSTHROUGH_OUTPUTS
                     if t.name not in {CUM_LOG_PROBS, OUTPUT_LOG_PROBS, BATCH_INDEX, SEQUENCE_INDEX,
                                       NUM_OUTPUT_TOKENS}]
CLIENT_TO_ENGINE = {client: engine for engine, client in ENGINE_FROM_CLIENT.items()}
# Inputs the BLS sets itself on every engine request.
FORCED_ENGINE_INPUTS = {STREAMING, EXCLUDE_INPUT_IN_OUTPUT}
CANCEL_CHECK_PERIOD_S = CANCELLATION_CHECK_PERIOD_MS / 1000
SENDER_THREADS = 4  # per instance: they send the coalesced chunks of every stream
# How long finalize waits for the open requests to send their last response once the engine stream is closed
# (each then ends at once with UNAVAILABLE): a bound, so that a stuck request cannot hold the server's exit.
SHUTDOWN_WAIT_S = 5.0
class _Senders:
    """A few threads that send the streams' pending chunks: a plain deque and a condition (a thread pool's
    futures cost more than the send they wrap, once per token)."""

    def __init__(self, threads: int):
        self._ready: collections.deque = collections.deque()  # outboxes with text to send
        self._condition = threading.Condition()
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, name=f"bls-send-{n}", daemon=True) for n in range(threads)]
        for thread in self._threads:
            thread.start()

    def schedule(self, outbox: _StreamOutbox) -> None:
        with self._condition:
            self._ready.append(outbox)
            self._condition.notify()

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._ready and not self._stopping:
                    self._condition.wait()
                if self._stopping:
                    return
                outbox = self._ready.popleft()
            outbox.send_pending()

    def shutdown(self) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify_all()


class _StreamOutbox:
    """One stream's text not yet sent, and whether a sender holds it (at most one at a time, so chunks go
    out in order). `add` is called by the stream's reader thread; a sender takes everything pending."""

    def __init__(self, senders: _Senders, completion: RequestRows, make_response):
        self.senders, self.completion, self.make_response = senders, completion, make_response
        self.condition = threading.Condition()
        self.text: list[str] = []
        self.tokens = 0
        self.busy = False  # queued for or held by a sender
        self.send_failed = False  # a chunk could not be sent: the stream must end with an error, not a gap

    def add(self, text: str, tokens: int) -> None:
        with self.condition:
            self.text.append(text)
            self.tokens += tokens
            if self.busy:
                return  # the sender that holds this stream takes it on its next turn
            self.busy = True
        self.senders.schedule(self)

    def send_pending(self) -> None:
        while True:
            with self.condition:
                if self.send_failed:  # no chunk after a lost one: the stream's reader ends it with an error
                    self.text, self.tokens = [], 0
                if not self.text:
                    self.busy = False
                    self.condition.notify_all()
                    return
                text, tokens = "".join(self.text), self.tokens
                self.text, self.tokens = [], 0
            try:
                sent = self.completion.send(self.make_response(text, tokens))
            except Exception:  # noqa: BLE001 - a response that could not be built: the stream's reader ends it
                logger.exception("could not build a streamed chunk")
                sent = False
            if not sent:
                self.send_failed = True

    def drain(self) -> tuple[str, int]:
        """Wait until no sender holds the stream; return what is left, for the stream's last response."""
        with self.condition:
            self.condition.wait_for(lambda: not self.busy)
            text, tokens = "".join(self.text), self.tokens
            self.text, self.tokens = [], 0
            return text, tokens


@dataclass(frozen=True, kw_only=True)
class BlsSettings:
    """What the orchestrator needs, from the BLS model's typed parameters (their defaults) and its config."""

    tokenizer_dir: str
    limits: EngineLimits
    engine_model: str
    engine_url: str  # the server's gRPC endpoint, where the BLS reaches the engine model
    max_concurrency: int
    add_special_tokens: bool
    decoupled: bool


class BlsOrchestrator:
    def __init__(self, pb_utils, settings: BlsSettings):
        self.pb_utils = pb_utils
        self.settings = settings
        self.preprocessor = Preprocessor(settings.tokenizer_dir, settings.limits, settings.add_special_tokens)
        self.token_bytes = TokenBytes(self.preprocessor.tokenizer)
        self.pool = ThreadPoolExecutor(max_workers=settings.max_concurrency, thread_name_prefix="bls")
        self.senders = _Senders(SENDER_THREADS)
        self.engine = EngineStream(settings.engine_url, settings.engine_model)
        self._running: set = set()  # the rows' futures not yet done

    def submit(self, request) -> None:
        """Called from execute(): parse now (errors answer at once), generate in the pool."""
        sender = request.get_response_sender()
        try:
            inputs = request_inputs(request)
            encoded = self.preprocessor.encode(inputs, CLIENT_TENSORS)
            batch = encoded.batch
            stop_phrases = self._stop_phrases(inputs, batch)
            stream = _flag(inputs, STREAM)
            exclude_input = _flag(inputs, EXCLUDE_INPUT_IN_OUTPUT, default=True)
            if not self.settings.decoupled and (stream or batch > 1):
                raise RequestError(STREAM if stream else TEXT_INPUT,
                                   "streaming and batched requests need the BLS deployed decoupled "
                                   "(build with streaming enabled)")
        except Exception as error:  # noqa: BLE001 - the client gets the error, the model keeps serving
            answer_error(self.pb_utils, sender, error)
            return
        completion = RequestRows(self.pb_utils, sender, batch, requested_outputs(request), CANCEL_CHECK_PERIOD_S)
        for row in range(batch):
            future = self.pool.submit(self._run_row, inputs, encoded, row, stop_phrases[row], stream, exclude_input,
                                      completion)
            self._running.add(future)
            future.add_done_callback(self._running.discard)
            future.add_done_callback(_log_failure)

    def _stop_phrases(self, inputs: dict[str, np.ndarray], batch: int) -> list[list[str]]:
        value = inputs.get(STOP_WORDS)
        if value is None:
            return [[] for _ in range(batch)]
        rows = value.reshape(value.shape[0], -1)
        return [[decode_utf8(STOP_WORDS, item) for item in rows[row]] for row in range(batch)]

    def _engine_inputs(self, inputs: dict[str, np.ndarray], encoded: EncodedRequest, row: int
                       ) -> dict[str, np.ndarray]:
        tensors = {**encoded.engine_inputs(row), STREAMING: np.array([[self.settings.decoupled]]),
                   EXCLUDE_INPUT_IN_OUTPUT: np.array([[True]])}
        for client_name, engine_name in CLIENT_TO_ENGINE.items():
            value = inputs.get(client_name)
            if value is not None and engine_name not in FORCED_ENGINE_INPUTS:
                if value.ndim == 1:  # an input NVIDIA's BLS config reshapes to a scalar: [B] → [B, 1]
                    value = value.reshape(-1, 1)
                tensors[engine_name] = value[row:row + 1] if value.shape[0] > 1 else value
        return tensors

    def _stop_engine(self, request_id: str) -> None:
        """Stop the engine's request through its `stop` input (how NVIDIA's clients cancel one request of a
        stream). A non-decoupled engine has always finished by the time the BLS could ask."""
        if self.settings.decoupled:
            self.engine.stop(request_id)

    def _run_row(self, inputs, encoded: EncodedRequest, row: int, stop_phrases: list[str], stream: bool,
                 exclude_input: bool, completion: RequestRows) -> None:
        request_id = uuid.uuid4().hex
        batch = encoded.batch
        detokenizer = IncrementalDetokenizer(self.token_bytes)
        stop_filter = StopPhraseFilter(stop_phrases)
        return_log_probs = _flag(inputs, RETURN_LOG_PROBS)
        count_tokens = _flag(inputs, RETURN_NUM_OUTPUT_TOKENS)
        pieces: list[str] = []
        log_probs: list[float] = []
        wanted_statistics = self._wanted_statistics(completion)
        statistics: dict[str, np.ndarray] = {}  # the engine's last statistics outputs
        tokens_unsent = 0  # generated tokens not yet reported in a response (num_output_tokens)
        stopped_engine = False

        def streamed_response(text: str, tokens: int):
            return self._response(completion, text, row, batch, list(log_probs) if return_log_probs else None,
                                  dict(statistics), tokens if count_tokens else None)

        outbox = _StreamOutbox(self.senders, completion, streamed_response)

        def on_response(tensors: dict[str, np.ndarray]) -> None:
            """One engine response, in the engine stream's reader thread: detokenize, hand text to the outbox."""
            nonlocal tokens_unsent, stopped_engine
            ids_tensor = tensors.get(OUTPUT_IDS)
            if ids_tensor is None:  # a response without tokens
                return
            ids = ids_tensor.reshape(-1)
            length = int(tensors[SEQUENCE_LENGTH].reshape(-1)[0])
            tokens_unsent += length
            for name in wanted_statistics:
                value = tensors.get(name)
                if value is not None:
                    statistics[name] = value
            if return_log_probs:
                log_probs.extend(tensors[OUTPUT_LOG_PROBS].reshape(-1)[:length].tolist())
            if stopped_engine:
                return
            text = stop_filter.push(detokenizer.push(ids[:length].tolist()))
            if stream and text:
                outbox.add(text, tokens_unsent)
                tokens_unsent = 0
            elif text:
                pieces.append(text)
            if outbox.send_failed:
                raise ResponseSendError()
            if stop_filter.stopped:
                self._stop_engine(request_id)
                stopped_engine = True

        try:
            # A non-decoupled engine answers once, with every token; a decoupled one streams. This thread
            # only watches for the client's cancel meanwhile (an IPC round trip, kept off the reader).
            engine_call = self.engine.call(request_id, self._engine_inputs(inputs, encoded, row),
                                           [*ENGINE_OUTPUTS, *wanted_statistics], on_response)
            while not engine_call.wait(CANCEL_CHECK_PERIOD_S):
                if not stopped_engine and completion.cancelled():
                    self._stop_engine(request_id)
                    stopped_engine = True
            unsent, unsent_tokens = outbox.drain()
            if outbox.send_failed:  # one of the last chunks: still an error, not a stream with a gap
                stopped_engine = True  # the engine has already finished this request
                raise ResponseSendError()
            tokens_unsent += unsent_tokens
            tail = unsent + stop_filter.push(detokenizer.flush()) + stop_filter.flush()
            if not exclude_input and not stream:
                prompt = self.token_bytes.decode_sequence(encoded.prompt_ids[row])
                pieces.insert(0, prompt.decode("utf-8", errors="replace"))
            if not stream:
                completion.send(self._response(completion, "".join(pieces) + tail, row, batch,
                                               log_probs if return_log_probs else None, statistics,
                                               tokens_unsent if count_tokens else None), row_done=True)
            elif tail or (count_tokens and tokens_unsent):
                completion.send(self._response(completion, tail, row, batch, None, statistics,
                                               tokens_unsent if count_tokens else None), row_done=True)
            else:
                completion.send(row_done=True)
        except Exception as error:  # noqa: BLE001 - the stream must always end, with the error
            outbox.drain()  # no chunk may follow the final response
            if not stopped_engine:
                try:
                    self._stop_engine(request_id)
                except Exception:  # noqa: BLE001
                    logger.exception("could not stop engine request %s", request_id)
            completion.send(completion.error_response(error), row_done=True)

    @staticmethod
    def _wanted_statistics(completion: RequestRows) -> list[str]:
        requested = completion.requested
        return [name for name in ENGINE_STATISTICS if requested is None or name in requested]

    def _response(self, completion: RequestRows, text: str, row: int, batch: int, log_probs: list[float] | None,
                  statistics: dict[str, np.ndarray], new_tokens: int | None):
        """One response to the client, shaped as NVIDIA's BLS answers: `text_output` flat (one string),
        `batch_index` only for a batched request, the engine's statistics as it sent them last."""
        outputs = {TEXT_OUTPUT: np.array([text.encode("utf-8")], dtype=object), **statistics}
        if batch > 1:
            outputs[BATCH_INDEX] = np.array([[row]], dtype=np.int32)
        if new_tokens is not None:
            outputs[NUM_OUTPUT_TOKENS] = np.array([[new_tokens]], dtype=np.int32)
        if log_probs is not None:
            outputs[OUTPUT_LOG_PROBS] = np.array(log_probs, dtype=np.float32).reshape(1, 1, -1)
            outputs[CUM_LOG_PROBS] = np.array([[sum(log_probs)]], dtype=np.float32)
        return completion.response(outputs)

    def shutdown(self) -> None:
        """Called by finalize, as the server stops: close the stream to the engine first, which ends every open
        request with an error that its row sends to its client while the stub can still send, and never leave
        the stream to the server's own gRPC endpoint open while the server waits to exit."""
        self.engine.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        running = self._running.copy()  # atomic: the rows' threads discard from it as they end
        if running:
            _, left = wait(running, timeout=SHUTDOWN_WAIT_S)
            if left:
                logger.warning("%d BLS requests did not end within %.0f s of the shutdown", len(left),
                               SHUTDOWN_WAIT_S)
        self.senders.shutdown()


def _log_failure(future) -> None:
    """A row that failed even to report its failure (its final response could not be sent): at least the
    server's log says so (a pool thread's exception is otherwise kept in a future nobody reads)."""
    if not future.cancelled() and future.exception() is not None:
        logger.error("a BLS request could not be ended", exc_info=future.exception())


def _flag(inputs: dict[str, np.ndarray], name: str, default: bool = False) -> bool:
    value = inputs.get(name)
    return default if value is None else bool(np.asarray(value).reshape(-1)[0])
