"""Serving OpenAI's completions and chat through the repository: a checked request (`protocol`) becomes the
BLS's (or the ensemble's) `GenerateRequest`, its gRPC stream comes back as OpenAI's answer, whole or as
server-sent events, and an error the repository answers becomes OpenAI's error object with the status that
`facts/errors.py` gives its kind. Every request is counted in the gateway's metrics once, when it ends.

Token counts come from the engine (`return_num_input_tokens` / `return_num_output_tokens`); `finish_reason`
is `tool_calls` when the text holds tool calls, `length` when the engine produced `max_tokens` tokens, else
`stop`. Each choice (`n`, or a completions request's prompts) is one repository request, run side by side.
A client that disconnects closes the streams of its text, which cancels their gRPC streams and so their
generations.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
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
    GUIDED_DECODING_GUIDE,
    GUIDED_DECODING_GUIDE_TYPE,
    LORA_TASK_ID,
    MAX_TOKENS,
    MESSAGES,
    MIN_TOKENS,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    NUM_TOP_LOG_PROBS,
    PRESENCE_PENALTY,
    REPETITION_PENALTY,
    RETURN_LOG_PROBS,
    RETURN_NUM_INPUT_TOKENS,
    RETURN_NUM_OUTPUT_TOKENS,
    RETURN_PROMPT_LOG_PROBS,
    SEED,
    STOP_WORDS,
    TEMPERATURE,
    TEXT_INPUT,
    TEXT_OUTPUT,
    TOP_K,
    TOP_P,
)
from ..facts.errors import ERROR_CODES, ErrorKind
from .logprobs import (
    choice_logprobs,
    log_prob_outputs,
    read_token_log_probs,
    token_log_probs_output,
    token_text,
)
from .metrics import GatewayMetrics
from .protocol import (
    CHAT,
    COMPLETIONS,
    DONE_EVENT,
    PATHS,
    RESPONSES_PATH,
    Generation,
    OpenAIError,
    OpenAIRequest,
    ResponseHead,
    TextEvents,
    read_body,
    read_request,
    reasoning_chunk,
    sse_event,
    stream_chunk,
    tool_calls_chunk,
    usage_chunk,
    whole_response,
)
from .reasoning import ReasoningReader, split_reasoning
from .responses_api import ResponseEvents, chat_body_from_responses, response_from_chat, sse
from .tool_calls import calls_from_guided_output
from .tool_parsers import PARSERS

# OpenAI's sampling fields → the ensemble's inputs (the BLS takes the same names).
SAMPLING_INPUTS = {"temperature": TEMPERATURE, "top_p": TOP_P, "top_k": TOP_K, "seed": SEED,
                   "presence_penalty": PRESENCE_PENALTY, "frequency_penalty": FREQUENCY_PENALTY,
                   "repetition_penalty": REPETITION_PENALTY, "min_tokens": MIN_TOKENS}
DEFAULT_TEMPERATURE = 1.0  # OpenAI's: a request that says nothing is sampled
# The engines (TensorRT-LLM's semantics) sample only with top_k > 1 or top_p < 1, while OpenAI's top_p of 1
# means the whole distribution: just below 1 samples from all of it but its least likely millionth.
WHOLE_DISTRIBUTION_TOP_P = 0.999999
SEEDS = 2**64  # the engines' seed is a uint64: the seeds of a request's choices wrap around it
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
DEFAULT_TOOL_PARSER = "hermes"  # the format of Hermes and Qwen models, and of the tiny test model's template
# The only outputs the gateway reads: responses carry nothing else (less to send, parse and copy per chunk).
GATEWAY_OUTPUTS = (TEXT_OUTPUT, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS)
CLIENT_CLOSED = 499  # the status the metrics count for a client that disconnected (nginx's convention)
GATEWAY_TIMEOUT = 504  # a stream the server left silent: HTTP's own status for an upstream that went quiet

logger = logging.getLogger(__name__)


def engine_sampling(sampling: dict[str, int | float], choice: int = 0) -> dict[str, object]:
    """OpenAI's sampling fields, with OpenAI's meaning, as the engine's inputs: sampled at temperature 1 unless
    told otherwise, greedy at temperature 0 (or top_p 0, or top_k 1). The `choice`-th choice of a request with a
    seed draws from seed + choice, so that its choices differ and each is reproducible."""
    parameters: dict[str, object] = {SAMPLING_INPUTS[name]: value for name, value in sampling.items()
                                     if name not in ("temperature", "top_p", "top_k", "seed")}
    if "seed" in sampling:
        parameters[SEED] = (sampling["seed"] + choice) % SEEDS
    temperature = sampling.get("temperature", DEFAULT_TEMPERATURE)
    top_p = sampling.get("top_p", 1.0)
    if temperature == 0 or top_p == 0 or sampling.get("top_k") == 1:
        parameters[TOP_K] = 1
        return parameters
    parameters[TEMPERATURE] = temperature
    parameters[TOP_P] = min(top_p, WHOLE_DISTRIBUTION_TOP_P)
    if "top_k" in sampling:
        parameters[TOP_K] = sampling["top_k"]
    return parameters


def choice_requests(request: OpenAIRequest, stream_interval: int | None = None
                    ) -> list[tuple[Generation, GenerateRequest]]:
    """What the BLS (or the ensemble) is asked for, one request per choice (each prompt `n` times), with the
    generation each fills: the prompt or messages, the sampling fields under the contract's names, the guide,
    and always the token counts, which `usage` and `finish_reason` are read from; the BLS's stream interval
    where the gateway sets one."""
    base: dict[str, object] = {}
    if request.stop is not None:
        base[STOP_WORDS] = request.stop
    if request.guide is not None:
        base[GUIDED_DECODING_GUIDE_TYPE] = request.guide.guide_type
        base[GUIDED_DECODING_GUIDE] = request.guide.guide
    if request.lora_task_id is not None:
        base[LORA_TASK_ID] = request.lora_task_id
    if request.logprobs is not None:
        base[NUM_TOP_LOG_PROBS] = request.logprobs
        if request.echo:
            base[RETURN_PROMPT_LOG_PROBS] = True
    base[RETURN_NUM_INPUT_TOKENS] = True
    base[RETURN_NUM_OUTPUT_TOKENS] = True
    prompts = request.prompts if request.prompts is not None else [None]
    choices = []
    for prompt_index, prompt in enumerate(prompts):
        for _ in range(request.n):
            index = len(choices)
            parameters = {**engine_sampling(request.sampling, index), **base}
            # An echoed prompt alone (max_tokens 0) still asks the engine for a token, which is not shown.
            generate = GenerateRequest(text_input=prompt, messages=request.chat() if prompt is None else None,
                                       max_tokens=max(1, request.max_tokens), parameters=parameters,
                                       stream_interval=stream_interval)
            generation = Generation(max_tokens=request.max_tokens, index=index, prompt_index=prompt_index,
                                    logprobs=None if request.logprobs is None else [],
                                    echo=prompt if request.echo else None)
            choices.append((generation, generate))
    return choices


# The request's field that each input of the repository a refusal names (RequestError's "<input>: <problem>")
# comes from, by endpoint: a client is told of the field it sent, in the message and as `param`.
REQUEST_FIELDS = {
    PATHS[COMPLETIONS]: {TEXT_INPUT: "prompt", MAX_TOKENS: "max_tokens", STOP_WORDS: "stop"},
    PATHS[CHAT]: {MESSAGES: "messages", MAX_TOKENS: "max_tokens", STOP_WORDS: "stop"},
    RESPONSES_PATH: {MESSAGES: "input", MAX_TOKENS: "max_output_tokens"},
}
# A refusal as the BLS answers it ("<input>: <problem>"), or through the ensemble, which puts its name first.
_REFUSAL = re.compile(r"^(?:in ensemble '[^']*', )?(?P<input>\w+): (?P<problem>.*)$", re.S)


def to_openai_error(error: GenerationError, endpoint: str | None = None) -> OpenAIError:
    """OpenAI's error object for an error the repository answered (or a server that could not be reached), by
    its kind (`facts/errors.py`: the table, and how a message alone is read: an error inside a gRPC stream
    carries no status code); a refusal naming one of the repository's inputs names the `endpoint`'s field it came
    from instead, as `param` too. A stream the server left silent is the one status the table does not give: the
    client's own `ResponseTimeout`, answered 504."""
    message = str(error)
    codes = ERROR_CODES[error.kind]
    if isinstance(error, ResponseTimeout):  # the server went silent: it, not the request, is at fault
        return OpenAIError(GATEWAY_TIMEOUT, message, kind=ERROR_CODES[ErrorKind.UNAVAILABLE].openai)
    if isinstance(error, ServerUnavailable):  # Triton is down or elsewhere: one line for the operator
        logger.warning("answering %d: %s", codes.http, message)
    refusal = _REFUSAL.match(message) if error.kind is ErrorKind.CLIENT else None
    param = REQUEST_FIELDS.get(endpoint, {}).get(refusal["input"]) if refusal else None
    if param is not None:
        message = f"{param}: {refusal['problem']}"
    return OpenAIError(codes.http, message, param, kind=codes.openai)


class TritonBackend:
    """Streams one request through the repository's BLS (or ensemble) over gRPC, asyncio."""

    def __init__(self, url: str, model: str):
        self.model = model
        self.client = AsyncGrpcClient(url, model)

    async def generate(self, request: GenerateRequest, generation: Generation) -> AsyncIterator[str]:
        """Yield text chunks as they come; fill `generation`'s token counts, and its log probabilities where it
        asks for them (each response's before its text is yielded). An echoed prompt heads the first chunk; an
        echoed prompt alone (`prompt_only`) is all the text, and only its tokens are counted."""
        assembler = TextAssembler()
        wanted = GATEWAY_OUTPUTS if generation.logprobs is None else (*GATEWAY_OUTPUTS,
                                                                       *log_prob_outputs(self.model))
        log_probs_output = token_log_probs_output(self.model)
        alternatives = request.parameters.get(NUM_TOP_LOG_PROBS)
        # Through the ensemble the tokens' log probs are the engine's (`return_log_probs`), and postprocessing
        # names tokens by their bytes where the engine sends alternatives: at least one is asked for, and one the
        # client did not ask for is left out of the answer.
        through_ensemble = self.model != BLS_MODEL and alternatives is not None
        drop_alternatives = through_ensemble and alternatives == 0
        if through_ensemble:
            request = dataclasses.replace(request, parameters={**request.parameters, RETURN_LOG_PROBS: True,
                                                               NUM_TOP_LOG_PROBS: max(1, alternatives)})
        echo = generation.echo
        # Closed at once when the caller stops reading (a client that went away), not whenever it is collected:
        # closing an unfinished stream is what stops the engine's generation.
        async with aclosing(self.client.responses(request, outputs=wanted)) as responses:
            async for result in responses:
                outputs = response_outputs(result, wanted)
                if NUM_INPUT_TOKENS in outputs:
                    generation.prompt_tokens = max(generation.prompt_tokens, first_int32(outputs[NUM_INPUT_TOKENS]))
                if NUM_OUTPUT_TOKENS in outputs and not generation.prompt_only:
                    generation.completion_tokens += first_int32(outputs[NUM_OUTPUT_TOKENS])
                if generation.logprobs is not None:
                    entries = read_token_log_probs(result.as_numpy, log_probs_output)
                    if not entries and through_ensemble and outputs.get(log_probs_output):
                        raise GenerationError(f"logprobs: through {self.model} they need an engine that returns the "
                                              f"likeliest tokens beside each (this one does not): call "
                                              f"{BLS_MODEL}", ErrorKind.UNSUPPORTED)
                    if drop_alternatives:
                        entries = [entry._replace(top=[]) for entry in entries]
                    generation.logprobs.extend(entries)
                    if generation.prompt_only:
                        del generation.logprobs[generation.prompt_tokens:]
                if TEXT_OUTPUT in outputs:
                    text = assembler.push(first_string(outputs[TEXT_OUTPUT]))
                    if generation.prompt_only:
                        text = ""
                    if echo is not None:
                        text, echo = echo + text, None
                    if text:
                        yield text
        tail = "" if generation.prompt_only else assembler.finish()
        if echo is not None:
            tail = echo + tail
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
    in `metrics`; tool calls the model writes unforced are read with the `tool_parser` format (`PARSERS`), and a
    chat's thinking set apart with the `reasoning_parser` format (`reasoning.REASONING_PARSERS`; None: none)."""

    def __init__(self, url: str, *, model: str, served_model_name: str, metrics: GatewayMetrics,
                 stream_interval: int = 1, tool_parser: str = DEFAULT_TOOL_PARSER,
                 reasoning_parser: str | None = None, adapters: dict[str, int] | None = None):
        self.url, self.model, self.served_model_name, self.metrics = url, model, served_model_name, metrics
        self.adapters = dict(adapters or {})  # LoRA adapters by name (each a `model` of its own): task ids
        # The BLS alone takes a stream interval (the ensemble streams what its engine sends).
        self.stream_interval = stream_interval if model == BLS_MODEL and stream_interval > 1 else None
        self.tool_parser = PARSERS[tool_parser]()
        self.reasoning_parser = reasoning_parser
        self._backend: TritonBackend | None = None

    @property
    def backend(self) -> TritonBackend:
        if self._backend is None:  # made on first use, inside the server's event loop, which its channel needs
            self._backend = TritonBackend(self.url, self.model)
        return self._backend

    async def ready(self) -> bool:
        return await self.backend.ready()

    def read(self, kind: str, body, endpoint: str) -> OpenAIRequest:
        """The request a decoded body sent to the `kind` endpoint makes; a refusal is counted, then raised."""
        try:
            request = read_request(body, kind, self.served_model_name, self.adapters)
            if request.logprobs is not None and request.echo and self.model != BLS_MODEL:
                raise OpenAIError(400, f"'echo' with 'logprobs' needs the gateway in front of {BLS_MODEL} (it calls "
                                       f"{self.model}, which returns no log probabilities of the prompt)", "echo")
            return request
        except OpenAIError as error:
            self.metrics.request_done(endpoint, error.status, started=False)
            raise

    async def answer(self, kind: str, raw_body: bytes) -> dict | AsyncIterator[str]:
        """OpenAI's answer to a request body sent to the `kind` endpoint: the whole answer, or the server-sent
        events of the stream it asked for. Raises `OpenAIError` for a request refused before any event."""
        endpoint = PATHS[kind]
        try:
            body = read_body(raw_body)
        except OpenAIError as error:
            self.metrics.request_done(endpoint, error.status, started=False)
            raise
        request = self.read(kind, body, endpoint)
        reply = _Reply(self, request, endpoint, self.stream_interval if request.stream else None)
        return await (reply.stream(as_sse=True) if request.stream else reply.whole())

    async def respond(self, raw_body: bytes) -> dict | AsyncIterator[str]:
        """`/v1/responses`: the request read as the chat it amounts to (`responses_api`), answered as one, and
        the answer written as a response, whole or as its stream of events."""
        try:
            body = read_body(raw_body)
            chat_body = chat_body_from_responses(body)
        except OpenAIError as error:
            self.metrics.request_done(RESPONSES_PATH, error.status, started=False)
            raise
        request = self.read(CHAT, chat_body, RESPONSES_PATH)
        if not request.stream:
            return response_from_chat(await _Reply(self, request, RESPONSES_PATH, None).whole(), body)
        chunks = await _Reply(self, request, RESPONSES_PATH, self.stream_interval).stream(as_sse=False)
        return _response_events(ResponseEvents(body, self.served_model_name), chunks)


async def _response_events(events: ResponseEvents, chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    """A streamed chat's chunks as a response's events; an error object among them fails the response."""
    async with aclosing(chunks):
        for event in events.start():
            yield sse(event)
        async for chunk in chunks:
            for event in (events.failed(chunk["error"]) if "error" in chunk else events.push(chunk)):
                yield sse(event)
            if "error" in chunk:
                return
        for event in events.finish():
            yield sse(event)


class _Reply:
    """One request being answered: the text coming from the repository for each of its choices, what they
    brought so far, and the request's place in the metrics, settled once when it ends (`done`)."""

    def __init__(self, serving: OpenAIServing, request: OpenAIRequest, endpoint: str, stream_interval: int | None):
        self.metrics, self.endpoint, self.request = serving.metrics, endpoint, request
        self.tool_parser = serving.tool_parser
        self.reasoning_parser = serving.reasoning_parser if request.kind == CHAT else None
        self.head = ResponseHead.new(request.kind, request.model if request.lora_task_id is not None
                                     else serving.served_model_name)
        self.model_name = self.head.model
        choices = choice_requests(request, stream_interval)
        self.generations = [generation for generation, _ in choices]
        self.chunks = [serving.backend.generate(generate, generation) for generation, generate in choices]
        self.timer = self.metrics.timer()
        self.merged: AsyncIterator | None = None  # several choices' texts as they come (`_merged`), once streaming

    @property
    def forced_calls(self) -> bool:
        """Does the request force tool calls (`required` or a named function)? Then its text is what the guide
        made the model write, read as the calls."""
        return self.request.tool_choice.mode in ("required", "named")

    @property
    def plain(self) -> bool:
        """One choice of text alone: streamed on the shortest path, an event per chunk and nothing else."""
        return (len(self.chunks) == 1 and not self.request.parses_tool_calls and not self.reasoning_parser
                and self.request.logprobs is None)

    def done(self, status: int) -> None:
        self.metrics.request_done(self.endpoint, status, self.generations if status == 200 else None,
                                  model=self.model_name)

    def failed(self, error: GenerationError) -> OpenAIError:
        failure = to_openai_error(error, self.endpoint)
        self.done(failure.status)
        return failure

    async def _close(self) -> None:
        """Close what reads the choices' texts: the reader of several first (its tasks, cancelled, stop reading
        the choices' streams), then each stream, which cancels its gRPC stream if it is still open."""
        if self.merged is not None:
            await self.merged.aclose()
        for chunks in self.chunks:
            await chunks.aclose()

    async def whole(self) -> dict:
        async def collect(chunks, generation: Generation) -> None:
            async for text in chunks:
                self.timer.chunk()
                generation.chunks.append(text)

        tasks = [asyncio.ensure_future(collect(chunks, generation))
                 for chunks, generation in zip(self.chunks, self.generations)]
        try:
            await asyncio.gather(*tasks)
        except GenerationError as error:
            raise self.failed(error) from None
        except asyncio.CancelledError:  # the client went away: closing `chunks` stops its generation
            self.done(CLIENT_CLOSED)
            raise
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._close()
        for generation in self.generations:
            self._read_text(generation)
        self.done(200)
        return whole_response(*self.head, self.generations)

    def _read_text(self, generation: Generation) -> None:
        """The reasoning (with a reasoning parser) and the tool calls read from a whole answer."""
        text = "".join(generation.chunks)
        if self.reasoning_parser:
            generation.reasoning, text = split_reasoning(self.reasoning_parser, text)
            generation.content = text
        if not self.request.parses_tool_calls:
            return
        if self.forced_calls:
            generation.tool_calls = calls_from_guided_output(text, self.request.tools, self.request.tool_choice)
            generation.content = None if generation.tool_calls else text
        else:
            generation.content, generation.tool_calls = self.tool_parser.parse(text)

    async def stream(self, as_sse: bool) -> AsyncIterator:
        """The answer's events: server-sent (`sse`), or the chunks as dicts for an endpoint that writes them its
        own way. The first text is awaited before any is sent, so that a request the repository
        refuses gets a real HTTP error."""
        texts = self.chunks[0] if self.plain else self._merged()
        self.merged = None if self.plain else texts
        try:
            first = await anext(texts, None)
        except GenerationError as error:
            await self._close()
            raise self.failed(error) from None
        if first is not None:
            self.timer.chunk()
        if self.plain:
            events = self._plain_events(first or "")
        else:
            events = self._choice_events(first, texts)
        return self._ended(events) if as_sse else self._as_dicts(events)

    async def _ended(self, events: AsyncIterator[dict | str]) -> AsyncIterator[str]:
        """Server-sent events: a stream that fails after its first event ends with OpenAI's error event; every
        stream ends with `data: [DONE]`."""
        status = 200
        try:
            async for event in events:
                yield event if isinstance(event, str) else sse_event(event)
        except GenerationError as error:
            failure = to_openai_error(error, self.endpoint)
            status = failure.status
            yield sse_event(failure.body())
        except asyncio.CancelledError:  # the client went away: closing `chunks` stops its generation
            status = CLIENT_CLOSED
            raise
        finally:
            await events.aclose()
            await self._close()
            self.done(status)
        yield DONE_EVENT

    async def _as_dicts(self, events: AsyncIterator[dict | str]) -> AsyncIterator[dict]:
        """The chunks as dicts; an error after the first ends them with OpenAI's error object."""
        status = 200
        try:
            async for event in events:
                yield json.loads(event.removeprefix("data: ")) if isinstance(event, str) else event
        except GenerationError as error:
            failure = to_openai_error(error, self.endpoint)
            status = failure.status
            yield failure.body()
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        finally:
            await events.aclose()
            await self._close()
            self.done(status)

    async def _plain_events(self, first: str) -> AsyncIterator[dict | str]:
        """One choice of text: each chunk's event written from a template (this runs once per token)."""
        text_event = TextEvents(*self.head)
        yield stream_chunk(*self.head, first, None, role=True)
        async for text in self.chunks[0]:
            self.timer.chunk()
            yield text_event(text)
        generation = self.generations[0]
        yield stream_chunk(*self.head, "", generation.finish_reason)
        if self.request.include_usage:
            yield usage_chunk(*self.head, self.generations)

    async def _merged(self) -> AsyncIterator[tuple[int, str | None, int]]:
        """(choice, text, tokens) as each choice's text comes, with how many of the choice's log probabilities
        came up to that text; (choice, None, tokens) when a choice ends; a choice's error is raised. Each choice
        is read by a task of its own, cancelled (closing its stream) when this closes."""
        queue: asyncio.Queue = asyncio.Queue()

        def tokens(index: int) -> int:
            logprobs = self.generations[index].logprobs
            return 0 if logprobs is None else len(logprobs)

        async def pump(index: int, chunks) -> None:
            try:
                async for text in chunks:  # the stream waits at its yield: the count is of this text's tokens
                    queue.put_nowait((index, text, tokens(index), None))
                queue.put_nowait((index, None, tokens(index), None))
            except Exception as error:  # noqa: BLE001 - raised by the reader below: a choice never ends in silence
                queue.put_nowait((index, None, 0, error))

        tasks = [asyncio.ensure_future(pump(index, chunks)) for index, chunks in enumerate(self.chunks)]
        try:
            running = len(tasks)
            while running:
                index, text, count, error = await queue.get()
                if error is not None:
                    raise error
                running -= text is None
                yield index, text, count
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _choice_events(self, first: tuple[int, str | None] | None, merged) -> AsyncIterator[dict]:
        """Several choices, or tool calls read as the text comes: each choice's text through its reader (`_Choice
        Stream`), its events as they are ready."""
        readers = [_ChoiceStream(self, generation) for generation in self.generations]
        if self.request.kind == CHAT:
            for reader in readers:
                yield stream_chunk(*self.head, "", None, role=True, index=reader.generation.index)
        items = merged if first is None else _prepend(first, merged)
        async for index, text, tokens in items:
            if text is not None:
                self.timer.chunk()
            for event in readers[index].push(text, tokens):
                yield event
        if self.request.include_usage:
            yield usage_chunk(*self.head, self.generations)


async def _prepend(first, rest: AsyncIterator) -> AsyncIterator:
    yield first
    async for item in rest:
        yield item


class _ChoiceStream:
    """One choice of a streamed answer: its text, the reasoning set apart from it (with a reasoning parser), tool
    calls read from the rest as it comes (unforced: the parser's, which holds back what may begin a call;
    forced: the whole text, read at its end), then its last chunk."""

    def __init__(self, reply: _Reply, generation: Generation):
        self.reply, self.generation, self.head = reply, generation, reply.head
        self.reasoning = ReasoningReader(reply.reasoning_parser) if reply.reasoning_parser else None
        self.parser = (reply.tool_parser.streaming()
                       if reply.request.parses_tool_calls and not reply.forced_calls else None)
        self.content: list[str] = []  # the text past the reasoning: a forced call's, read whole at the end
        self.tokens_sent = 0  # the choice's log probabilities sent so far
        self.text_sent = 0  # the characters of the sent tokens' texts (a completion's `text_offset` counts on)

    def push(self, text: str | None, tokens: int = 0) -> list[dict]:
        """The events of a text (None: the choice's end); `tokens`: how many of the choice's log probabilities
        came up to it, those not yet sent going out with its first chunk of text (or the choice's last)."""
        generation = self.generation
        if text is not None:
            generation.chunks.append(text)
            reasoning, content = self.reasoning.push(text) if self.reasoning else ("", text)
            return self._with_logprobs([*self._reasoning(reasoning), *self._content(content)], tokens)
        reasoning, content = self.reasoning.finish() if self.reasoning else ("", "")
        events = [*self._reasoning(reasoning), *self._content(content)]
        if self.reply.forced_calls:
            whole = "".join(self.content)
            calls = calls_from_guided_output(whole, self.reply.request.tools, self.reply.request.tool_choice)
            events += self._events("" if calls else whole, calls)
        elif self.parser:
            events += self._events(*self.parser.finish())
        last = stream_chunk(*self.head, "", generation.finish_reason, index=generation.index)
        return self._with_logprobs([*events, last], tokens)

    def _with_logprobs(self, events: list[dict], tokens: int) -> list[dict]:
        """The events, the first of which carries the log probabilities not yet sent, up to `tokens`."""
        logprobs = self.generation.logprobs
        if logprobs is None or not events or tokens <= self.tokens_sent:
            return events
        entries = logprobs[self.tokens_sent:tokens]
        self.tokens_sent = tokens
        choice = events[0]["choices"][0]
        choice["logprobs"] = choice_logprobs(self.reply.request.kind == CHAT, entries, self.text_sent)
        self.text_sent += sum(len(token_text(entry.token)) for entry in entries)
        return events

    def _reasoning(self, text: str) -> list[dict]:
        if not text:
            return []
        self.generation.reasoning = (self.generation.reasoning or "") + text
        return [reasoning_chunk(*self.head, text, index=self.generation.index)]

    def _content(self, text: str) -> list[dict]:
        if not text:
            return []
        self.content.append(text)
        if self.reply.forced_calls:
            return []
        return self._events(*(self.parser.push(text) if self.parser else (text, [])))

    def _events(self, content: str, calls: list) -> list[dict]:
        events = [stream_chunk(*self.head, content, None, index=self.generation.index)] if content else []
        if calls:
            events.append(tool_calls_chunk(*self.head, calls, first=len(self.generation.tool_calls),
                                           index=self.generation.index))
            self.generation.tool_calls.extend(calls)
        return events
