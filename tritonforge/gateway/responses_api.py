"""OpenAI's Responses API (`POST /v1/responses`), its stateless part, served by translation to chat completions.

A Responses request becomes the chat completions body that asks the same (`chat_body_from_responses`), which the
gateway serves as any other chat request; the chat answer becomes the `response` object (`response_from_chat`),
or, streamed, its chunks become Responses' events (`ResponseEvents`, each written by `sse`). Nothing is stored:
what needs a stored response, conversation or prompt is refused, and `store` is accepted and ignored. Every
refusal is one `OpenAIError`, HTTP 400, whose message and `param` name the Responses field. Nothing here knows
Triton or HTTP.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from .errors import OpenAIError

# Fields that name state kept between requests, and why this server, which keeps none, refuses them.
STATEFUL_FIELDS = {
    "previous_response_id": "nothing is stored, so no response can be continued: send the whole conversation as input",
    "conversation": "nothing is stored, so there is no conversation to add to: send the whole conversation as input",
    "background": "a background response is stored to be fetched later, and nothing is stored",
    "prompt": "stored prompt templates are not supported: send the instructions and input themselves",
}
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}  # Responses → chat
TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}  # a text part's type → its text
TOOL_CHOICES = ("auto", "none", "required")
TEXT_FORMATS = ("text", "json_object", "json_schema")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# A chat answer's finish_reason → why the response is incomplete; any other reason completes it.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


# --- requests ------------------------------------------------------------------------------------------------


def chat_body_from_responses(body) -> dict:
    """A Responses request body (decoded JSON) → the chat completions body that asks the same.

    `instructions` become a leading system message, `input` the messages (a `developer` role is a system one;
    `function_call` items are an assistant message's `tool_calls`, `function_call_output` items tool messages;
    `reasoning` items, an earlier answer's thinking, have no place in a chat and are dropped); function `tools`,
    `tool_choice` and `text.format` take chat's shapes; `max_output_tokens` is `max_completion_tokens`; a stream
    asks for its usage, which `response.completed` carries. `store` is ignored: nothing is stored, whatever it
    says. `metadata` (echoed in the answer), `user`, `include`, `truncation`, `reasoning` and `text.verbosity`
    are ignored too. Sampling fields keep their chat names and are checked by the chat request's reader."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    _refuse_unsupported(body)
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise OpenAIError(400, "'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    if body.get("input") is None:
        raise OpenAIError(400, "'input' is required: this server stores nothing to continue from", "input")
    messages += _input_messages(body["input"])
    chat: dict = {"messages": messages}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    max_output_tokens = body.get("max_output_tokens")
    if max_output_tokens is not None:
        if isinstance(max_output_tokens, bool) or not isinstance(max_output_tokens, int) or max_output_tokens < 1:
            raise OpenAIError(400, f"'max_output_tokens' must be a positive integer, got {max_output_tokens!r}",
                              "max_output_tokens")
        chat["max_completion_tokens"] = max_output_tokens
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _refuse_unsupported(body: dict) -> None:
    for name, why in STATEFUL_FIELDS.items():
        if body.get(name) not in (None, False):
            raise OpenAIError(400, f"'{name}' is not supported: {why}", name)
    # Log probabilities are never generated, so a request that asks for them cannot be answered as asked.
    if body.get("top_logprobs") not in (None, 0):
        raise OpenAIError(400, "'top_logprobs' is not supported by this server", "top_logprobs")
    include = body.get("include")
    if isinstance(include, list) and LOGPROBS_INCLUDE in include:
        raise OpenAIError(400, f"'include' {LOGPROBS_INCLUDE!r} is not supported by this server", "include")


def _input_messages(value) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise OpenAIError(400, "'input' must be a string or a list of input items", "input")
    messages: list[dict] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise OpenAIError(400, f"{where} must be an object", where)
        kind = item.get("type", "message")  # a message may name only its role and content
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            _append_call(messages, {"id": _string(item, "call_id", where), "type": "function",
                                    "function": {"name": _string(item, "name", where),
                                                 "arguments": _string(item, "arguments", where)}})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": _call_output(item.get("output"), f"{where}.output")})
        elif kind != "reasoning":
            raise OpenAIError(400, f"{where}.type {kind!r} is not supported: this server reads message, "
                                   f"function_call, function_call_output and reasoning items", f"{where}.type")
    return messages


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in ROLES:
        raise OpenAIError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
    content = item.get("content")
    if isinstance(content, list):
        content = "".join(_part_text(part, f"{where}.content[{index}]") for index, part in enumerate(content))
    if not isinstance(content, str):
        raise OpenAIError(400, f"{where}.content must be a string or a list of content parts", f"{where}.content")
    return {"role": ROLES[role], "content": content}


def _append_call(messages: list[dict], call: dict) -> None:
    # A chat assistant turn says its text and makes its calls in one message, which Responses splits into a
    # message item and function_call items: they join again here, as the model wrote them.
    if messages and messages[-1]["role"] == "assistant":
        messages[-1].setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(output, where: str) -> str:
    if isinstance(output, list):
        output = "".join(_part_text(part, f"{where}[{index}]") for index, part in enumerate(output))
    if not isinstance(output, str):
        raise OpenAIError(400, f"{where} must be a string or a list of text parts", where)
    return output


def _part_text(part, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    key = TEXT_PARTS.get(kind)
    if key is None:
        raise OpenAIError(400, f"{where}.type {kind!r} is not supported: this server reads text only "
                               f"({', '.join(TEXT_PARTS)})", f"{where}.type")
    return _string(part, key, where)


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise OpenAIError(400, f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def _tools(tools) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise OpenAIError(400, "'tools' must be a list", "tools")
    return [_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools)]


def _tool(tool, where: str) -> dict:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise OpenAIError(400, f"{where}.type {kind!r} is not supported: this server runs no tool itself, it "
                               f"serves function tools only", f"{where}.type")
    function = {"name": _string(tool, "name", where)}
    function.update({key: tool[key] for key in ("description", "parameters", "strict") if tool.get(key) is not None})
    return {"type": "function", "function": function}


def _tool_choice(choice):
    if isinstance(choice, str) and choice in TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise OpenAIError(400, f"'tool_choice' must be one of {', '.join(TOOL_CHOICES)} or "
                           f"{{\"type\": \"function\", \"name\": ...}}, got {choice!r}", "tool_choice")


def _response_format(text) -> dict | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise OpenAIError(400, "'text' must be an object", "text")
    form = text.get("format")
    if form is None:
        return None
    kind = form.get("type") if isinstance(form, dict) else None
    if kind not in TEXT_FORMATS:
        raise OpenAIError(400, f"text.format.type must be one of {', '.join(TEXT_FORMATS)}, got {kind!r}",
                          "text.format.type")
    if kind != "json_schema":
        return {"type": kind}
    schema = {"name": _string(form, "name", "text.format")}
    if not isinstance(form.get("schema"), dict):
        raise OpenAIError(400, "text.format.schema must be a JSON schema (an object)", "text.format.schema")
    schema["schema"] = form["schema"]
    schema.update({key: form[key] for key in ("description", "strict") if form.get(key) is not None})
    return {"type": "json_schema", "json_schema": schema}


# --- answers -------------------------------------------------------------------------------------------------
# Item ids derive from the response's: one random hex per response, "msg_<hex>" its message, "fc_<hex>_<n>" its
# n-th call.


def response_from_chat(chat: dict, body: dict) -> dict:
    """A chat completion answer (`chat.completion`) → the `response` object answering the Responses request
    `body`: a message item when the answer has text (or has nothing else), then a function_call item per tool
    call; incomplete when the answer was cut short."""
    ident = uuid.uuid4().hex
    choice = chat["choices"][0]
    message = choice.get("message") or {}
    text, calls = message.get("content"), message.get("tool_calls") or []
    output = [_message_item(ident, text or "")] if text or not calls else []
    output += [_call_item(ident, position, call["id"], call["function"]["name"], call["function"]["arguments"])
               for position, call in enumerate(calls)]
    status, reason = _close(output, choice.get("finish_reason"))
    return _response(ident, chat["created"], chat["model"], body, output, status, reason=reason,
                     usage=_usage(chat.get("usage")))


def _message_item(ident: str, text: str | None, status: str = "completed") -> dict:
    return {"id": f"msg_{ident}", "type": "message", "role": "assistant", "status": status,
            "content": [] if text is None else [_text_part(text)]}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": []}


def _call_item(ident: str, position: int, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"id": f"fc_{ident}_{position}", "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _close(output: list[dict], finish_reason: str | None) -> tuple[str, str | None]:
    """The status of a response whose answer ended for `finish_reason`, and why it is incomplete if it is. Its
    items are closed: completed, but for the last of an answer cut short, the one left unfinished."""
    reason = INCOMPLETE_REASONS.get(finish_reason)
    for item in output:
        item["status"] = "completed"
    if reason and output:
        output[-1]["status"] = "incomplete"
    return ("incomplete" if reason else "completed"), reason


def _response(ident: str, created_at: int, model: str, body: dict, output: list[dict], status: str, *,
              reason: str | None = None, usage: dict | None = None, error: dict | None = None) -> dict:
    """The `response` object in `status`, with the fields the openai SDK's `Response` requires (`output_text` is
    none of them: the SDK computes it from the output)."""
    metadata = body.get("metadata")
    parallel_tool_calls = body.get("parallel_tool_calls")
    return {"id": f"resp_{ident}", "object": "response", "created_at": created_at, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None, "error": error,
            "incomplete_details": {"reason": reason} if reason else None, "model": model,
            "output": output, "usage": usage,
            # The request's settings, echoed as OpenAI does; truncation is never done, whatever was asked.
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": metadata if isinstance(metadata, dict) else {},
            "parallel_tool_calls": parallel_tool_calls if isinstance(parallel_tool_calls, bool) else True,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "text": body.get("text") or {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [], "truncation": "disabled", "previous_response_id": None,
            "reasoning": None, "background": False, "store": False}


def _usage(usage: dict | None) -> dict | None:
    if not usage:
        return None
    inputs, outputs = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    # cache_write_tokens: the openai SDK's ResponseUsage requires it, and the engine reports no cache writes.
    return {"input_tokens": inputs, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": outputs, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": usage.get("total_tokens", inputs + outputs)}


# --- streaming -----------------------------------------------------------------------------------------------


@dataclass
class _StreamedCall:
    position: int  # among the answer's tool calls: its item id
    output_index: int
    call_id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class ResponseEvents:
    """The Responses events of one streamed answer, from its chat completion chunks: `start` before the first
    chunk, `push` each chunk, then `finish` when the chunks end, or `failed` when the answer breaks off. Each
    event is a dict with its `type` and a `sequence_number` counting from 0.

    The message item opens at the first text, a function_call item at each tool call's first delta, in the order
    they come (their `output_index`); all are closed by `finish`, which ends with `response.completed` (or
    `response.incomplete` for an answer cut short) carrying the whole response, as `response_from_chat` builds
    it from the same answer."""

    def __init__(self, body: dict, model: str) -> None:
        self.body, self.model = body, model
        self.ident = uuid.uuid4().hex
        self.created_at = int(time.time())
        self.sequence_number = 0
        self.text: list[str] | None = None  # the message's text pieces; None until its first
        self.message_index = 0
        self.calls: dict[int, _StreamedCall] = {}  # by the chunk's tool call index
        self.items = 0  # output items opened: the next one's output_index
        self.finish_reason: str | None = None
        self.usage: dict | None = None

    def start(self) -> list[dict]:
        return [self._event("response.created", response=self._in_progress()),
                self._event("response.in_progress", response=self._in_progress())]

    def push(self, chunk: dict) -> list[dict]:
        events = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:  # one: a request asks for one sequence
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self.text is None:
                    events += self._open_message()
                self.text.append(text)
                events.append(self._event("response.output_text.delta", item_id=f"msg_{self.ident}",
                                          output_index=self.message_index, content_index=0, delta=text, logprobs=[]))
            for call in delta.get("tool_calls") or []:
                events += self._call_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[dict]:
        # An answer of neither text nor calls still has its (empty) message, as response_from_chat gives it.
        events = self._open_message() if self.text is None and not self.calls else []
        output = self._output()
        status, reason = _close(output, self.finish_reason)
        response = _response(self.ident, self.created_at, self.model, self.body, output, status, reason=reason,
                             usage=_usage(self.usage))
        for index, item in enumerate(output):
            if item["type"] == "message":
                part = item["content"][0]
                events.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                          content_index=0, text=part["text"], logprobs=[]))
                events.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                          content_index=0, part=part))
            else:
                events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                          output_index=index, arguments=item["arguments"]))
            events.append(self._event("response.output_item.done", output_index=index, item=item))
        events.append(self._event(f"response.{response['status']}", response=response))
        return events

    def failed(self, error: dict) -> list[dict]:
        """An error mid-stream (OpenAI's error object, or a body holding it under "error"): the `error` event,
        then `response.failed` with what was generated so far."""
        error = error.get("error", error)
        message = str(error.get("message") or "the answer broke off")
        # Responses' error codes are a closed list; of them, these two say whose fault it was.
        code = "invalid_prompt" if error.get("type") == "invalid_request_error" else "server_error"
        output = [{**item, "status": "incomplete"} for item in self._output()]
        response = _response(self.ident, self.created_at, self.model, self.body, output, "failed",
                             usage=_usage(self.usage), error={"code": code, "message": message})
        return [self._event("error", code=error.get("code") or error.get("type"), message=message,
                            param=error.get("param")),
                self._event("response.failed", response=response)]

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event

    def _in_progress(self) -> dict:
        return _response(self.ident, self.created_at, self.model, self.body, [], "in_progress")

    def _open_message(self) -> list[dict]:
        self.text, self.message_index = [], self.items
        self.items += 1
        return [self._event("response.output_item.added", output_index=self.message_index,
                            item=_message_item(self.ident, None, "in_progress")),
                self._event("response.content_part.added", item_id=f"msg_{self.ident}",
                            output_index=self.message_index, content_index=0, part=_text_part(""))]

    def _call_delta(self, delta: dict) -> list[dict]:
        events = []
        function = delta.get("function") or {}
        call = self.calls.get(delta.get("index", 0))
        if call is None:  # its first delta names it
            call = self.calls[delta.get("index", 0)] = _StreamedCall(
                len(self.calls), self.items, delta.get("id") or f"call_{uuid.uuid4().hex}", function.get("name") or "")
            self.items += 1
            events.append(self._event("response.output_item.added", output_index=call.output_index,
                                      item=_call_item(self.ident, call.position, call.call_id, call.name, "",
                                                      "in_progress")))
        elif function.get("name"):
            call.name += function["name"]
        if function.get("arguments"):
            call.arguments.append(function["arguments"])
            events.append(self._event("response.function_call_arguments.delta",
                                      item_id=f"fc_{self.ident}_{call.position}", output_index=call.output_index,
                                      delta=function["arguments"]))
        return events

    def _output(self) -> list[dict]:
        """The output items so far, in output_index order (which is their position: indexes count from 0)."""
        items = {call.output_index: _call_item(self.ident, call.position, call.call_id, call.name,
                                               "".join(call.arguments)) for call in self.calls.values()}
        if self.text is not None:
            items[self.message_index] = _message_item(self.ident, "".join(self.text))
        return [items[index] for index in sorted(items)]


def sse(event: dict) -> str:
    """One Responses event as a server-sent event, named by its type. (A Responses stream ends with its last
    event; it has no `data: [DONE]`.)"""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
