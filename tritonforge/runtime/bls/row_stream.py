"""One row of a BLS request, from its engine call to its last response (`RowStream`).

The row's engine request streams tokens back; they become whole UTF-8 characters (`IncrementalDetokenizer`),
lose their stop phrases (`StopPhraseFilter`), and go to the client as they come (a streaming request) or in one
answer at its end. A stop phrase, a client that goes away or an error stops the engine's request (its `stop`
input), so that its slot frees; an error ends only this row, with an error response.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...facts.contract import (
    BATCH_INDEX,
    CUM_LOG_PROBS,
    NUM_OUTPUT_TOKENS,
    OUTPUT_IDS,
    OUTPUT_LOG_PROBS,
    SEQUENCE_LENGTH,
    TEXT_OUTPUT,
)
from ...facts.errors import ResponseSendError, ServerStopping
from ...facts.model_parameters import CANCELLATION_CHECK_PERIOD_MS
from ..sending import Outbox, Senders
from ..text.detokenization import IncrementalDetokenizer, TokenBytes
from ..text.stop_phrases import StopPhraseFilter
from ..triton_adapter import RequestRows
from .engine_stream import EngineStream
from .token_log import TokenLog

logger = logging.getLogger(__name__)

CANCEL_CHECK_PERIOD_S = CANCELLATION_CHECK_PERIOD_MS / 1000


@dataclass(frozen=True, kw_only=True)
class RowRequest:
    """What one row of a client's request asks, parsed before the row starts."""

    row: int  # its index in the request
    batch: int  # the request's rows
    engine_inputs: dict[str, np.ndarray]  # the engine request's tensors
    engine_outputs: list[str]  # what the engine is asked to send back
    prompt_ids: list[int]  # echoed in a whole answer unless `exclude_input`
    stop_phrases: list[str]
    stream: bool
    exclude_input: bool
    return_log_probs: bool
    count_tokens: bool  # return_num_output_tokens
    statistics: list[str]  # the engine's statistics outputs passed on to the client, as it sent them last
    stream_interval: int = 1  # engine responses per streamed response after the first
    num_top_log_probs: int | None = None  # each token's log prob and this many alternatives per response (None: no)
    prompt_log_probs: bool = False  # the prompt's tokens first in the token log (return_prompt_log_probs)


class _Chunk(NamedTuple):
    """Streamed text on its way to a sender, with what its response reports, copied as it was made."""

    text: str
    tokens: int  # generated tokens not reported before (num_output_tokens)
    log_probs: list[float] | None  # every log prob so far (return_log_probs)
    statistics: dict[str, np.ndarray]
    token_mark: int  # the tokens of the token log up to here go out with this chunk (num_top_log_probs)


class RowStream:
    """One row: its engine call, its text and its responses.

    Threads, and what each owns:
    - a worker of the orchestrator's pool runs `run`: it starts the engine call and, until the call is over,
      asks the client's sender whether the client went away (an IPC round trip, kept off the reader); then it
      takes the text state over, flushes it, and hands the row's last step to the outbox. `run` returns once
      the last response is sent.
    - the engine stream's reader runs `_on_engine_response` for each engine response while the call is open,
      and owns the text state then: detokenizer, stop filter, a whole answer's pieces, the log probs, the
      engine's statistics and the tokens not yet reported. The call's end (`EngineCall.wait`) hands the text
      state to the worker: the reader never calls back after it.
    - a sender of the instance (`sending.Senders`) runs `_send_chunk` and `_send_last`, one at a time, in order.
      It reads only what crosses through the outbox's lock: the `_Chunk`s (copies, not the live state), and
      for the last step, the text state and `_error` the worker handed over.
    - `_engine_stopped` is written by the reader (a stop phrase) and the worker (a cancel, an error), under
      `_stop_lock`, once; the reader reads it to drop the text that follows. `outbox.failed` is written by a
      sender (a send failed) and read by the reader, which then ends the engine call.
    """

    def __init__(self, request: RowRequest, completion: RequestRows, engine: EngineStream, token_bytes: TokenBytes,
                 senders: Senders, *, engine_stoppable: bool):
        self.request = request
        self.completion = completion  # the client's request, shared by its rows
        self.engine = engine
        self.engine_stoppable = engine_stoppable  # a decoupled engine; one that is not has always finished
        self.request_id = uuid.uuid4().hex  # the engine request's
        self.token_bytes = token_bytes
        self.outbox: Outbox[_Chunk] = Outbox(senders, self._send_chunk, interval=request.stream_interval)
        # The text state: the reader's while the engine call is open, then the worker's, then the last step's.
        self._detokenizer = IncrementalDetokenizer(token_bytes)
        self._stop_filter = StopPhraseFilter(request.stop_phrases)
        self._pieces: list[str] = []  # a whole answer's text
        self._log_probs: list[float] = []
        self._tokens = None if request.num_top_log_probs is None else TokenLog(
            request.num_top_log_probs, token_bytes, request.prompt_ids if request.prompt_log_probs else None)
        self._statistics: dict[str, np.ndarray] = {}
        self._unreported = 0  # generated tokens not yet reported in a response
        self._responses = 0  # engine responses since the last chunk
        self._tail = ""  # what the detokenizer and the stop filter held at the end
        self._error: Exception | None = None  # what ended the row early
        self._stop_lock = threading.Lock()
        self._engine_stopped = False
        self._ended = threading.Event()  # the last response was sent (or could not be made)

    # --- the worker ----------------------------------------------------------------------------------------------

    def run(self) -> None:
        """The row from its engine call to its last response; returns once that is sent."""
        try:
            self._generate()
            self._tail = self._stop_filter.push(self._detokenizer.flush()) + self._stop_filter.flush()
        except Exception as error:  # noqa: BLE001 - the row must always end, with the error
            self._error = error
            self._stop_engine()
        self.outbox.end(self._send_last)
        self._ended.wait()

    def _generate(self) -> None:
        """Run the engine call to its end, stopping it if the client goes away; raises what ended it early.
        A non-decoupled engine answers once, with every token; a decoupled one streams."""
        call = self.engine.call(self.request_id, self.request.engine_inputs, self.request.engine_outputs,
                                self._on_engine_response)
        while not call.wait(CANCEL_CHECK_PERIOD_S):
            if not self._engine_stopped and self.completion.cancelled():
                self._stop_engine()

    def _stop_engine(self) -> None:
        """Stop the engine's request through its `stop` input (how NVIDIA's clients cancel one request of a
        stream), once, from whichever thread asks first. A stop that cannot be sent is logged: the engine then
        runs the request to its end."""
        with self._stop_lock:
            if self._engine_stopped:
                return
            self._engine_stopped = True
        if not self.engine_stoppable:
            return
        try:
            self.engine.stop(self.request_id)
        except Exception:  # noqa: BLE001 - the row still ends; only the engine's slot frees later
            logger.exception("could not stop engine request %s", self.request_id)

    def end_for_server(self) -> None:
        """The server's stop came with this row open (the orchestrator's drain): its engine call ends now with
        ServerStopping, which `run` sends as the row's last response, and its engine request is stopped (NVIDIA's
        engine reads no stop of ours)."""
        self.engine.end(self.request_id, ServerStopping())
        self._stop_engine()

    # --- the engine stream's reader ------------------------------------------------------------------------------

    def _on_engine_response(self, tensors: dict[str, np.ndarray]) -> None:
        """One engine response: count it, detokenize it, hand the text on; raising ends the engine call."""
        ids = tensors.get(OUTPUT_IDS)
        if ids is None:  # a response without tokens
            return
        length = int(tensors[SEQUENCE_LENGTH].reshape(-1)[0])
        self._count(tensors, length)
        if self._engine_stopped:  # after a stop phrase or a cancel: counted, never shown
            return
        tokens = ids.reshape(-1)[:length].tolist()
        if self._tokens is not None:
            self._tokens.extend(tokens, tensors)
        self._emit(self._stop_filter.push(self._detokenizer.push(tokens)))
        if self.outbox.failed:  # the client missed a chunk: end with an error, not a stream with a gap
            raise ResponseSendError()
        if self._stop_filter.stopped:
            self._stop_engine()

    def _count(self, tensors: dict[str, np.ndarray], length: int) -> None:
        self._unreported += length
        self._responses += 1
        for name in self.request.statistics:
            value = tensors.get(name)
            if value is not None:
                self._statistics[name] = value
        if self.request.return_log_probs:
            self._log_probs.extend(tensors[OUTPUT_LOG_PROBS].reshape(-1)[:length].tolist())

    def _emit(self, text: str) -> None:
        if not text:
            return
        if not self.request.stream:
            self._pieces.append(text)
            return
        log_probs = list(self._log_probs) if self.request.return_log_probs else None
        # Sized in engine responses: the stream interval's unit.
        self.outbox.add(_Chunk(text, self._unreported, log_probs, dict(self._statistics),
                               len(self._tokens) if self._tokens is not None else 0), size=self._responses)
        self._unreported = self._responses = 0

    # --- a sender ------------------------------------------------------------------------------------------------

    def _send_chunk(self, chunks: list[_Chunk]) -> bool:
        """The streamed text that waited for this send, as one response."""
        latest = chunks[-1]
        return self.completion.send(self._response("".join(chunk.text for chunk in chunks), latest.log_probs,
                                                   latest.statistics, sum(chunk.tokens for chunk in chunks),
                                                   latest.token_mark))

    def _send_last(self, rest: list[_Chunk]) -> None:
        """The row's last response, after every chunk before it: the rest of the text, or the error."""
        try:
            self.completion.send(self._last_response(rest), row_done=True)
        except Exception as error:  # noqa: BLE001 - a last response that could not be built: still an end
            self.completion.send(self.completion.error_response(error), row_done=True)
        finally:
            self._ended.set()

    def _last_response(self, rest: list[_Chunk]):
        """The row's last response; None: the final flag alone (a stream with nothing left to say)."""
        error = self._error or (ResponseSendError() if self.outbox.failed else None)
        if error is not None:
            return self.completion.error_response(error)
        tail = "".join(chunk.text for chunk in rest) + self._tail
        tokens = sum(chunk.tokens for chunk in rest) + self._unreported
        if not self.request.stream:
            prompt = "" if self.request.exclude_input else self.token_bytes.decode_sequence(
                self.request.prompt_ids).decode("utf-8", errors="replace")
            return self._response(prompt + "".join(self._pieces) + tail,
                                  self._log_probs if self.request.return_log_probs else None, self._statistics, tokens)
        if tail or (self.request.count_tokens and tokens) or (self._tokens is not None and self._tokens.unsent):
            return self._response(tail, None, self._statistics, tokens)
        return None

    def _response(self, text: str, log_probs: list[float] | None, statistics: dict[str, np.ndarray], tokens: int,
                  token_mark: int | None = None):
        """A response of this row; with a token log, the tokens past those sent up to `token_mark` (None: all)."""
        response_tokens = None if self._tokens is None else self._tokens.outputs(token_mark)
        return client_response(self.completion, text, row=self.request.row, batch=self.request.batch,
                               log_probs=log_probs, statistics=statistics,
                               new_tokens=tokens if self.request.count_tokens else None, tokens=response_tokens)


def client_response(completion: RequestRows, text: str, *, row: int, batch: int, log_probs: list[float] | None,
                    statistics: dict[str, np.ndarray], new_tokens: int | None,
                    tokens: dict[str, np.ndarray] | None = None):
    """One response to the client, shaped as NVIDIA's BLS answers: `text_output` flat (one string),
    `batch_index` only for a batched request, the engine's statistics as it sent them last; ours, the tokens
    it adds (`TokenLog.outputs`) for a request with `num_top_log_probs`."""
    outputs = {TEXT_OUTPUT: np.array([text.encode("utf-8")], dtype=object), **statistics, **(tokens or {})}
    if batch > 1:
        outputs[BATCH_INDEX] = np.array([[row]], dtype=np.int32)
    if new_tokens is not None:
        outputs[NUM_OUTPUT_TOKENS] = np.array([[new_tokens]], dtype=np.int32)
    if log_probs is not None:
        outputs[OUTPUT_LOG_PROBS] = np.array(log_probs, dtype=np.float32).reshape(1, 1, -1)
        outputs[CUM_LOG_PROBS] = np.array([[sum(log_probs)]], dtype=np.float32)
    return completion.response(outputs)
