"""OpenAI's API as the gateway speaks it: the request bodies it accepts and the answers it emits.

Reading: a body (JSON) becomes an `OpenAIRequest`, checked against OpenAI's types and ranges; every refusal
is one `OpenAIError`, HTTP 400, whose message and `param` name the field. What one sequence of plain text
cannot give (`n` > 1, `logprobs`, `echo`, `best_of` > 1, `logit_bias`, a `response_format` other than text,
tools) is refused; unknown fields are accepted and ignored, as vLLM does. Writing: the whole answer, the
streamed chunks as server-sent events, the usage chunk, the error object. Nothing here knows Triton.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import NamedTuple

from ..facts.errors import ERROR_CODES, ErrorKind

COMPLETIONS, CHAT = "completions", "chat"  # the two generating endpoints, as `kind` names them
PATHS = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}
DEFAULT_MAX_TOKENS = {COMPLETIONS: 16, CHAT: 256}  # OpenAI's completions default; chat has none
# OpenAI's sampling fields: (type, lowest, highest), None for no bound; checked in this order.
SAMPLING_RANGES = {"temperature": (float, 0, 2), "top_p": (float, 0, 1), "top_k": (int, 0, None),
                   "seed": (int, 0, None), "presence_penalty": (float, -2, 2), "frequency_penalty": (float, -2, 2),
                   "repetition_penalty": (float, 0, None), "min_tokens": (int, 0, None)}
MAX_STOP_STRINGS = 4  # OpenAI's limit
ONE_SEQUENCE_FIELDS = ("n", "best_of")  # served at 1 only
# Fields that ask for what plain text cannot give; sent empty (None, False, 0, {}, []) they ask for nothing.
UNSUPPORTED_FIELDS = ("logprobs", "top_logprobs", "logit_bias", "tools", "functions", "suffix")
DONE_EVENT = "data: [DONE]\n\n"  # the last event of every stream, a failed one's included


class OpenAIError(Exception):
    """An error answered as OpenAI's error object, with its HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = ERROR_CODES[ErrorKind.CLIENT].openai, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# --- requests ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OpenAIRequest:
    """A completions or chat request, checked: what it asks the engine for, and how it wants the answer."""

    kind: str  # COMPLETIONS or CHAT
    prompt: str | None  # completions: the one prompt
    messages: list[dict[str, str]] | None  # chat: {"role", "content"} each, content as text
    max_tokens: int
    sampling: dict[str, int | float]  # the sampling fields given, by OpenAI's names (SAMPLING_RANGES)
    stop: list[str] | None
    stream: bool
    include_usage: bool  # a streamed answer ends with a chunk of the usage


def read_body(raw: bytes):
    """The JSON value of a request body."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise OpenAIError(400, f"the request body is not valid JSON ({error})") from None


def read_request(body, kind: str, served_model_name: str | None = None) -> OpenAIRequest:
    """A decoded request body → the request it makes. With `served_model_name`, a request that names another
    model is answered 404 `model_not_found`, as OpenAI does."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    _check_model(body.get("model"), served_model_name)
    _refuse_unsupported(body)
    max_tokens = _number(body, "max_completion_tokens", int, 1) or _number(body, "max_tokens", int, 1)
    if kind == COMPLETIONS:
        prompt, messages = _prompt(body.get("prompt")), None
    else:
        prompt, messages = None, _messages(body.get("messages"))
    sampling = _sampling(body)
    stop = _stop(body.get("stop"))
    options = body.get("stream_options") or {}
    return OpenAIRequest(kind=kind, prompt=prompt, messages=messages,
                         max_tokens=max_tokens or DEFAULT_MAX_TOKENS[kind], sampling=sampling, stop=stop,
                         stream=bool(body.get("stream", False)),
                         include_usage=bool(isinstance(options, dict) and options.get("include_usage")))


def _check_model(model, served_model_name: str | None) -> None:
    if served_model_name is not None and model is not None and model != served_model_name:
        raise OpenAIError(404, f"The model {model!r} does not exist: this server serves {served_model_name!r} "
                               f"(GET /v1/models)", "model", code="model_not_found")


def _refuse_unsupported(body: dict) -> None:
    for name in ONE_SEQUENCE_FIELDS:
        if body.get(name) not in (None, 1):
            raise OpenAIError(400, f"'{name}' > 1 is not supported by this engine (one sequence per request)", name)
    for name in UNSUPPORTED_FIELDS:
        if body.get(name) not in (None, False, 0, {}, []):
            raise OpenAIError(400, f"'{name}' is not supported by this server", name)
    if body.get("echo"):
        raise OpenAIError(400, "'echo' is not supported by this server", "echo")
    if body.get("response_format") not in (None, {"type": "text"}):
        raise OpenAIError(400, "only response_format {\"type\": \"text\"} is supported", "response_format")


def _number(body: dict, name: str, kind, low=None, high=None):
    """The field `name` as `kind` (int or float), None when absent; 400 naming it when of another type or out
    of [low, high]."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise OpenAIError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}", name)
    if (low is not None and value < low) or (high is not None and value > high):
        raise OpenAIError(400, f"'{name}' must be in [{low}, {high}], got {value}", name)
    return kind(value)


def _prompt(prompt) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise OpenAIError(400, "'prompt' must be a non-empty string (one prompt per request)", "prompt")
    return prompt


def _messages(messages) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "'messages' must be a non-empty list", "messages")
    return [_message(message, index) for index, message in enumerate(messages)]


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


def _sampling(body: dict) -> dict[str, int | float]:
    sampling = {}
    for name, limits in SAMPLING_RANGES.items():
        value = _number(body, name, *limits)
        if value is not None:
            sampling[name] = value
    return sampling


def _stop(stop) -> list[str] | None:
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise OpenAIError(400, f"'stop' must be a string or a list of up to {MAX_STOP_STRINGS} non-empty strings",
                          "stop")
    return stops


# --- answers -------------------------------------------------------------------------------------------------


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


class ResponseHead(NamedTuple):
    """What the answer and every chunk of one request repeat; unpacked (`*head`) into the builders below."""

    kind: str
    ident: str
    created: int
    model: str

    @classmethod
    def new(cls, kind: str, model: str) -> ResponseHead:
        prefix = "cmpl" if kind == COMPLETIONS else "chatcmpl"
        return cls(kind, f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)


def model_list(served_model_name: str) -> dict:
    """`GET /v1/models`: the one model served."""
    return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": 0,
                                        "owned_by": "tritonforge"}]}


def object_name(kind: str, chunk: bool) -> str:
    if kind == COMPLETIONS:
        return "text_completion"
    return "chat.completion.chunk" if chunk else "chat.completion"


def sse_event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def stream_chunk(kind: str, ident: str, created: int, model: str, text: str, finish: str | None,
                 role: bool = False) -> dict:
    """One chunk of a streamed answer; `role`: the first chunk of a chat, which says who speaks."""
    if kind == COMPLETIONS:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    else:
        delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"id": ident, "object": object_name(kind, True), "created": created, "model": model,
            "choices": [choice]}


def usage_chunk(kind: str, ident: str, created: int, model: str, generation: Generation) -> dict:
    """The last chunk of a stream that asked for its usage: no choices (the `openai` client reads `choices`
    of every chunk)."""
    return {"id": ident, "object": object_name(kind, True), "created": created, "model": model, "choices": [],
            "usage": generation.usage()}


class TextEvents:
    """The server-sent event of each text chunk of one streamed answer, as `sse_event(stream_chunk(...))` writes
    it. Those events differ only in their text, so the JSON around it is written once and each text is encoded
    into it (this runs once per token)."""

    _PLACEHOLDER = "\x00text\x00"

    def __init__(self, kind: str, ident: str, created: int, model: str):
        event = sse_event(stream_chunk(kind, ident, created, model, self._PLACEHOLDER, None))
        self.before, _, self.after = event.partition(json.dumps(self._PLACEHOLDER, ensure_ascii=False))

    def __call__(self, text: str) -> str:
        return f"{self.before}{json.dumps(text, ensure_ascii=False)}{self.after}"


def whole_response(kind: str, ident: str, created: int, model: str, generation: Generation) -> dict:
    """The answer of a request that was not streamed, with its usage."""
    text = "".join(generation.chunks)
    if kind == COMPLETIONS:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": generation.finish_reason}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": generation.finish_reason}
    return {"id": ident, "object": object_name(kind, False), "created": created, "model": model,
            "choices": [choice], "usage": generation.usage()}
