"""An OpenAI-compatible HTTP gateway in front of a served repository (the BLS, or the ensemble, over gRPC).

`tritonforge openai --url HOST:GRPC_PORT --port PORT` (in front of any Triton serving the repository,
NVIDIA's container included) or `tritonforge serve REPO --openai-port PORT` (beside the server it starts).

Endpoints: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (chat through the
`messages` input, i.e. the tokenizer's chat template), `GET /health`, `GET /metrics`. Streams are
server-sent events ending `data: [DONE]`; `stream_options.include_usage` adds the usage chunk. Token counts
come from the engine (`return_num_input_tokens` / `return_num_output_tokens`); `finish_reason` is
`length` when the engine produced `max_tokens` tokens, else `stop`. Unknown fields are accepted and ignored
(as vLLM does); what the engine cannot do (`n` > 1, `logprobs`, `echo`, `best_of` > 1, `logit_bias`,
`response_format`, tools) is answered with OpenAI's error object and HTTP 400. A client that disconnects
cancels its gRPC stream. With an API key (`--api-key`, or $TRITONFORGE_API_KEY so that it can come from a
Kubernetes Secret), every request but `GET /health` must carry `Authorization: Bearer <key>`, or it is
answered 401 with OpenAI's error object, as vLLM's and trtllm-serve's `--api-key` do.
"""

# No `from __future__ import annotations` here: FastAPI reads the route handlers' annotations (`Request`) at
# runtime, and they are imported inside create_app so that this module imports without FastAPI.
import asyncio
import functools
import hmac
import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

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
    ENSEMBLE_MODEL,
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
from ..facts.environment import API_KEY_ENV
from ..facts.errors import ERROR_CODES, ErrorKind
from ..facts.ports import GRPC_PORT, LOOPBACK, OPENAI_PORT, port_number
from ..facts.settings import positive_int, setting
from .metrics import MULTIPROCESS_DIR_ENV, GatewayMetrics, forget_worker

# OpenAI's sampling fields → the ensemble's inputs (the BLS takes the same names).
SAMPLING_FIELDS = {"temperature": TEMPERATURE, "top_p": TOP_P, "top_k": TOP_K, "seed": SEED,
                   "presence_penalty": PRESENCE_PENALTY, "frequency_penalty": FREQUENCY_PENALTY,
                   "repetition_penalty": REPETITION_PENALTY, "min_tokens": MIN_TOKENS}
DEFAULT_MAX_TOKENS = {"completions": 16, "chat": 256}  # OpenAI's completions default; chat has none
# What the gateway calls unless told otherwise: the BLS. Under load it sends the tokens of a stream that
# arrive while one of its chunks is being sent as one chunk, so the gateway's work per token shrinks as the
# rate grows (the figures: README, OpenAI-compatible API); it also matches OpenAI's `stop` on text and never
# emits it.
DEFAULT_MODEL = BLS_MODEL
# The only outputs the gateway reads: responses carry nothing else (less to send, parse and copy per chunk).
GATEWAY_OUTPUTS = (TEXT_OUTPUT, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS)
CLIENT_CLOSED = 499  # the status the metrics count for a client that disconnected (nginx's convention)
# The one path answered without the key: a load balancer's or kubelet's health check carries no credentials.
UNAUTHENTICATED_PATHS = frozenset({"/health"})

logger = logging.getLogger(__name__)


class OpenAIError(Exception):
    """An error answered as OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = ERROR_CODES[ErrorKind.CLIENT].openai, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Generation:
    """What came back for one request: text chunks, token counts, and how it ended."""

    max_tokens: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunks: list[str] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return "length" if self.completion_tokens >= self.max_tokens else "stop"

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def _number(body: dict, name: str, kind, low=None, high=None):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise OpenAIError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}", name)
    if (low is not None and value < low) or (high is not None and value > high):
        raise OpenAIError(400, f"'{name}' must be in [{low}, {high}], got {value}", name)
    return kind(value)


def parse_request(body: dict, kind: str, served_model_name: str | None = None) -> tuple[GenerateRequest, bool, bool]:
    """An OpenAI request body → (the ensemble's request, stream?, include usage in the stream?). With
    `served_model_name`, a request that names another model is answered 404 `model_not_found`, as OpenAI does."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if served_model_name is not None and model is not None and model != served_model_name:
        raise OpenAIError(404, f"The model {model!r} does not exist: this server serves {served_model_name!r} "
                               f"(GET /v1/models)", "model", code="model_not_found")
    for name, supported in (("n", 1), ("best_of", 1)):
        if body.get(name) not in (None, supported):
            raise OpenAIError(400, f"'{name}' > 1 is not supported by this engine (one sequence per request)", name)
    for name in ("logprobs", "top_logprobs", "logit_bias", "tools", "functions", "suffix"):
        if body.get(name) not in (None, False, 0, {}, []):
            raise OpenAIError(400, f"'{name}' is not supported by this server", name)
    if body.get("echo"):
        raise OpenAIError(400, "'echo' is not supported by this server", "echo")
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise OpenAIError(400, "only response_format {\"type\": \"text\"} is supported", "response_format")
    max_tokens = _number(body, "max_completion_tokens", int, 1) or _number(body, "max_tokens", int, 1)
    request = GenerateRequest(max_tokens=max_tokens or DEFAULT_MAX_TOKENS[kind])
    if kind == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise OpenAIError(400, "'prompt' must be a non-empty string (one prompt per request)", "prompt")
        request.text_input = prompt
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OpenAIError(400, "'messages' must be a non-empty list", "messages")
        request.messages = [_message(message, index) for index, message in enumerate(messages)]
    parameters = {}
    for name, limits in (("temperature", (float, 0, 2)), ("top_p", (float, 0, 1)), ("top_k", (int, 0, None)),
                         ("seed", (int, 0, None)), ("presence_penalty", (float, -2, 2)),
                         ("frequency_penalty", (float, -2, 2)), ("repetition_penalty", (float, 0, None)),
                         ("min_tokens", (int, 0, None))):
        value = _number(body, name, *limits)
        if value is not None:
            parameters[SAMPLING_FIELDS[name]] = value
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
            raise OpenAIError(400, "'stop' must be a string or a list of up to 4 non-empty strings", "stop")
        parameters[STOP_WORDS] = stops
    parameters[RETURN_NUM_INPUT_TOKENS] = True
    parameters[RETURN_NUM_OUTPUT_TOKENS] = True
    request.parameters = parameters
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    return request, stream, bool(isinstance(options, dict) and options.get("include_usage"))


def _message(message, index: int) -> dict[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise OpenAIError(400, f"messages[{index}] must be an object with a 'role'", "messages")
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text parts can be served
        if not all(isinstance(part, dict) and part.get("type") == "text" for part in content):
            raise OpenAIError(400, f"messages[{index}]: only text content parts are supported", "messages")
        content = "".join(str(part.get("text", "")) for part in content)
    if not isinstance(content, str):
        raise OpenAIError(400, f"messages[{index}].content must be a string", "messages")
    return {"role": message["role"], "content": content}


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


GATEWAY_TIMEOUT = 504  # a stream the server left silent: HTTP's own status for an upstream that went quiet


def _triton_error(error: GenerationError) -> OpenAIError:
    """OpenAI's error object for an error the repository answered (or a server that could not be reached), by
    its kind (`spec/errors.py`: the table, and how a message alone is read: an error inside a gRPC stream
    carries no status code). A stream the server left silent is the one status the table does not give: the
    client's own `ResponseTimeout`, answered 504."""
    message = str(error)
    codes = ERROR_CODES[error.kind]
    if isinstance(error, ResponseTimeout):  # the server went silent: it, not the request, is at fault
        return OpenAIError(GATEWAY_TIMEOUT, message, kind=ERROR_CODES[ErrorKind.UNAVAILABLE].openai)
    if isinstance(error, ServerUnavailable):  # Triton is down or elsewhere: one line for the operator
        logger.warning("answering %d: %s", codes.http, message)
    return OpenAIError(codes.http, message, kind=codes.openai)


SERVED_MODEL_NAME = "tritonforge"  # the model name /v1/models shows unless the operator names it


API_KEY_HELP = ("require 'Authorization: Bearer KEY' on every OpenAI request but GET /health (401 otherwise); "
                f"default: ${API_KEY_ENV}, no key when unset")


def api_key_from_environment(explicit: str | None = None) -> str | None:
    """The API key the gateway requires: the one given, else $TRITONFORGE_API_KEY; None (or empty) = no key."""
    key = explicit if explicit is not None else os.environ.get(API_KEY_ENV)
    return key or None


def authorized(authorization: str | None, api_key: str) -> bool:
    """Does an `Authorization` header carry `Bearer <api_key>`? Compared in constant time."""
    scheme, _, credentials = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), api_key.encode())


UNAUTHORIZED = OpenAIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                           kind="invalid_request_error")


class RequireApiKey:
    """ASGI middleware: a request without `Authorization: Bearer <key>` is answered 401 with OpenAI's error
    object, except on UNAUTHENTICATED_PATHS. Checked before routing, so an unknown path or method is 401 too.
    Plain ASGI rather than Starlette's BaseHTTPMiddleware, which would relay every streamed chunk through a
    queue of its own; this one only reads the headers and then hands the connection over untouched."""

    def __init__(self, app, api_key: str):
        self.app, self.api_key = app, api_key
        self.denial = json.dumps(UNAUTHORIZED.body()).encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in UNAUTHENTICATED_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if authorized(headers.get(b"authorization", b"").decode("latin-1"), self.api_key):
            return await self.app(scope, receive, send)
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(self.denial)).encode())]})
        await send({"type": "http.response.body", "body": self.denial})


def create_app(url: str, *, model: str = DEFAULT_MODEL, served_model_name: str = SERVED_MODEL_NAME,
               api_key: str | None = None):
    """The ASGI app: OpenAI's API over the repository served at `url` (gRPC). With `api_key`, every request but
    `GET /health` needs `Authorization: Bearer <api_key>`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    backend_holder: dict[str, TritonBackend] = {}
    metrics = GatewayMetrics()
    app = FastAPI(title="tritonforge OpenAI gateway")

    def backend() -> TritonBackend:
        if "backend" not in backend_holder:  # made inside the server's event loop
            backend_holder["backend"] = TritonBackend(url, model)
        return backend_holder["backend"]

    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, error: OpenAIError):
        return JSONResponse(error.body(), status_code=error.status)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": 0,
                                            "owned_by": "tritonforge"}]}

    @app.get("/health")
    async def health():
        ok = await backend().ready()
        return Response(status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    async def body_of(request: Request) -> dict:
        try:
            return json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise OpenAIError(400, f"the request body is not valid JSON ({error})") from None

    async def handle(request: Request, kind: str):
        endpoint = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
        try:
            generate_request, stream, include_usage = parse_request(await body_of(request), kind, served_model_name)
        except OpenAIError as error:
            metrics.request_done(endpoint, error.status, started=False)
            raise
        generation = Generation(max_tokens=generate_request.max_tokens)
        created, ident = int(time.time()), f"{'cmpl' if kind == 'completions' else 'chatcmpl'}-{uuid.uuid4().hex}"
        timer = metrics.timer()
        chunks = backend().generate(generate_request, generation)
        if not stream:
            try:
                async for text in chunks:
                    timer.chunk()
                    generation.chunks.append(text)
            except GenerationError as error:
                failure = _triton_error(error)
                metrics.request_done(endpoint, failure.status)
                raise failure from None
            except asyncio.CancelledError:  # the client went away: closing `chunks` stops its generation
                metrics.request_done(endpoint, CLIENT_CLOSED)
                raise
            finally:
                await chunks.aclose()
            metrics.request_done(endpoint, 200, generation)
            return _whole(kind, ident, created, served_model_name, generation)
        # Streamed: the first chunk is awaited here, so a request the server refuses gets a real HTTP error.
        try:
            first = await anext(chunks, None)
        except GenerationError as error:
            failure = _triton_error(error)
            metrics.request_done(endpoint, failure.status)
            raise failure from None
        if first is not None:
            timer.chunk()

        async def events():
            status = 200
            text_event = _TextEvents(kind, ident, created, served_model_name)
            try:
                yield _sse(_chunk(kind, ident, created, served_model_name, first or "", None, role=True))
                async for text in chunks:
                    timer.chunk()
                    yield text_event(text)
                yield _sse(_chunk(kind, ident, created, served_model_name, "", generation.finish_reason))
                if include_usage:
                    yield _sse({"id": ident, "object": _object(kind, True), "created": created,
                                "model": served_model_name, "choices": [], "usage": generation.usage()})
            except GenerationError as error:
                failure = _triton_error(error)
                status = failure.status
                yield _sse(failure.body())
            except asyncio.CancelledError:  # the client went away: closing `chunks` stops its generation
                status = CLIENT_CLOSED
                raise
            finally:
                await chunks.aclose()
                metrics.request_done(endpoint, status, generation if status == 200 else None)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, "chat")

    if api_key:
        app.add_middleware(RequireApiKey, api_key=api_key)
    return app


def _object(kind: str, chunk: bool) -> str:
    if kind == "completions":
        return "text_completion"
    return "chat.completion.chunk" if chunk else "chat.completion"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _chunk(kind: str, ident: str, created: int, model: str, text: str, finish: str | None, role: bool = False) -> dict:
    if kind == "completions":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    else:
        delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"id": ident, "object": _object(kind, True), "created": created, "model": model, "choices": [choice]}


class _TextEvents:
    """The server-sent event of each text chunk of one streamed answer, as `_sse(_chunk(...))` writes it. Those
    events differ only in their text, so the JSON around it is written once and each text is encoded into it
    (this runs once per token)."""

    _PLACEHOLDER = "\x00text\x00"

    def __init__(self, kind: str, ident: str, created: int, model: str):
        event = _sse(_chunk(kind, ident, created, model, self._PLACEHOLDER, None))
        self.before, _, self.after = event.partition(json.dumps(self._PLACEHOLDER, ensure_ascii=False))

    def __call__(self, text: str) -> str:
        return f"{self.before}{json.dumps(text, ensure_ascii=False)}{self.after}"


def _whole(kind: str, ident: str, created: int, model: str, generation: Generation) -> dict:
    text = "".join(generation.chunks)
    if kind == "completions":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": generation.finish_reason}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": generation.finish_reason}
    return {"id": ident, "object": _object(kind, False), "created": created, "model": model, "choices": [choice],
            "usage": generation.usage()}


@dataclass(frozen=True, kw_only=True)
class GatewayOptions:
    """What `tritonforge openai` takes (its flags are generated from these fields)."""

    url: str = setting(help=f"Triton's gRPC address, e.g. localhost:{GRPC_PORT}")
    host: str = setting(LOOPBACK, "address to listen on")
    port: int = setting(OPENAI_PORT, "port to listen on", parse=port_number)
    model: str = setting(DEFAULT_MODEL, "what it calls", choices=(BLS_MODEL, ENSEMBLE_MODEL))
    served_model_name: str = setting(SERVED_MODEL_NAME, "the model name /v1/models shows, and the only one "
                                                        "requests may name")
    api_key: str | None = setting(None, API_KEY_HELP, parse=str)
    workers: int = setting(1, "gateway processes sharing the port: one handles a few thousand streamed chunks a "
                              "second", parse=positive_int)

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")


def run(options: GatewayOptions, *, on_ready=lambda line: None) -> None:
    """Serve the gateway until interrupted. One process handles a few thousand streamed chunks a second;
    `options.workers` processes share the port, each connection going to the one with the fewest open
    connections (`tritonforge.gateway.workers`), and share their metrics; `on_ready(line)` once they
    all serve. The API key: `options.api_key`, else $TRITONFORGE_API_KEY."""
    import uvicorn

    make_app = functools.partial(create_app, options.url, model=options.model,
                                 served_model_name=options.served_model_name,
                                 api_key=api_key_from_environment(options.api_key))
    if options.workers == 1:
        uvicorn.run(make_app(), host=options.host, port=options.port, log_level="warning")
        return
    from .workers import serve_workers

    with tempfile.TemporaryDirectory(prefix="tritonforge-gateway-metrics-") as metrics_dir:
        os.environ[MULTIPROCESS_DIR_ENV] = metrics_dir  # read by the workers' metrics (spawned after this)
        serve_workers(make_app, host=options.host, port=options.port, workers=options.workers,
                      on_worker_exit=forget_worker, on_ready=on_ready)


class GatewayThread:
    """The gateway served by uvicorn in a background thread (beside `tritonforge serve`, and in tests)."""

    def __init__(self, url: str, *, host: str = "127.0.0.1", port: int = OPENAI_PORT, model: str = DEFAULT_MODEL,
                 served_model_name: str = SERVED_MODEL_NAME, api_key: str | None = None):
        import threading

        import uvicorn

        app = create_app(url, model=model, served_model_name=served_model_name, api_key=api_key)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.base_url = f"http://{host}:{port}"
        self.thread = threading.Thread(target=self.server.run, name="openai-gateway", daemon=True)

    def start(self, timeout_s: float = 30) -> "GatewayThread":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the OpenAI gateway did not start on {self.base_url}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
