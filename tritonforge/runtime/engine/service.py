"""An engine behind the `tensorrt_llm` I/O contract: requests in, responses out.

Run by the engine models' `1/model.py` (`EngineModel`: transformers, PyTorch and the benchmarking replay
engine) with the `pb_utils` module and an engine (`InflightBatchingEngine`, `LlmApiEngine` or `ReplayEngine`);
answers like the `tensorrtllm` backend: non-streaming responses carry the prompt unless
`exclude_input_in_output`, streaming responses carry only new tokens, a batched request answers one response
per row tagged with `batch_index`, and a request with `stop=true` cancels the running request that has the
same request id.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...facts.contract import (
    ACCEPTANCE_RATE,
    ARRIVAL_TIME_NS,
    BATCH_INDEX,
    CUM_LOG_PROBS,
    FIRST_SCHEDULED_TIME_NS,
    FIRST_TOKEN_TIME_NS,
    INPUT_IDS,
    KV_CACHE_ALLOC_NEW_BLOCKS,
    KV_CACHE_ALLOC_TOTAL_BLOCKS,
    KV_CACHE_REUSED_BLOCKS,
    LAST_TOKEN_TIME_NS,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    OUTPUT_IDS,
    OUTPUT_LOG_PROBS,
    PROMPT_LOG_PROBS,
    PROMPT_TOP_LOG_PROBS,
    PROMPT_TOP_TOKEN_IDS,
    SEQUENCE_LENGTH,
    STOP,
    STREAM,
    TOP_LOG_PROBS,
    TOP_TOKEN_IDS,
    TOTAL_ACCEPTED_DRAFT_TOKENS,
    TOTAL_DRAFT_TOKENS,
)
from ...facts.environment import MODEL_DRAIN_END_S
from ...facts.errors import RequestError, ResponseSendError, ServerStopping
from ...facts.limits import EngineLimits
from ...facts.model_parameters import CANCELLATION_CHECK_PERIOD_MS, EngineParameters, TransformersEngineParameters
from ..sending import Outbox, Senders
from ..triton_adapter import (
    RequestRows,
    answer_error,
    is_decoupled,
    request_inputs,
    requested_outputs,
    resolve_path,
    send_final,
    start_heartbeat,
)
from .generation import GenerationRequest, GenerationResult, TopTokens
from .lora import AdapterRecord, records_from_parameter
from .requests import EngineRow, is_stop_request, parse_engine_request
from .stop_board import StopBoard

logger = logging.getLogger(__name__)

REQUIRED_OUTPUTS = frozenset({OUTPUT_IDS, SEQUENCE_LENGTH})
SENDERS_CLOSE_S = 5.0  # how long shutdown waits for the sender threads to send what they hold
# Rows waiting for a sender before the engine's thread waits for one (two 128-row steps' worth): a server that
# takes responses slower than the engine makes them slows the engine instead of a queue without bound.
SEND_QUEUE_DEPTH = 256


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """What the engine service needs, from the engine model's typed parameters and its config."""

    limits: EngineLimits
    model_path: str = ""  # the transformers checkpoint, absolute; unused by the replay engine
    tokenizer_dir: str = ""  # the model's tokenizer, absolute, for guided decoding; "" where the build named none
    dtype: str = "auto"  # auto | float32 | float16 | bfloat16
    device: str = "auto"  # auto | cpu | cuda | cuda:N (where Triton placed the instance on GPU N)
    tensor_parallel_size: int = 1  # transformers engine: ranks over `device` and the devices after it
    instances: int = 1  # the engine model's instances (several: stops go through a StopBoard)
    exclude_input_in_output: bool = True
    cancellation_check_period_ms: int = CANCELLATION_CHECK_PERIOD_MS
    decoupled: bool = True
    stream_interval: int = 1  # streamed tokens per response after the first (model_parameters.EngineParameters)
    response_lanes: int = EngineParameters.response_lanes  # sender threads (runtime/sending.py); 0: the engine's
    bos_token_id: int | None = None  # the checkpoint's (config.json): see `streamed_responses`
    # transformers and tensorrtllm-pytorch engines: their LoRA adapters, paths absolute
    lora_adapters: tuple[AdapterRecord, ...] = ()

    @classmethod
    def from_parameters(cls, parameters: EngineParameters, *, decoupled: bool, max_queue_size: int,
                        model_path: str = "", tokenizer_dir: str = "") -> EngineSettings:
        transformers = isinstance(parameters, TransformersEngineParameters)
        return cls(
            model_path=model_path,
            tokenizer_dir=tokenizer_dir,
            limits=EngineLimits(max_batch_size=parameters.max_batch_size, max_input_len=parameters.max_input_len,
                                max_seq_len=parameters.max_seq_len, max_queue_size=max_queue_size),
            dtype=parameters.dtype if transformers else "auto",
            device=parameters.device if transformers else "auto",
            tensor_parallel_size=parameters.tensor_parallel_size if transformers else 1,
            exclude_input_in_output=parameters.exclude_input_in_output,
            cancellation_check_period_ms=parameters.cancellation_check_period_ms,
            decoupled=decoupled,
            stream_interval=parameters.stream_interval,
            response_lanes=parameters.response_lanes,
            bos_token_id=checkpoint_bos_token_id(model_path) if model_path else None,
            lora_adapters=tuple(records_from_parameter(getattr(parameters, "lora_adapters", ""))),
        )

    @classmethod
    def from_model_args(cls, args: dict, parameters: EngineParameters) -> EngineSettings:
        """From the `args` of `initialize` and the model's parsed parameters: decoupled policy, queue size, the
        checkpoint path made absolute, the GPU Triton placed this instance on, the model's instance count."""
        config = json.loads(args["model_config"])
        queue_policy = config.get("dynamic_batching", {}).get("default_queue_policy", {})
        model_path = getattr(parameters, "model_path", "")
        tokenizer_dir = getattr(parameters, "tokenizer_dir", "")
        settings = cls.from_parameters(parameters, decoupled=is_decoupled(args),
                                       max_queue_size=int(queue_policy.get("max_queue_size", 0)),
                                       model_path=resolve_path(args, model_path) if model_path else "",
                                       tokenizer_dir=resolve_path(args, tokenizer_dir) if tokenizer_dir else "")
        # A KIND_GPU instance (build --gpus) runs on the GPU Triton gave it, whatever the parameter says.
        placed = (f"cuda:{args['model_instance_device_id']}" if args.get("model_instance_kind") == "GPU"
                  else settings.device)
        adapters = tuple(dataclasses.replace(record, path=resolve_path(args, record.path))
                         for record in settings.lora_adapters)
        return dataclasses.replace(settings, device=placed, instances=instance_count(config), lora_adapters=adapters)


def instance_count(config: dict) -> int:
    """The instances of a model config (JSON, as Triton hands it to `initialize`): a KIND_GPU group with GPUs
    listed has `count` on each of them."""
    return sum(int(group.get("count", 1)) * max(len(group.get("gpus") or ()), 1)
               for group in config.get("instance_group") or [{}])


def checkpoint_bos_token_id(model_path: str) -> int | None:
    """The BOS id in a Hugging Face checkpoint's config.json; None where it names none."""
    config = Path(model_path) / "config.json"
    bos = json.loads(config.read_text()).get("bos_token_id") if config.is_file() else None
    return bos if isinstance(bos, int) else None


class TokenRun(NamedTuple):
    """Generated tokens on their way to one response: their ids, log probs and, with `num_top_log_probs`, the
    likeliest tokens at each one's step (None otherwise)."""

    ids: list[int]
    log_probs: list[float]
    top: list[TopTokens] | None = None

    def part(self, start: int, stop: int | None = None) -> TokenRun:
        return TokenRun(self.ids[start:stop], self.log_probs[start:stop],
                        None if self.top is None else self.top[start:stop])


def joined(runs: list[TokenRun]) -> TokenRun:
    """Runs of one row, in order, as one."""
    return TokenRun([token for run in runs for token in run.ids], [value for run in runs for value in run.log_probs],
                    None if not runs or runs[0].top is None else [top for run in runs for top in run.top])


def streamed_responses(tokens: TokenRun, bos_token_id: int | None) -> list[TokenRun]:
    """A row's streamed tokens of one send, as the responses that carry them: a BOS heading more tokens goes
    alone. Postprocessing decodes each response by itself and reads one that starts with BOS as a whole text
    (an echoed prompt, whose SentencePiece prefix space `TokenBytes.decode_sequence` drops); a generated BOS
    heading a longer chunk would take the next word's space with it. Alone, it decodes to nothing."""
    lead = 0
    while lead < len(tokens.ids) - 1 and tokens.ids[lead] == bos_token_id:
        lead += 1
    return [*(tokens.part(index, index + 1) for index in range(lead)), tokens.part(lead)]


def top_log_prob_outputs(top: list[TopTokens], count: int) -> dict[str, np.ndarray]:
    """`top_token_ids` and `top_log_probs`, [1 row, tokens, count] (the prompt's as they are; the generated
    tokens' with a beam axis, as `output_log_probs`): a step that had fewer tokens to choose from (a grammar's,
    a prompt token's) pads with id -1 and log prob -inf."""
    ids = np.full((1, len(top), count), -1, dtype=np.int32)
    log_probs = np.full((1, len(top), count), -np.inf, dtype=np.float32)
    for index, step in enumerate(top):
        known = min(count, len(step.ids))
        ids[0, index, :known] = step.ids[:known]
        log_probs[0, index, :known] = step.log_probs[:known]
    return {TOP_TOKEN_IDS: ids, TOP_LOG_PROBS: log_probs}


def _now_ns() -> int:
    return time.time_ns()


class _RowSink:
    """Turns one row's engine events into Triton responses shaped as the tensorrtllm backend's.

    Every response carries `output_ids` and `sequence_length`; the optional outputs appear only when the
    request asked for them (`return_*` inputs), `batch_index` only for a batched request, `sequence_index`
    never (one sequence per request) — as `ModelInstanceState::fillTritonResponse` does.

    Threads: the engine's thread calls `scheduled`, `tokens`, `finish` and `cancelled`, and owns the token
    times and `delivered`. The row's sends and its last response run on a sender (`sending.Outbox`: one at a
    time, in order), which owns `streamed`. What crosses between them goes through the outbox's lock: the
    tokens (with their log probs), and the row's end; the outbox's `failed` tells the engine to stop the row.
    """

    def __init__(self, state: RequestRows, row: EngineRow, batch_index: int, server_stopping: threading.Event,
                 senders: Senders, stream_interval: int = 1, bos_token_id: int | None = None,
                 request_id: str = "", stop_board: StopBoard | None = None):
        self.state = state
        self.request_id = request_id
        self.stop_board = stop_board  # several engine instances: a stop taken by another reaches this row here
        self.bos_token_id = bos_token_id
        self.server_stopping = server_stopping  # set: every open row ends now, with ServerStopping
        self.row = row
        self.batch_index = batch_index
        # Streamed tokens wait here while the row's send waits for a sender, and join it.
        self.outbox: Outbox[TokenRun] = Outbox(senders, self._send_tokens, interval=stream_interval)
        self.streamed = 0  # tokens sent in streamed responses (the sender holding the row)
        # The prompt's log probabilities (return_prompt_log_probs): given by the engine's thread before any token,
        # sent with the row's first response.
        self.prompt_scores: dict[str, np.ndarray] | None = None
        self.delivered = 0  # tokens the engine gave this row (the engine's thread)
        self.arrival_ns = _now_ns()
        self.scheduled_ns = self.first_token_ns = self.last_token_ns = 0

    def _response(self, tokens: TokenRun):
        token_ids, log_probs = tokens.ids, tokens.log_probs
        outputs = {
            OUTPUT_IDS: np.array([[token_ids]], dtype=np.int32).reshape(1, 1, len(token_ids)),
            SEQUENCE_LENGTH: np.array([[len(token_ids)]], dtype=np.int32),
        }
        if self.row.return_log_probs:
            outputs[CUM_LOG_PROBS] = np.array([[sum(log_probs)]], dtype=np.float32)
            outputs[OUTPUT_LOG_PROBS] = np.array(log_probs, dtype=np.float32).reshape(1, 1, len(log_probs))
        if self.row.num_top_log_probs:
            top = top_log_prob_outputs(tokens.top or [], self.row.num_top_log_probs)
            # [1 row, 1 beam, tokens, count], as the config declares it and the coalescer folds it
            outputs.update({name: values[:, None] for name, values in top.items()})
        if self.prompt_scores is not None:
            outputs.update(self.prompt_scores)
            self.prompt_scores = None
        if self.state.rows > 1:
            outputs[BATCH_INDEX] = np.array([[self.batch_index]], dtype=np.int32)
        if self.row.return_num_input_tokens:
            outputs[NUM_INPUT_TOKENS] = np.array([[len(self.row.prompt_ids)]], dtype=np.int32)
        if self.row.return_num_output_tokens:
            outputs[NUM_OUTPUT_TOKENS] = np.array([[len(token_ids)]], dtype=np.int32)
        if self.row.return_perf_metrics:
            outputs.update(self._perf_metrics())
        return self.state.response(outputs)

    def _perf_metrics(self) -> dict[str, np.ndarray]:
        """The backend's per-request statistics. This engine keeps no paged KV cache and drafts nothing: its
        block and draft counts are 0."""
        def one(value, dtype):
            return np.array([[value]], dtype=dtype)

        return {KV_CACHE_ALLOC_NEW_BLOCKS: one(0, np.int32), KV_CACHE_REUSED_BLOCKS: one(0, np.int32),
                KV_CACHE_ALLOC_TOTAL_BLOCKS: one(0, np.int32), ARRIVAL_TIME_NS: one(self.arrival_ns, np.int64),
                FIRST_SCHEDULED_TIME_NS: one(self.scheduled_ns, np.int64),
                FIRST_TOKEN_TIME_NS: one(self.first_token_ns, np.int64),
                LAST_TOKEN_TIME_NS: one(self.last_token_ns, np.int64), ACCEPTANCE_RATE: one(0.0, np.float32),
                TOTAL_ACCEPTED_DRAFT_TOKENS: one(0, np.int32), TOTAL_DRAFT_TOKENS: one(0, np.int32)}

    def _token_times(self) -> None:
        self.last_token_ns = _now_ns()
        self.first_token_ns = self.first_token_ns or self.last_token_ns

    def scheduled(self) -> None:
        self.scheduled_ns = _now_ns()

    def prompt(self, log_probs: list[float], top: list[TopTokens] | None) -> None:
        scores = {PROMPT_LOG_PROBS: np.array([log_probs], dtype=np.float32)}
        if top is not None:
            padded = top_log_prob_outputs(top, self.row.num_top_log_probs)
            scores[PROMPT_TOP_TOKEN_IDS] = padded[TOP_TOKEN_IDS]
            scores[PROMPT_TOP_LOG_PROBS] = padded[TOP_LOG_PROBS]
        self.prompt_scores = scores  # one assignment: the sender sees all of it or none

    def tokens(self, token_ids: list[int], log_probs: list[float], top: list[TopTokens] | None = None) -> None:
        """New tokens of a streaming row: sent at once when they are its first, else once `stream_interval`
        of them wait (the rest go out with `finish`). Tokens that come while the row's send waits for a sender
        join that send: a server slower than the engine gets fewer, longer responses instead of a backlog, and
        an idle one gets every token as it comes."""
        self._token_times()
        self.delivered += len(token_ids)
        self.outbox.add(TokenRun(token_ids, log_probs, top), size=len(token_ids))

    def _send_tokens(self, pieces: list[TokenRun]) -> bool:
        """Every token that waited, in streamed responses none flagged final; False at the first not sent."""
        tokens = joined(pieces)
        self.streamed += len(tokens.ids)
        return self._send_streamed(streamed_responses(tokens, self.bos_token_id))

    def _send_streamed(self, responses: list[TokenRun]) -> bool:
        return all(self.state.send(self._response(tokens), row_done=False)
                   for tokens in responses)  # all() stops at the first that was not sent

    def finish(self, result: GenerationResult | None, error: Exception | None) -> None:
        """The row's end: its last response, after every one sent before it (which may have taken tokens
        given after it was queued: the tokens not yet streamed are counted when the last response is made)."""
        if result is not None and result.token_ids[self.delivered:]:
            self._token_times()
        cut_short = self.server_stopping.is_set()  # as the engine ended the row, not when its sender sends
        self.outbox.end(lambda _: self._finish(result, error, cut_short))  # the result holds every token

    def _finish(self, result: GenerationResult | None, error: Exception | None, cut_short: bool) -> None:
        if error is None and self.outbox.failed:  # the client missed a chunk: end with an error, not a gap
            error = ResponseSendError()
        if error is None and cut_short:  # the server was stopping: not a whole answer
            error = ServerStopping()
        if error is not None:
            self.state.send(self.state.error_response(error), row_done=True)
            return
        generated = TokenRun(result.token_ids, result.log_probs, result.top)
        if self.row.stream:  # the tokens not yet streamed (none after an end id), the last flagged final
            *heads, tokens = streamed_responses(generated.part(self.streamed), self.bos_token_id)
            if not self._send_streamed(heads):
                self.state.send(self.state.error_response(ResponseSendError()), row_done=True)
                return
        elif self.row.exclude_input:
            tokens = generated
        else:  # the prompt's tokens have no log probs of their own here: 0, as the tensorrtllm backend's
            prompt = len(self.row.prompt_ids)
            tokens = TokenRun(self.row.prompt_ids + result.token_ids, [0.0] * prompt + result.log_probs,
                              None if result.top is None else [TopTokens([], [])] * prompt + result.top)
        self.state.send(self._response(tokens), row_done=True)

    def cancelled(self) -> bool:
        """The client went away, or a response could not be sent: either way the engine stops the row, and
        its finish tries once more to end the request (with what the row has). So does a server that stops, and
        a stop that another instance of the model took."""
        return (self.outbox.failed or self.server_stopping.is_set() or self.state.cancelled()
                or (self.stop_board is not None and self.stop_board.stopped(self.request_id, self.arrival_ns)))


class EngineService:
    def __init__(self, pb_utils, settings: EngineSettings, engine, stop_board: StopBoard | None = None):
        self.pb_utils = pb_utils
        self.settings = settings
        self.engine = engine
        self.stop_board = stop_board  # the model's other instances (stop_board.py); None: the only instance
        self.senders = Senders(settings.response_lanes, SEND_QUEUE_DEPTH, name="engine-send")
        self.metrics = None
        # Set when the stopping server's time for open requests is up (`drain`): the engine stops every row,
        # and each ends with ServerStopping.
        self.server_stopping = threading.Event()
        self._open = 0  # Triton requests not yet answered in full
        self._open_changed = threading.Condition()

    def _opened(self) -> None:
        with self._open_changed:
            self._open += 1

    def _closed(self) -> None:
        with self._open_changed:
            self._open -= 1
            self._open_changed.notify_all()

    def drain(self, deadline: float) -> None:
        """The server is stopping (triton_adapter.start_heartbeat calls this): let open requests finish until
        `deadline` (time.monotonic), end the rest with ServerStopping, and return once none is open (or a few
        seconds later, for an engine that does not stop)."""
        with self._open_changed:
            self._open_changed.wait_for(lambda: self._open == 0, timeout=max(deadline - time.monotonic(), 0))
            if self._open:
                logger.warning("the server is stopping: ending %d open requests", self._open)
                self.server_stopping.set()
                self._open_changed.wait_for(lambda: self._open == 0, timeout=MODEL_DRAIN_END_S)

    def publish_metrics(self, model: str, version: str, instance: str | None = None) -> None:
        """The backend's nv_trt_llm_* families on Triton's /metrics; `instance`: this instance's name, a label
        that keeps the series of several instances apart (the backend runs one, and has no such label)."""
        from .metrics import EngineMetrics

        limits = self.settings.limits
        self.metrics = EngineMetrics(self.pb_utils, self.engine, model=model, version=version,
                                     max_batch_size=limits.max_batch_size, max_seq_len=limits.max_seq_len,
                                     instance=instance)

    def handle(self, request) -> None:
        """Answer one Triton request through its response sender (never raises)."""
        pb_utils = self.pb_utils
        sender = request.get_response_sender()
        try:
            inputs = request_inputs(request)
            if is_stop_request(inputs):
                if not request.request_id():  # as the backend: an anonymous stop could only hit others' requests
                    raise RequestError(STOP, "needs the request id of the request to stop; this request has none")
                # Answered by the engine's thread once it takes the stop: a liveness probe's stop then tells
                # whether that thread still runs, not just this stub.
                self.engine.cancel(request.request_id(), lambda: send_final(pb_utils, sender))
                if self.stop_board is not None:  # the request may run on another instance
                    self.stop_board.post(request.request_id())
                return
            requested = requested_outputs(request)
            if requested is not None and not REQUIRED_OUTPUTS <= requested:
                raise RequestError("outputs", f"must include {sorted(REQUIRED_OUTPUTS)}, as the tensorrtllm "
                                              f"backend requires")
            rows = parse_engine_request(inputs, default_exclude_input=self.settings.exclude_input_in_output)
            if not self.settings.decoupled:
                if any(row.stream for row in rows):
                    raise RequestError(STREAM, "streaming needs the engine model deployed decoupled "
                                                 "(build with streaming enabled)")
                if len(rows) > 1:
                    raise RequestError(INPUT_IDS, "a batched request needs the engine model deployed decoupled")
            state = RequestRows(pb_utils, sender, len(rows), requested,
                                self.settings.cancellation_check_period_ms / 1000, self._closed)
            requests = []
            for index, row in enumerate(rows):
                generation = GenerationRequest(
                    request_id=request.request_id(), prompt_ids=row.prompt_ids,
                    max_new_tokens=row.max_new_tokens, end_id=row.end_id, sampling=row.sampling,
                    stop_sequences=row.stop_sequences, bad_sequences=row.bad_sequences, stream=row.stream,
                    return_log_probs=row.return_log_probs or row.num_top_log_probs > 0,
                    num_top_log_probs=row.num_top_log_probs, return_prompt_log_probs=row.return_prompt_log_probs,
                    embedding_bias=row.embedding_bias,
                    guided_decoding=row.guided_decoding, lora_task_id=row.lora_task_id,
                    sink=_RowSink(state, row, index, self.server_stopping, self.senders,
                                  self.settings.stream_interval, self.settings.bos_token_id,
                                  request_id=request.request_id(), stop_board=self.stop_board))
                self.engine.validate(generation)
                requests.append(generation)
        except Exception as error:  # noqa: BLE001 - every failure becomes this request's error response
            answer_error(pb_utils, sender, error)
            return
        self._opened()
        for generation in requests:
            self.engine.submit(generation)

    def shutdown(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        self.engine.shutdown()
        self.senders.close(SENDERS_CLOSE_S)  # after the engine, whose last rows end through them


class EngineModel:
    """The `tensorrt_llm` model's `TritonPythonModel`: its parameters read once, an `EngineService` around the
    engine, a heartbeat; each request handled by the service; the engine shut down with the model. A model.py
    subclasses it with Triton's `pb_utils` and its parameters' type, and says how its engine is made."""

    PB_UTILS = None  # Triton's triton_python_backend_utils module
    PARAMETERS: type[EngineParameters]  # the model's parameters in config.pbtxt
    METRICS = True  # publish the backend's nv_trt_llm_* families on Triton's /metrics

    def make_engine(self, args: dict, parameters: EngineParameters, settings: EngineSettings):
        """The engine the service runs: each engine model names its own (runtime/engine/<kind>/)."""
        raise NotImplementedError

    def initialize(self, args):
        parameters = self.PARAMETERS.from_model_args(args)
        settings = EngineSettings.from_model_args(args, parameters)
        several = settings.instances > 1
        board = (StopBoard.for_model(args["model_repository"], settings.cancellation_check_period_ms / 1000)
                 if several else None)
        self.service = EngineService(self.PB_UTILS, settings, self.make_engine(args, parameters, settings), board)
        start_heartbeat(drain=self.service.drain)
        if self.METRICS:
            self.service.publish_metrics(args["model_name"], args["model_version"],
                                         instance=args.get("model_instance_name") if several else None)

    def execute(self, requests):
        for request in requests:
            self.service.handle(request)
        return None

    def finalize(self):
        self.service.shutdown()
        # The requests' response senders go now, while the stub still talks to the server: left for the
        # interpreter's exit (held by the model, or in reference cycles), each one's cancel handle reaches into
        # shared memory the stub has already let go of, and the stub crashes on its way out.
        self.service = None
        gc.collect()
