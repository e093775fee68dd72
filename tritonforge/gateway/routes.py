"""The gateway's HTTP app: its routes, who may call them (the API key), and its metrics.

`GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`, `POST /v1/responses` (answered by
`serving`), `GET /health`
(200 once Triton and the model are ready, else 503), `GET /metrics` (Prometheus). With an API key, every
request but `GET /health` must carry `Authorization: Bearer <key>`, or it is answered 401 with OpenAI's error
object, as vLLM's and trtllm-serve's `--api-key` do.
"""

# No `from __future__ import annotations` here: FastAPI reads the route handlers' annotations (`Request`) at
# runtime, and they are imported inside create_app so that this module imports without FastAPI.
import hmac
import json

from ..facts.errors import ERROR_CODES, ErrorKind
from .metrics import GatewayMetrics
from .protocol import CHAT, COMPLETIONS, PATHS, RESPONSES_PATH, OpenAIError, model_list
from .serving import DEFAULT_MODEL, DEFAULT_STREAM_INTERVAL, DEFAULT_TOOL_PARSER, SERVED_MODEL_NAME, OpenAIServing

INTERNAL = ERROR_CODES[ErrorKind.INTERNAL]
# The one path answered without the key: a load balancer's or kubelet's health check carries no credentials.
UNAUTHENTICATED_PATHS = frozenset({"/health"})
UNAUTHORIZED = OpenAIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                           kind=ERROR_CODES[ErrorKind.CLIENT].openai)


def create_app(url: str, *, model: str = DEFAULT_MODEL, served_model_name: str = SERVED_MODEL_NAME,
               api_key: str | None = None, stream_interval: int = DEFAULT_STREAM_INTERVAL,
               tool_parser: str = DEFAULT_TOOL_PARSER, reasoning_parser: str | None = None,
               adapters: dict[str, int] | None = None):
    """The ASGI app: OpenAI's API over the repository served at `url` (gRPC). With `api_key`, every request but
    `GET /health` needs `Authorization: Bearer <api_key>`. `stream_interval`: the BLS's engine responses per
    streamed chunk after the first. `tool_parser`: the format of the tool calls the model writes;
    `reasoning_parser`: of its thinking, set apart as `reasoning_content` (None: none). `adapters`: the LoRA
    adapters served beside the model (name → task id), each a `model` requests may name."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    metrics = GatewayMetrics(served_model_name)
    serving = OpenAIServing(url, model=model, served_model_name=served_model_name, metrics=metrics,
                            stream_interval=stream_interval, tool_parser=tool_parser,
                            reasoning_parser=reasoning_parser, adapters=adapters)
    app = FastAPI(title="tritonforge OpenAI gateway")

    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, error: OpenAIError):
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(Exception)
    async def gateway_failure(request: Request, error: Exception):
        # Anything else is the gateway's own fault: still OpenAI's error object (clients read its message), never
        # Starlette's plain-text "Internal Server Error". Starlette raises the error again once this answer is
        # sent, so uvicorn logs its traceback.
        metrics.request_done(request.url.path, INTERNAL.http, started=False)
        return JSONResponse(internal_error(error).body(), status_code=INTERNAL.http)

    @app.get("/v1/models")
    async def models():
        return model_list(served_model_name, adapters)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if await serving.ready() else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    def reply(answered):
        if isinstance(answered, dict):
            return answered
        return StreamingResponse(answered, media_type="text/event-stream")

    async def answer(kind: str, request: Request):
        return reply(await serving.answer(kind, await request.body()))

    @app.post(PATHS[COMPLETIONS])
    async def completions(request: Request):
        return await answer(COMPLETIONS, request)

    @app.post(PATHS[CHAT])
    async def chat_completions(request: Request):
        return await answer(CHAT, request)

    @app.post(RESPONSES_PATH)
    async def responses(request: Request):
        return reply(await serving.respond(await request.body()))

    if api_key:
        app.add_middleware(RequireApiKey, api_key=api_key)
    return app


def internal_error(error: Exception) -> OpenAIError:
    """OpenAI's error object for a failure of the gateway itself, naming it."""
    return OpenAIError(INTERNAL.http, f"the gateway failed on this request: {type(error).__name__}: {error} (its "
                                      f"log has the details)", kind=INTERNAL.openai)


def authorized(authorization: str | None, api_key: str) -> bool:
    """Does an `Authorization` header carry `Bearer <api_key>`? Compared in constant time."""
    scheme, _, credentials = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), api_key.encode())


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
