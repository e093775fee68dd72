"""Serving OpenAI's completions and chat through the repository: a checked request (`protocol`) becomes the
BLS's (or the ensemble's) `GenerateRequest`, its gRPC stream comes back as OpenAI's answer, whole or as
server-sent events, and an error the repository answers becomes OpenAI's error object with the status that
`facts/errors.py` gives its kind. Every request is counted in the gateway's metrics once, when it ends.

Token counts come from the engine (`return_num_input_tokens` / `return_num_output_tokens`); `finish_reason`
is `length` when the engine produced `max_tokens` tokens, else `stop`. A client that disconnects closes the
stream of its text, which cancels its gRPC stream and so its generation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from ..clients.client import (
    AsyncGrpcClient,
    GenerateRequest,
    GenerationError,
    ResponseTimeout,
    ServerUnavailable,
    TextAssembler,
    first_int32,
    first_string,
    response_outputs,
)
from ..facts.contract import (
    BLS_MODEL,
    FREQUENCY_PENALTY,
    MIN_TOKENS,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    PRESENCE_PENALTY,
    REPETITION_PENALTY,
    RETURN_NUM_INPUT_TOKENS,
    RETURN_NUM_OUTPUT_TOKENS,
    SEED,
    STOP_WORDS,
    TEMPERATURE,
    TEXT_OUTPUT,
    TOP_K,
    TOP_P,
)
from ..facts.errors import ERROR_CODES, ErrorKind
from .metrics import GatewayMetrics
from .protocol import (
    DONE_EVENT,
    PATHS,
    Generation,
    OpenAIError,
    OpenAIRequest,
    ResponseHead,
    TextEvents,
    read_body,
    read_request,
    sse_event,
    stream_chunk,
    usage_chunk,
    whole_response,
)

# OpenAI's sampling fields → the ensemble's inputs (the BLS takes the same names).
SAMPLING_INPUTS = {"temperature": TEMPERATURE, "top_p": TOP_P, "top_k": TOP_K, "seed": SEED,
                   "presence_penalty": PRESENCE_PENALTY, "frequency_penalty": FREQUENCY_PENALTY,
                   "repetition_penalty": REPETITION_PENALTY, "min_tokens": MIN_TOKENS}
# What the gateway calls unless told otherwise: the BLS. Under load it sends the tokens of a stream that
# arrive while one of its chunks is being sent as one chunk, so the gateway's work per token shrinks as the
# rate grows (the figures: docs/guides/openai.md#overhead); it also matches OpenAI's `stop` on text and never
# emits it.
DEFAULT_MODEL = BLS_MODEL
SERVED_MODEL_NAME = "tritonforge"  # the model name /v1/models shows unless the operator names it
# Engine responses per streamed chunk after the first, asked of the BLS: each chunk costs the gateway its own
# parse, JSON and SSE event, so at an engine's one token a response the gateway would spend more on chunks than
# the BLS; a client sees the first token as soon as it comes, then chunks of up to this many tokens.
DEFAULT_STREAM_INTERVAL = 4
# The only outputs the gateway reads: responses carry nothing else (less to send, parse and copy per chunk).
GATEWAY_OUTPUTS = (TEXT_OUTPUT, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS)
CLIENT_CLOSED = 499  # the status the metrics count for a client that disconnected (nginx's convention)
GATEWAY_TIMEOUT = 504  # a stream the server left silent: HTTP's own status for an upstream that went quiet

logger = logging.getLogger(__name__)


def parse_request(body, kind: str, served_model_name: str | None = None) -> tuple[GenerateRequest, bool, bool]:
    """An OpenAI request body (decoded JSON) → (the repository's request, stream?, include usage in the
    stream?). Refusals: `protocol.read_request`."""
    request = read_request(body, kind, served_model_name)
    return triton_request(request), request.stream, request.include_usage


def triton_request(request: OpenAIRequest, stream_interval: int | None = None) -> GenerateRequest:
    """What the BLS (or the ensemble) is asked for: the prompt or messages, the sampling fields under the
    contract's names, and always the token counts, which `usage` and `finish_reason` are read from; the
    BLS's stream interval where the gateway sets one."""
    parameters: dict[str, object] = {SAMPLING_INPUTS[name]: value for name, value in request.sampling.items()}
    if request.stop is not None:
        parameters[STOP_WORDS] = request.stop
    parameters[RETURN_NUM_INPUT_TOKENS] = True
    parameters[RETURN_NUM_OUTPUT_TOKENS] = True
    return GenerateRequest(text_input=request.prompt, messages=request.messages, max_tokens=request.max_tokens,
                           parameters=parameters, stream_interval=stream_interval)


def to_openai_error(error: GenerationError) -> OpenAIError:
    """OpenAI's error object for an error the repository answered (or a server that could not be reached), by
    its kind (`facts/errors.py`: the table, and how a message alone is read: an error inside a gRPC stream
    carries no status code). A stream the server left silent is the one status the table does not give: the
    client's own `ResponseTimeout`, answered 504."""
    message = str(error)
    codes = ERROR_CODES[error.kind]
    if isinstance(error, ResponseTimeout):  # the server went silent: it, not the request, is at fault
        return OpenAIError(GATEWAY_TIMEOUT, message, kind=ERROR_CODES[ErrorKind.UNAVAILABLE].openai)
    if isinstance(error, ServerUnavailable):  # Triton is down or elsewhere: one line for the operator
        logger.warning("answering %d: %s", codes.http, message)
    return OpenAIError(codes.http, message, kind=codes.openai)


class TritonBackend:
    """Streams one request through the repository's BLS (or ensemble) over gRPC, asyncio."""

    def __init__(self, url: str, model: str):
        self.model = model
        self.client = AsyncGrpcClient(url, model)

    async def generate(self, request: GenerateRequest, generation: Generation) -> AsyncIterator[str]:
        """Yield text chunks as they come; fill `generation`'s token counts."""
        assembler = TextAssembler()
        # Closed at once when the caller stops reading (a client that went away), not whenever it is collected:
        # closing an unfinished stream is what stops the engine's generation.
        async with aclosing(self.client.responses(request, outputs=GATEWAY_OUTPUTS)) as responses:
            async for result in responses:
                outputs = response_outputs(result, GATEWAY_OUTPUTS)
                if NUM_INPUT_TOKENS in outputs:
                    generation.prompt_tokens = max(generation.prompt_tokens, first_int32(outputs[NUM_INPUT_TOKENS]))
                if NUM_OUTPUT_TOKENS in outputs:
                    generation.completion_tokens += first_int32(outputs[NUM_OUTPUT_TOKENS])
                if TEXT_OUTPUT in outputs:
                    text = assembler.push(first_string(outputs[TEXT_OUTPUT]))
                    if text:
                        yield text
        tail = assembler.finish()
        if tail:
            yield tail

    async def ready(self) -> bool:
        try:
            return (await self.client.client.is_server_ready()
                    and await self.client.client.is_model_ready(self.model))
        except Exception:  # noqa: BLE001 - unreachable counts as not ready
            return False

    async def close(self) -> None:
        await self.client.close()


class OpenAIServing:
    """The completions and chat endpoints answered through the repository at `url` (gRPC), each request counted
    in `metrics`."""

    def __init__(self, url: str, *, model: str, served_model_name: str, metrics: GatewayMetrics,
                 stream_interval: int = 1):
        self.url, self.model, self.served_model_name, self.metrics = url, model, served_model_name, metrics
        # The BLS alone takes a stream interval (the ensemble streams what its engine sends).
        self.stream_interval = stream_interval if model == BLS_MODEL and stream_interval > 1 else None
        self._backend: TritonBackend | None = None

    @property
    def backend(self) -> TritonBackend:
        if self._backend is None:  # made on first use, inside the server's event loop, which its channel needs
            self._backend = TritonBackend(self.url, self.model)
        return self._backend

    async def ready(self) -> bool:
        return await self.backend.ready()

    async def answer(self, kind: str, raw_body: bytes) -> dict | AsyncIterator[str]:
        """OpenAI's answer to a request body sent to the `kind` endpoint: the whole answer, or the server-sent
        events of the stream it asked for. Raises `OpenAIError` for a request refused before any event."""
        endpoint = PATHS[kind]
        try:
            request, stream, include_usage = parse_request(read_body(raw_body), kind, self.served_model_name)
        except OpenAIError as error:
            self.metrics.request_done(endpoint, error.status, started=False)
            raise
        if not stream:
            return await _Reply(self, endpoint, ResponseHead.new(kind, self.served_model_name), request).whole()
        request = dataclasses.replace(request, stream_interval=self.stream_interval)
        return await _Reply(self, endpoint, ResponseHead.new(kind, self.served_model_name), request).stream(
            include_usage)


class _Reply:
    """One request being answered: the text coming from the repository, what it brought so far, and the
    request's place in the metrics, settled once when it ends (`done`)."""

    def __init__(self, serving: OpenAIServing, endpoint: str, head: ResponseHead, request: GenerateRequest):
        self.metrics, self.endpoint, self.head = serving.metrics, endpoint, head
        self.generation = Generation(max_tokens=request.max_tokens)
        self.timer = self.metrics.timer()
        self.chunks = serving.backend.generate(request, self.generation)

    def done(self, status: int) -> None:
        self.metrics.request_done(self.endpoint, status, self.generation if status == 200 else None)

    def failed(self, error: GenerationError) -> OpenAIError:
        failure = to_openai_error(error)
        self.done(failure.status)
        return failure

    async def whole(self) -> dict:
        try:
            async for text in self.chunks:
                self.timer.chunk()
                self.generation.chunks.append(text)
        except GenerationError as error:
            raise self.failed(error) from None
        except asyncio.CancelledError:  # the client went away: closing `chunks` stops its generation
            self.done(CLIENT_CLOSED)
            raise
        finally:
            await self.chunks.aclose()
        self.done(200)
        return whole_response(*self.head, self.generation)

    async def stream(self, include_usage: bool) -> AsyncIterator[str]:
        """The answer's server-sent events. The first text is awaited before any is sent, so that a request
        the repository refuses gets a real HTTP error."""
        try:
            first = await anext(self.chunks, None)
        except GenerationError as error:
            raise self.failed(error) from None
        if first is not None:
            self.timer.chunk()
        return self._events(first or "", include_usage)

    async def _events(self, first: str, include_usage: bool) -> AsyncIterator[str]:
        """A stream that fails after its first event ends with OpenAI's error event; every stream ends with
        `data: [DONE]`."""
        status = 200
        text_event = TextEvents(*self.head)
        try:
            yield sse_event(stream_chunk(*self.head, first, None, role=True))
            async for text in self.chunks:
                self.timer.chunk()
                yield text_event(text)
            yield sse_event(stream_chunk(*self.head, "", self.generation.finish_reason))
            if include_usage:
                yield sse_event(usage_chunk(*self.head, self.generation))
        except GenerationError as error:
            failure = to_openai_error(error)
            status = failure.status
            yield sse_event(failure.body())
        except asyncio.CancelledError:  # the client went away: closing `chunks` stops its generation
            status = CLIENT_CLOSED
            raise
        finally:
            await self.chunks.aclose()
            self.done(status)
        yield DONE_EVENT
