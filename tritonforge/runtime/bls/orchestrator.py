"""The `tensorrt_llm_bls` model's logic: one decoupled model doing tokenize → engine → detokenize.

Same client contract as the ensemble, with what the ensemble cannot do:
- per-request incremental detokenization: every streamed chunk is complete UTF-8 characters;
- string-level stop phrases (held back until decided, never emitted), which then stop the engine's request
  through its `stop` input so its slot frees; a client's cancel does the same;
- many requests per instance, so concurrency is `max_concurrency` per instance, not one: each row of a
  request is a `RowStream` (row_stream.py, which says which thread owns what) run by a worker thread of the
  instance's pool, which starts its engine call, watches for the client's cancel and ends the row; its
  engine responses are handled as they arrive by the reader thread of the instance's one gRPC stream to the
  engine (`engine_stream`: why not the Python backend's own BLS calls);
- streamed text coalesced under load (`runtime/sending.py`): the stream's reader only detokenizes, a few
  sender threads send. While a response of a stream is being sent, the text the engine delivers meanwhile
  waits and goes out as one chunk. A response send is a round trip to the server that one stub makes one
  at a time; at a real engine's ~15k tokens/s that, not decoding, is the limit, and coalescing turns it
  into bigger chunks instead of a growing backlog. Unloaded, every token still goes out at once; a client that
  wants fewer, larger chunks sends `stream_interval` N: after the first, a chunk waits for N engine responses.

A decoupled engine is always asked to stream, without the prompt, so a stop phrase can end generation early
even when the client asked for one non-streamed answer. Deployed non-decoupled (as NVIDIA's with
`decoupled_mode` false), the BLS answers one response per request and asks the engine for one.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from ...facts.contract import (
    BLS_ENGINE_STATISTICS,
    CUM_LOG_PROBS,
    ENGINE_FROM_CLIENT,
    EXCLUDE_INPUT_IN_OUTPUT,
    NUM_TOP_LOG_PROBS,
    OUTPUT_IDS,
    OUTPUT_LOG_PROBS,
    PROMPT_LOG_PROBS,
    PROMPT_TOP_LOG_PROBS,
    PROMPT_TOP_TOKEN_IDS,
    RETURN_LOG_PROBS,
    RETURN_NUM_OUTPUT_TOKENS,
    RETURN_PROMPT_LOG_PROBS,
    SEQUENCE_LENGTH,
    STOP_WORDS,
    STREAM,
    STREAM_INTERVAL,
    STREAMING,
    TEXT_INPUT,
    TOP_LOG_PROBS,
    TOP_TOKEN_IDS,
)
from ...facts.environment import MODEL_DRAIN_END_S
from ...facts.errors import RequestError, ServerStopping
from ...facts.limits import EngineLimits
from ..sending import Senders
from ..text.detokenization import TokenBytes
from ..text.preprocess import CLIENT_TENSORS, EncodedRequest, Preprocessor
from ..text.tokenization import decode_utf8
from ..triton_adapter import RequestRows, answer_error, request_inputs, requested_outputs
from .engine_stream import EngineStream
from .row_stream import CANCEL_CHECK_PERIOD_S, RowRequest, RowStream
from .token_log import requested_top_log_probs

logger = logging.getLogger(__name__)

ENGINE_OUTPUTS = [OUTPUT_IDS, SEQUENCE_LENGTH, CUM_LOG_PROBS, OUTPUT_LOG_PROBS]
TOP_LOG_PROB_OUTPUTS = [TOP_TOKEN_IDS, TOP_LOG_PROBS]
PROMPT_LOG_PROB_OUTPUTS = [PROMPT_LOG_PROBS, PROMPT_TOP_TOKEN_IDS, PROMPT_TOP_LOG_PROBS]
ENGINE_STATISTICS = BLS_ENGINE_STATISTICS  # passed on to the client as the engine sent them last
CLIENT_TO_ENGINE = {client: engine for engine, client in ENGINE_FROM_CLIENT.items()}
# Inputs the BLS sets itself on every engine request.
FORCED_ENGINE_INPUTS = {STREAMING, EXCLUDE_INPUT_IN_OUTPUT}
SENDER_THREADS = 4  # per instance: they send the coalesced chunks of every stream
# How long finalize waits for the open requests to send their last response once the engine stream is closed
# (each then ends at once with UNAVAILABLE): a bound, so that a stuck request cannot hold the server's exit.
SHUTDOWN_WAIT_S = 5.0
DRAIN_POLL_S = 0.5  # while draining, how often rows that came since are looked for
SENDERS_CLOSE_S = 1.0  # then, how long the senders may take to send what they still hold


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
    """The BLS's requests in, each row run as a `RowStream` on a worker of the pool; one stream to the engine
    and a few senders shared by every row of the instance."""

    def __init__(self, pb_utils, settings: BlsSettings, engine: EngineStream | None = None):
        self.pb_utils = pb_utils
        self.settings = settings
        self.preprocessor = Preprocessor(settings.tokenizer_dir, settings.limits, settings.add_special_tokens)
        self.token_bytes = TokenBytes(self.preprocessor.tokenizer)
        self.pool = ThreadPoolExecutor(max_workers=settings.max_concurrency, thread_name_prefix="bls")
        # A row is queued at most once and holds its worker until its last response is sent: at most
        # `max_concurrency` rows wait for a sender, so the stream's reader never waits for room.
        self.senders = Senders(SENDER_THREADS, depth=settings.max_concurrency, name="bls-send")
        self.engine = engine if engine is not None else EngineStream(settings.engine_url, settings.engine_model)
        self._running: dict = {}  # the rows' futures not yet done, and their rows
        self._server_stopping = False  # the stop's deadline passed: requests are refused

    def submit(self, request) -> None:
        """Called from execute(): parse now (errors answer at once), run the rows in the pool."""
        sender = request.get_response_sender()
        requested = requested_outputs(request)
        try:
            if self._server_stopping:
                raise ServerStopping()
            rows = self._rows(request_inputs(request), requested)
        except Exception as error:  # noqa: BLE001 - the client gets the error, the model keeps serving
            answer_error(self.pb_utils, sender, error)
            return
        completion = RequestRows(self.pb_utils, sender, len(rows), requested, CANCEL_CHECK_PERIOD_S)
        for row in rows:
            stream = RowStream(row, completion, self.engine, self.token_bytes, self.senders,
                               engine_stoppable=self.settings.decoupled)
            future = self.pool.submit(stream.run)
            self._running[future] = stream
            future.add_done_callback(lambda done: self._running.pop(done, None))
            future.add_done_callback(_log_failure)

    def drain(self, deadline: float) -> None:
        """The server is stopping (triton_adapter.start_heartbeat calls this): open rows run until `deadline`
        (time.monotonic); the rest then end with ServerStopping, their engine requests stopped, and so does any
        request that comes later. Returns once none is open, or MODEL_DRAIN_END_S later."""
        while self._running and time.monotonic() < deadline:
            wait(list(self._running), timeout=min(deadline - time.monotonic(), DRAIN_POLL_S))
        self._server_stopping = True
        open_rows = dict(self._running)  # atomic: the rows' threads remove theirs as they end
        if not open_rows:
            return
        logger.warning("the server is stopping: ending %d open BLS requests", len(open_rows))
        for stream in open_rows.values():
            stream.end_for_server()
        wait(list(open_rows), timeout=MODEL_DRAIN_END_S)

    def _rows(self, inputs: dict[str, np.ndarray], requested: frozenset[str] | None) -> list[RowRequest]:
        encoded = self.preprocessor.encode(inputs, CLIENT_TENSORS)
        batch = encoded.batch
        stop_phrases = self._stop_phrases(inputs, batch)
        stream = _flag(inputs, STREAM)
        if not self.settings.decoupled and (stream or batch > 1):
            raise RequestError(STREAM if stream else TEXT_INPUT,
                               "streaming and batched requests need the BLS deployed decoupled "
                               "(build with streaming enabled)")
        intervals = _stream_intervals(inputs, batch)
        exclude_input = _flag(inputs, EXCLUDE_INPUT_IN_OUTPUT, default=True)
        return_log_probs, count_tokens = _flag(inputs, RETURN_LOG_PROBS), _flag(inputs, RETURN_NUM_OUTPUT_TOKENS)
        prompt = _flag(inputs, RETURN_PROMPT_LOG_PROBS)
        top = requested_top_log_probs(inputs, prompt)
        statistics = [name for name in ENGINE_STATISTICS if requested is None or name in requested]
        engine_outputs = [*ENGINE_OUTPUTS, *statistics, *(TOP_LOG_PROB_OUTPUTS if top else []),
                          *(PROMPT_LOG_PROB_OUTPUTS if prompt else [])]
        return [RowRequest(row=row, batch=batch, engine_inputs=self._engine_inputs(inputs, encoded, row, top, prompt),
                           engine_outputs=engine_outputs, prompt_ids=encoded.prompt_ids[row],
                           stop_phrases=stop_phrases[row], stream=stream, exclude_input=exclude_input,
                           return_log_probs=return_log_probs, count_tokens=count_tokens, statistics=statistics,
                           stream_interval=intervals[row], num_top_log_probs=top, prompt_log_probs=prompt)
                for row in range(batch)]

    def _stop_phrases(self, inputs: dict[str, np.ndarray], batch: int) -> list[list[str]]:
        value = inputs.get(STOP_WORDS)
        if value is None:
            return [[] for _ in range(batch)]
        rows = value.reshape(value.shape[0], -1)
        return [[decode_utf8(STOP_WORDS, item) for item in rows[row]] for row in range(batch)]

    def _engine_inputs(self, inputs: dict[str, np.ndarray], encoded: EncodedRequest, row: int, top: int | None,
                       prompt: bool) -> dict[str, np.ndarray]:
        tensors = {**encoded.engine_inputs(row), STREAMING: np.array([[self.settings.decoupled]]),
                   EXCLUDE_INPUT_IN_OUTPUT: np.array([[True]])}
        for client_name, engine_name in CLIENT_TO_ENGINE.items():
            value = inputs.get(client_name)
            if value is not None and engine_name not in FORCED_ENGINE_INPUTS:
                if value.ndim == 1:  # an input NVIDIA's BLS config reshapes to a scalar: [B] → [B, 1]
                    value = value.reshape(-1, 1)
                tensors[engine_name] = value[row:row + 1] if value.shape[0] > 1 else value
        if top is not None:  # the token log: every token's log prob, and `top` alternatives where asked
            tensors[RETURN_LOG_PROBS] = np.array([[True]])
            if top:
                tensors[NUM_TOP_LOG_PROBS] = np.array([[top]], dtype=np.int32)
            if prompt:
                tensors[RETURN_PROMPT_LOG_PROBS] = np.array([[True]])
        return tensors

    def shutdown(self) -> None:
        """Called by finalize, as the server stops: close the stream to the engine first, which ends every open
        request with an error that its row sends to its client while the stub can still send, and never leave
        the stream to the server's own gRPC endpoint open while the server waits to exit."""
        self.engine.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        running = list(self._running)  # atomic: the rows' threads remove theirs as they end
        if running:
            _, left = wait(running, timeout=SHUTDOWN_WAIT_S)
            if left:
                logger.warning("%d BLS requests did not end within %.0f s of the shutdown", len(left),
                               SHUTDOWN_WAIT_S)
        self.senders.close(SENDERS_CLOSE_S)


def _log_failure(future) -> None:
    """A row that failed even to report its failure (its final response could not be sent): at least the
    server's log says so (a pool thread's exception is otherwise kept in a future nobody reads)."""
    if not future.cancelled() and future.exception() is not None:
        logger.error("a BLS request could not be ended", exc_info=future.exception())


def _stream_intervals(inputs: dict[str, np.ndarray], batch: int) -> list[int]:
    """Each row's `stream_interval`: one value for every row, or one per row; 1 when not sent."""
    value = inputs.get(STREAM_INTERVAL)
    if value is None:
        return [1] * batch
    values = [int(item) for item in np.asarray(value).reshape(-1)]
    if len(values) not in (1, batch):
        raise RequestError(STREAM_INTERVAL, f"has {len(values)} values, the request has {batch} rows")
    for interval in values:
        if interval < 1:
            raise RequestError(STREAM_INTERVAL, f"must be >= 1, got {interval}")
    return values * batch if len(values) == 1 else values


def _flag(inputs: dict[str, np.ndarray], name: str, default: bool = False) -> bool:
    """The input's first value; `default` when it is absent or empty (as the C++ BLS's `Flag`)."""
    value = inputs.get(name)
    return default if value is None or value.size == 0 else bool(np.asarray(value).reshape(-1)[0])
