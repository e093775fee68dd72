"""OpenAI's API as the gateway speaks it: the request bodies it accepts and the answers it emits.

Reading: a body (JSON) becomes an `OpenAIRequest`, checked against OpenAI's types and ranges; every refusal
is one `OpenAIError`, HTTP 400, whose message and `param` name the field. Tools and `response_format` are read
by `tool_calls`, which turns them into the grammar the engine enforces; `logprobs` (and chat's `top_logprobs`)
and completions' `echo` through `logprobs`. What the engines cannot give (`best_of` > 1, `logit_bias`, `suffix`)
is refused; unknown fields are
accepted and ignored, as vLLM does. Writing: the whole answer, the streamed chunks as server-sent events, the
usage chunk, the error object. Nothing here knows Triton.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ..facts.contract import MAX_TOP_LOG_PROBS
from ..runtime.text.tokenization import RESERVED_TEMPLATE_ARGUMENTS
from .errors import OpenAIError
from .logprobs import TokenLogProb, choice_logprobs
from .tool_calls import Guide, Tool, ToolCall, ToolChoice, read_response_format, read_tools, tool_guide

COMPLETIONS, CHAT = "completions", "chat"  # the two generating endpoints, as `kind` names them
PATHS = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}
RESPONSES_PATH = "/v1/responses"  # answered as the chat it amounts to (`responses_api`)
DEFAULT_MAX_TOKENS = {COMPLETIONS: 16, CHAT: 256}  # OpenAI's completions default; chat has none
# OpenAI's sampling fields: (type, lowest, highest), None for no bound; checked in this order. top_k,
# repetition_penalty and min_tokens are vLLM's additions.
SAMPLING_RANGES = {"temperature": (float, 0, 2), "top_p": (float, 0, 1), "top_k": (int, 0, None),
                   "seed": (int, 0, None), "presence_penalty": (float, -2, 2), "frequency_penalty": (float, -2, 2),
                   "repetition_penalty": (float, 0, None), "min_tokens": (int, 0, None)}
MAX_STOP_STRINGS = 4  # OpenAI's limit
# Choices a request may ask for (`n`, times the prompts of a completions request): each is one engine request,
# so one request could otherwise take the engine's whole batch.
MAX_CHOICES = 16
# Fields that ask for what the engines cannot give; sent empty (None, False, 0, {}, []) they ask for nothing.
UNSUPPORTED_FIELDS = ("logit_bias", "functions", "function_call", "suffix")
MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")
DONE_EVENT = "data: [DONE]\n\n"  # the last event of every stream, a failed one's included


# --- requests ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OpenAIRequest:
    """A completions or chat request, checked: what it asks the engine for, and how it wants the answer."""

    kind: str  # COMPLETIONS or CHAT
    prompts: list[str] | None  # completions: one choice (or `n`) per prompt
    messages: list[dict] | None  # chat: {"role", "content"} each (content as text), tool calls and results
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = ToolChoice(mode="none")
    template_kwargs: dict = field(default_factory=dict)  # chat_template_kwargs, passed to the chat template
    guide: Guide | None = None  # what the engine must hold the text to: a forced tool call, or response_format
    n: int = 1
    max_tokens: int
    sampling: dict[str, int | float]  # the sampling fields given, by OpenAI's names (SAMPLING_RANGES)
    stop: list[str] | None
    stream: bool
    include_usage: bool  # a streamed answer ends with a chunk of the usage
    logprobs: int | None = None  # each token's log probability with this many alternatives (None: not asked)
    echo: bool = False  # completions: the answer starts with the prompt (and its log probabilities)
    model: str | None = None  # the model the request named: the served model or one of its LoRA adapters
    lora_task_id: int | None = None  # the adapter's task id where it named one

    @property
    def parses_tool_calls(self) -> bool:
        return self.kind == CHAT and self.tool_choice.mode != "none"

    def chat(self) -> list[dict] | dict:
        """The messages as preprocessing takes them: the list alone, or with the tools and template arguments."""
        if not self.tools and not self.template_kwargs:
            return self.messages
        return {"messages": self.messages, "tools": [tool.as_openai() for tool in self.tools],
                "chat_template_kwargs": self.template_kwargs}


def read_body(raw: bytes):
    """The JSON value of a request body."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise OpenAIError(400, f"the request body is not valid JSON ({error})") from None


def read_request(body, kind: str, served_model_name: str | None = None,
                 adapters: Mapping[str, int] | None = None) -> OpenAIRequest:
    """A decoded request body → the request it makes. With `served_model_name`, a request that names another
    model, nor one of the LoRA `adapters` (name → task id), is answered 404 `model_not_found`, as OpenAI does."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    model = body.get("model")
    lora_task_id = _check_model(model, served_model_name, adapters or {})
    _refuse_unsupported(body)
    # An echoed completion may ask for no new token: the prompt alone, with its log probabilities.
    echo = kind == COMPLETIONS and bool(_boolean(body, "echo"))
    max_tokens = _number(body, "max_completion_tokens", int, 1)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", int, 0 if echo else 1)
    n = _number(body, "n", int, 1, MAX_CHOICES) or 1
    guide = read_response_format(body.get("response_format"))
    if kind == COMPLETIONS:
        prompts, messages = _prompts(body.get("prompt")), None
        tools, choice, template_kwargs = [], ToolChoice(mode="none"), {}
        if n * len(prompts) > MAX_CHOICES:
            raise OpenAIError(400, f"n × the prompts must be at most {MAX_CHOICES}, got {n * len(prompts)}", "n")
    else:
        prompts, messages = None, _messages(body.get("messages"))
        tools, choice = read_tools(body.get("tools"), body.get("tool_choice"))
        parallel = body.get("parallel_tool_calls", True)
        if not isinstance(parallel, bool):
            raise OpenAIError(400, "'parallel_tool_calls' must be true or false", "parallel_tool_calls")
        guide = tool_guide(tools, choice, parallel) or guide  # a call the request forces is what the text must be
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, dict) or RESERVED_TEMPLATE_ARGUMENTS & set(template_kwargs):
            raise OpenAIError(400, f"'chat_template_kwargs' must be an object without "
                                   f"{', '.join(sorted(RESERVED_TEMPLATE_ARGUMENTS))}", "chat_template_kwargs")
    options = body.get("stream_options") or {}
    logprobs = _chat_logprobs(body) if kind == CHAT else _completion_logprobs(body)
    return OpenAIRequest(kind=kind, prompts=prompts, messages=messages, tools=tools, tool_choice=choice,
                         template_kwargs=template_kwargs, guide=guide, n=n,
                         max_tokens=DEFAULT_MAX_TOKENS[kind] if max_tokens is None else max_tokens,
                         sampling=_sampling(body), echo=echo,
                         stop=_stop(body.get("stop")), stream=bool(body.get("stream", False)),
                         include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
                         logprobs=logprobs, model=model if isinstance(model, str) else None,
                         lora_task_id=lora_task_id)


def _boolean(body: dict, name: str) -> bool | None:
    """The field `name` as true or false, None when absent or null; 400 naming it when of another type."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise OpenAIError(400, f"'{name}' must be true or false", name)
    return value


def _completion_logprobs(body: dict) -> int | None:
    """A completion's `logprobs`: the alternatives asked for each token (0 to 20); None (or false): not asked."""
    if body.get("logprobs") is False:
        return None
    return _number(body, "logprobs", int, 0, MAX_TOP_LOG_PROBS)


def _chat_logprobs(body: dict) -> int | None:
    """A chat's `logprobs` (true or false) and `top_logprobs` (0 to 20, which needs `logprobs` true): the
    alternatives asked for each token, None when log probabilities are not."""
    logprobs = _boolean(body, "logprobs")
    top = _number(body, "top_logprobs", int, 0, MAX_TOP_LOG_PROBS)
    if top and not logprobs:
        raise OpenAIError(400, "'top_logprobs' needs 'logprobs' to be true", "top_logprobs")
    return (top or 0) if logprobs else None


def _check_model(model, served_model_name: str | None, adapters: Mapping[str, int]) -> int | None:
    """The task id of the LoRA adapter `model` names; None for the served model (or none named)."""
    if model in adapters:
        return adapters[model]
    if served_model_name is not None and model is not None and model != served_model_name:
        served = ", ".join(repr(name) for name in [served_model_name, *adapters])
        raise OpenAIError(404, f"The model {model!r} does not exist: this server serves {served} (GET /v1/models)",
                          "model", code="model_not_found")
    return None


def _refuse_unsupported(body: dict) -> None:
    if body.get("best_of") not in (None, 1):
        raise OpenAIError(400, "'best_of' > 1 is not supported by this server (ask for n choices instead)", "best_of")
    for name in UNSUPPORTED_FIELDS:
        if body.get(name) not in (None, False, 0, {}, []):
            raise OpenAIError(400, f"'{name}' is not supported by this server", name)


def _number(body: dict, name: str, kind, low=None, high=None):
    """The field `name` as `kind` (int or float), None when absent; 400 naming it when of another type or out
    of [low, high]."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise OpenAIError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}", name)
    if (low is not None and value < low) or (high is not None and value > high):
        raise OpenAIError(400, f"'{name}' must be {_range(low, high)}, got {value}", name)
    return kind(value)


def _range(low, high) -> str:
    """[low, high] in words where one end is open: "at least 1", not "in [1, None]"."""
    if high is None:
        return f"at least {low}"
    return f"at most {high}" if low is None else f"in [{low}, {high}]"


def _prompts(prompt) -> list[str]:
    prompts = prompt if isinstance(prompt, list) else [prompt]
    if not prompts or not all(isinstance(one, str) and one for one in prompts):
        raise OpenAIError(400, "'prompt' must be a non-empty string or a list of them (token ids are not "
                               "accepted)", "prompt")
    return prompts


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "'messages' must be a non-empty list", "messages")
    return [_message(message, index) for index, message in enumerate(messages)]


def _message(message, index: int) -> dict:
    """One message as the chat template takes it: role and text content, an assistant's tool calls, a tool
    result's call id."""
    if not isinstance(message, dict) or message.get("role") not in MESSAGE_ROLES:
        raise OpenAIError(400, f"messages[{index}] must be an object with a 'role', one of "
                               f"{', '.join(MESSAGE_ROLES)}", "messages")
    role, content, calls = message["role"], message.get("content"), message.get("tool_calls")
    role = "system" if role == "developer" else role  # OpenAI's newer name for it, which chat templates do not know
    if isinstance(content, list):  # content parts: only text parts can be served
        if not all(isinstance(part, dict) and part.get("type") == "text" for part in content):
            raise OpenAIError(400, f"messages[{index}]: only text content parts are supported", "messages")
        content = "".join(str(part.get("text", "")) for part in content)
    read = {"role": role, "content": content}
    if role == "assistant" and calls:
        read["tool_calls"] = _tool_calls(calls, index)
    elif not isinstance(content, str):
        raise OpenAIError(400, f"messages[{index}].content must be a string", "messages")
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise OpenAIError(400, f"messages[{index}].tool_call_id must be a string", "messages")
        read["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        read["name"] = message["name"]
    return read


def _tool_calls(calls, index: int) -> list[dict]:
    """An assistant message's tool calls, kept as OpenAI writes them (arguments as JSON text)."""
    where = f"messages[{index}].tool_calls"
    if not isinstance(calls, list):
        raise OpenAIError(400, f"{where} must be a list", "messages")
    read = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(function, dict) or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments"), str)):
            raise OpenAIError(400, f"{where}[{number}] must be {{\"id\", \"type\": \"function\", \"function\": "
                                   f"{{\"name\", \"arguments\"}}}} with arguments as a JSON string", "messages")
        read.append({"id": str(call.get("id", "")), "type": "function",
                     "function": {"name": function["name"], "arguments": function["arguments"]}})
    return read


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
    """What came back for one choice: text chunks, token counts, the tool calls read from the text, and how it
    ended."""

    max_tokens: int
    index: int = 0  # the choice's place in the answer
    prompt_index: int = 0  # which prompt of the request it answers (usage counts each prompt once)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunks: list[str] = field(default_factory=list)
    logprobs: list[TokenLogProb] | None = None  # every token's, as they came (None: not asked)
    echo: str | None = None  # the prompt the text starts with (completions' `echo`)
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None  # the text left besides reasoning and tool calls, once read; else the chunks
    reasoning: str | None = None  # the thinking a reasoning parser set apart

    @property
    def text(self) -> str | None:
        return self.content if self.tool_calls or self.content is not None else "".join(self.chunks)

    @property
    def prompt_only(self) -> bool:
        """An echoed prompt with no new token (`max_tokens` 0): the engine's one token is not shown."""
        return self.max_tokens == 0

    @property
    def finish_reason(self) -> str:
        if self.tool_calls:
            return "tool_calls"
        return "length" if self.completion_tokens >= self.max_tokens else "stop"

    def usage(self) -> dict:
        return usage([self])


def usage(generations: list[Generation]) -> dict:
    """The usage of an answer: each prompt's tokens once, every choice's completion tokens."""
    prompts = {generation.prompt_index: generation.prompt_tokens for generation in generations}
    prompt_tokens = sum(prompts.values())
    completion_tokens = sum(generation.completion_tokens for generation in generations)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


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


def model_list(served_model_name: str, adapters: Mapping[str, int] | None = None) -> dict:
    """`GET /v1/models`: the model served, then each LoRA adapter on it (its `parent`, as vLLM lists them)."""
    base = {"id": served_model_name, "object": "model", "created": 0, "owned_by": "tritonforge"}
    return {"object": "list", "data": [base, *({**base, "id": name, "root": name, "parent": served_model_name}
                                               for name in adapters or {})]}


def object_name(kind: str, chunk: bool) -> str:
    if kind == COMPLETIONS:
        return "text_completion"
    return "chat.completion.chunk" if chunk else "chat.completion"


def sse_event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def stream_chunk(kind: str, ident: str, created: int, model: str, text: str, finish: str | None,
                 role: bool = False, index: int = 0, logprobs: dict | None = None) -> dict:
    """One chunk of a streamed answer; `role`: the first chunk of a chat's choice, which says who speaks;
    `logprobs`: those of the tokens it adds (`logprobs.choice_logprobs`)."""
    if kind == COMPLETIONS:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    else:
        delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    return {"id": ident, "object": object_name(kind, True), "created": created, "model": model,
            "choices": [choice]}


def reasoning_chunk(kind: str, ident: str, created: int, model: str, text: str, index: int = 0) -> dict:
    """A chat chunk of thinking (vLLM's and DeepSeek's `reasoning_content` delta)."""
    return {"id": ident, "object": object_name(kind, True), "created": created, "model": model,
            "choices": [{"index": index, "delta": {"reasoning_content": text}, "logprobs": None,
                         "finish_reason": None}]}


def tool_calls_chunk(kind: str, ident: str, created: int, model: str, calls: list[ToolCall], first: int,
                     index: int = 0) -> dict:
    """A chat chunk carrying whole tool calls, numbered from `first` within the choice (each call's deltas are
    told apart by that number, and this one delta holds all of it)."""
    deltas = [{"index": first + number, **call.as_openai()} for number, call in enumerate(calls)]
    return {"id": ident, "object": object_name(kind, True), "created": created, "model": model,
            "choices": [{"index": index, "delta": {"tool_calls": deltas}, "logprobs": None, "finish_reason": None}]}


def usage_chunk(kind: str, ident: str, created: int, model: str, generations: list[Generation]) -> dict:
    """The last chunk of a stream that asked for its usage: no choices (the `openai` client reads `choices`
    of every chunk)."""
    return {"id": ident, "object": object_name(kind, True), "created": created, "model": model, "choices": [],
            "usage": usage(generations)}


class TextEvents:
    """The server-sent event of each text chunk of one streamed choice, as `sse_event(stream_chunk(...))` writes
    it. Those events differ only in their text, so the JSON around it is written once and each text is encoded
    into it (this runs once per token)."""

    _PLACEHOLDER = "\x00text\x00"

    def __init__(self, kind: str, ident: str, created: int, model: str, index: int = 0):
        event = sse_event(stream_chunk(kind, ident, created, model, self._PLACEHOLDER, None, index=index))
        self.before, _, self.after = event.partition(json.dumps(self._PLACEHOLDER, ensure_ascii=False))

    def __call__(self, text: str) -> str:
        return f"{self.before}{json.dumps(text, ensure_ascii=False)}{self.after}"


def whole_response(kind: str, ident: str, created: int, model: str, generations: list[Generation]) -> dict:
    """The answer of a request that was not streamed, a choice per generation, with its usage."""
    choices = []
    for generation in generations:
        logprobs = None if generation.logprobs is None else choice_logprobs(kind == CHAT, generation.logprobs)
        if kind == COMPLETIONS:
            choice = {"index": generation.index, "text": generation.text, "logprobs": logprobs,
                      "finish_reason": generation.finish_reason}
        else:
            message = {"role": "assistant", "content": generation.text}
            if generation.reasoning is not None:
                message["reasoning_content"] = generation.reasoning
            if generation.tool_calls:
                message["tool_calls"] = [call.as_openai() for call in generation.tool_calls]
            choice = {"index": generation.index, "message": message, "logprobs": logprobs,
                      "finish_reason": generation.finish_reason}
        choices.append(choice)
    return {"id": ident, "object": object_name(kind, False), "created": created, "model": model,
            "choices": choices, "usage": usage(generations)}
