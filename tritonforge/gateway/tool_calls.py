"""Tool calling and structured output in OpenAI's chat API: what a request asks for, and the calls the model made.

Reading: `tools` and `tool_choice` become `Tool`s and a `ToolChoice`, `response_format` a `Guide`; every
refusal is one `OpenAIError`, HTTP 400, whose message names the field. Guiding: what the engine must enforce
(the arguments of the one named tool, a list of calls when one is required, the answer's schema) goes as an
EBNF grammar, which xgrammar writes from the JSON schema with no free whitespace: a model may otherwise pad
JSON with blanks until max_tokens, as a random-weight model does. Parsing: the calls in what the model wrote,
guided (`calls_from_guided_output`) or in its own format when it chose to call (`PARSERS`), from the whole
text or streamed. Nothing here knows Triton; xgrammar is imported only where a grammar is written.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import ClassVar

from ..runtime.engine.guided import EBNF_GRAMMAR, compile_error  # EBNF_GRAMMAR: what every guide is sent as
from .errors import OpenAIError

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function and response-format names
NAME_RULE = "1 to 64 letters, digits, '_' or '-'"
AUTO, NONE, REQUIRED, NAMED = "auto", "none", "required", "named"  # ToolChoice.mode
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
ANY_OBJECT = {"type": "object"}  # what response_format json_object asks for


# --- what a request asks for ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Guide:
    """What the engine is asked to enforce: a guide type of the contract's and its text."""

    guide_type: str
    guide: str


@dataclass(frozen=True, kw_only=True)
class Tool:
    """One function the model may call."""

    name: str
    description: str | None
    parameters: dict  # the JSON schema of its arguments, an object's; no properties when the request gave none

    def as_openai(self) -> dict:
        """The tool in OpenAI's shape, which chat templates read."""
        function = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True, kw_only=True)
class ToolChoice:
    """Whether the model may call (auto), must not (none), must call some tool (required) or the one named."""

    mode: str
    name: str | None = None  # the tool a NAMED choice names

    def __post_init__(self):
        if self.mode not in (AUTO, NONE, REQUIRED, NAMED):
            raise ValueError(f"mode must be one of {AUTO}, {NONE}, {REQUIRED}, {NAMED}, got {self.mode!r}")
        if (self.mode == NAMED) != (self.name is not None):
            raise ValueError(f"a tool name goes with mode {NAMED} and no other, got {self.mode!r} and {self.name!r}")


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One call the model made, as OpenAI answers it."""

    id: str
    name: str
    arguments: str  # the JSON text of the arguments object

    @classmethod
    def new(cls, *, name: str, arguments: dict) -> ToolCall:
        """A call with a fresh id, its arguments written as OpenAI writes them (no blanks)."""
        return cls(id=f"call_{uuid.uuid4().hex[:24]}", name=name,
                   arguments=json.dumps(arguments, ensure_ascii=False, separators=(",", ":")))

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _refusal(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param)


def read_tools(tools, tool_choice) -> tuple[list[Tool], ToolChoice]:
    """A chat request's `tools` and `tool_choice`, checked. As OpenAI: `tool_choice` is "auto" when tools are
    given and "none" when not; "auto" without tools reads as "none", since there is nothing to call."""
    read = _tools(tools)
    return read, _tool_choice(tool_choice, read)


def _tools(tools) -> list[Tool]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _refusal("'tools' must be a list of functions", "tools")
    read = [_tool(tool, index) for index, tool in enumerate(tools)]
    for index, tool in enumerate(read):
        if any(earlier.name == tool.name for earlier in read[:index]):
            raise _refusal(f"tools[{index}].function.name {tool.name!r} is given twice: names must be unique", "tools")
    return read


def _tool(tool, index: int) -> Tool:
    where = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise _refusal(f"{where} must be an object", "tools")
    if tool.get("type") != "function":
        raise _refusal(f"{where}.type must be 'function', got {tool.get('type')!r}", "tools")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _refusal(f"{where}.function must be an object", "tools")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise _refusal(f"{where}.function.name must be {NAME_RULE}, got {name!r}", "tools")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise _refusal(f"{where}.function.description must be a string", "tools")
    if not isinstance(function.get("strict", False), bool):
        raise _refusal(f"{where}.function.strict must be a boolean", "tools")
    parameters = function.get("parameters")
    # OpenAI: "omitting parameters defines a function with an empty parameter list"; `{}` says no more.
    if parameters is None or parameters == {}:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise _refusal(f"{where}.function.parameters must be a JSON schema (an object)", "tools")
    if parameters.get("type", "object") != "object":
        raise _refusal(f"{where}.function.parameters must describe an object (type 'object'), got type "
                       f"{parameters['type']!r}", "tools")
    return Tool(name=name, description=description, parameters=parameters)


def _tool_choice(choice, tools: list[Tool]) -> ToolChoice:
    if choice is None:
        return ToolChoice(mode=AUTO if tools else NONE)
    if isinstance(choice, str):
        if choice not in (AUTO, NONE, REQUIRED):
            raise _refusal(f"tool_choice must be 'auto', 'none', 'required' or a function, got {choice!r}",
                           "tool_choice")
        if choice == REQUIRED and not tools:
            raise _refusal("tool_choice 'required' needs tools to call; none are given", "tool_choice")
        return ToolChoice(mode=choice if tools else NONE)
    function = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(function, dict):
        raise _refusal("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": "
                       "{\"name\": ...}}", "tool_choice")
    name = function.get("name")
    if not isinstance(name, str):
        raise _refusal("tool_choice.function.name must be a string", "tool_choice")
    if not any(tool.name == name for tool in tools):
        given = ", ".join(tool.name for tool in tools) or "none"
        raise _refusal(f"tool_choice.function.name {name!r} names no function in tools (given: {given})",
                       "tool_choice")
    return ToolChoice(mode=NAMED, name=name)


def read_response_format(response_format) -> Guide | None:
    """A chat request's `response_format`, checked: None for text, else the guide of the JSON it asks for."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise _refusal("response_format must be an object", "response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return _guide(ANY_OBJECT, "response_format", "response_format")
    if kind == "json_schema":
        return _guide(_json_schema(response_format.get("json_schema")), "response_format.json_schema.schema",
                      "response_format")
    raise _refusal(f"response_format.type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, got {kind!r}",
                   "response_format")


def _json_schema(spec) -> dict:
    if not isinstance(spec, dict):
        raise _refusal("response_format.json_schema must be an object with a 'name' and a 'schema'", "response_format")
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise _refusal(f"response_format.json_schema.name must be {NAME_RULE}, got {name!r}", "response_format")
    if spec.get("description") is not None and not isinstance(spec["description"], str):
        raise _refusal("response_format.json_schema.description must be a string", "response_format")
    if not isinstance(spec.get("strict", False), bool):
        raise _refusal("response_format.json_schema.strict must be a boolean", "response_format")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise _refusal("response_format.json_schema.schema must be a JSON schema (an object)", "response_format")
    return schema


# --- guides --------------------------------------------------------------------------------------------------


def tool_guide(tools: list[Tool], choice: ToolChoice, parallel: bool = True) -> Guide | None:
    """What the model must write for `choice`: for a named tool, the JSON object of its arguments; when a call
    is required, a JSON list of one call or more (exactly one unless `parallel`: OpenAI's
    `parallel_tool_calls`), each `{"name": <a tool's name>, "arguments": <its arguments>}`. None when the model
    is free (auto, none): a parser then reads what it wrote."""
    if choice.mode == NAMED:
        index = next(index for index, tool in enumerate(tools) if tool.name == choice.name)
        return _guide(_arguments_schema(tools[index]), f"tools[{index}].function.parameters", "tools")
    if choice.mode != REQUIRED:
        return None
    calls = {"type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}), "items": {"anyOf": [
        {"type": "object", "required": ["name", "arguments"],
         "properties": {"name": {"const": tool.name},
                        "arguments": _moved(_arguments_schema(tool), f"#/items/anyOf/{index}/properties/arguments")}}
        for index, tool in enumerate(tools)]}}
    try:
        return Guide(guide_type=EBNF_GRAMMAR, guide=_ebnf(calls))
    except RuntimeError as error:
        # Name the tool whose schema xgrammar cannot take: each is tried alone, once the list failed.
        for index, tool in enumerate(tools):
            _guide(_arguments_schema(tool), f"tools[{index}].function.parameters", "tools")
        raise _refusal(f"tools cannot be enforced together: {compile_error(error)}", "tools") from None


def _arguments_schema(tool: Tool) -> dict:
    # A schema without a type would let the model answer with any JSON value; arguments are an object.
    return tool.parameters if "type" in tool.parameters else {"type": "object", **tool.parameters}


def _moved(schema, pointer: str):
    """`schema` as it reads at `pointer` inside another: its local references ("#/$defs/...") point into it there."""
    if isinstance(schema, dict):
        return {key: pointer + value[1:] if key == "$ref" and isinstance(value, str) and value.startswith("#")
                else _moved(value, pointer) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_moved(value, pointer) for value in schema]
    return schema


def _guide(schema: dict, where: str, param: str) -> Guide:
    """The guide to the JSON `schema` allows; a refusal naming `where` when xgrammar cannot write it."""
    try:
        return Guide(guide_type=EBNF_GRAMMAR, guide=_ebnf(schema))
    except RuntimeError as error:  # xgrammar's errors, InvalidJSONError among them
        raise _refusal(f"{where} is not a JSON schema this server can enforce: {compile_error(error)}", param) from None


def _ebnf(schema: dict) -> str:
    """The EBNF grammar (xgrammar's dialect) of the JSON `schema` allows, with no whitespace but the one blank
    after each ':' and ',' (as json.dumps writes it); strict: no properties or items the schema does not name."""
    import xgrammar

    return str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True))


def calls_from_guided_output(text: str, tools: list[Tool], choice: ToolChoice) -> list[ToolCall]:
    """The calls in what `tool_guide(tools, choice)` made the model write; none where the text is not whole JSON
    (cut by max_tokens) or nothing was guided."""
    try:
        value = json.loads(text, strict=False)  # raw control characters in strings: the grammar lets them through
    except ValueError:
        return []
    if choice.mode == NAMED:
        return [ToolCall.new(name=choice.name, arguments=value)] if isinstance(value, dict) else []
    if choice.mode != REQUIRED or not isinstance(value, list):
        return []
    names = {tool.name for tool in tools}
    return [ToolCall.new(name=item["name"], arguments=item["arguments"]) for item in value
            if isinstance(item, dict) and item.get("name") in names and isinstance(item.get("arguments"), dict)]


# --- calls in a model's own format -----------------------------------------------------------------------------


class ToolParser:
    """Finds the tool calls a model wrote in its own format, when it was free to call (tool_choice auto).

    The text splits into content and call regions. A region starts where `region_start` says (at a marker such
    as `<tool_call>`) and `read_region` reads it whole into calls, or finds it is no call: then its text stays
    content, as does a region the text ends inside. Whitespace between content and a call belongs to neither.
    `parse` runs the streaming reader over the whole text, so both read alike.
    """

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]]  # what starts a region anywhere; streamed content never ends in a prefix

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(The content, None when there is nothing but calls; the calls)."""
        reader = self.streaming()
        content, calls = reader.push(text)
        rest, more = reader.finish()
        content, calls = content + rest, calls + more
        return (None if calls and not content else content), calls

    def streaming(self) -> StreamingToolParser:
        return StreamingToolParser(self)

    def region_start(self, text: str, *, started: bool, after_call: bool) -> int | None:
        """Where in `text` (content so far unread) the first region starts, None where none does yet.
        `started`: content or a region came before; `after_call`: only whitespace since the last call."""
        starts = [index for index in (text.find(marker) for marker in self.markers) if index >= 0]
        return min(starts, default=None)

    def read_region(self, text: str, scanner: JsonScanner) -> tuple[int, list[ToolCall] | None] | None:
        """`text` starts a region: (its length, its calls, or None where it is no call), or None where it goes
        on past `text`. `scanner` finds the end of a JSON value in it, scanning each character once."""
        raise NotImplementedError


class StreamingToolParser:
    """The content and calls of one streamed answer, as its text arrives. Content is given out as soon as it
    cannot be the start of a call: never a prefix of a marker, nor the whitespace before one."""

    def __init__(self, parser: ToolParser):
        self.parser = parser
        self._unread = ""  # text not given out yet: a region's, or content that may still start one
        self._gap = ""  # the whitespace before the region being read: dropped if it is a call
        self._scanner: JsonScanner | None = None  # set while a region is read
        self._started = False  # content other than whitespace, or a region, came before
        self._after_call = False  # only whitespace came since the last call

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        """(Content safe to show now, calls completed now)."""
        self._unread += text
        return self._read(final=False)

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What the end of the text completes; a region left open is content."""
        return self._read(final=True)

    def _read(self, final: bool) -> tuple[str, list[ToolCall]]:
        content, calls = [], []
        while True:
            if self._scanner is None:
                start = self.parser.region_start(self._unread, started=self._started, after_call=self._after_call)
                if start is None:
                    kept = 0 if final else _unsafe_tail(self._unread, self.parser.markers)
                    content.append(self._content(self._unread[:len(self._unread) - kept]))
                    self._unread = self._unread[len(self._unread) - kept:]
                    break
                before = self._unread[:start]
                content.append(self._content(before.rstrip()))
                self._gap, self._unread = before[len(before.rstrip()):], self._unread[start:]
                self._scanner = JsonScanner()
            region = self.parser.read_region(self._unread, self._scanner)
            if region is None and not final:
                break
            length, region_calls = region if region is not None else (len(self._unread), None)
            if region_calls is None:
                content.append(self._content(self._gap + self._unread[:length]))
            else:
                calls.extend(region_calls)
                self._after_call = True
            self._started, self._scanner, self._gap = True, None, ""
            self._unread = self._unread[length:]
        return "".join(content), calls

    def _content(self, text: str) -> str:
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        self._started = self._started or bool(text.strip())
        return text


def _unsafe_tail(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` may still begin a region: a marker's prefix, and the whitespace
    before it."""
    prefix = max((size for marker in markers for size in range(1, len(marker)) if text.endswith(marker[:size])),
                 default=0)
    rest = text[:len(text) - prefix]
    return len(text) - len(rest.rstrip())


class JsonScanner:
    """Finds where the JSON object or array starting at one place of a growing text ends, by its brackets
    (strings skipped), reading each character once however often it is asked."""

    def __init__(self):
        self._start: int | None = None
        self._next = 0  # the first character not scanned
        self._depth = 0
        self._in_string = self._escaped = False

    def end(self, text: str, start: int) -> int | None:
        """The index just past the value starting at `start` (always the same for one scanner), None where the
        text ends first."""
        if self._start is None:
            self._start = self._next = start
        for index in range(self._next, len(text)):
            char = text[index]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._next = index + 1
                    return index + 1
        self._next = len(text)
        return None


def _loads(text: str):
    """The JSON value of `text`, None where it is not JSON (raw control characters in its strings accepted, as a
    model writes them: the call's arguments are written again, escaped)."""
    try:
        return json.loads(text, strict=False)
    except ValueError:
        return None


def _call(value, argument_keys: tuple[str, ...], arguments_needed: bool) -> ToolCall | None:
    """The call `{"name": ..., <one of argument_keys>: {...}}` makes, None where `value` is no call."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    present = [key for key in argument_keys if key in value]
    if not present and arguments_needed:
        return None
    arguments = value[present[0]] if present else {}
    if isinstance(arguments, str):  # some models write the arguments as JSON text, as OpenAI answers them
        arguments = _loads(arguments)
    return ToolCall.new(name=value["name"], arguments=arguments) if isinstance(arguments, dict) else None


def _skip_blanks(text: str, index: int) -> int:
    while index < len(text) and text[index].isspace():
        index += 1
    return index


class HermesToolParser(ToolParser):
    """Hermes and Qwen: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, as many as it calls,
    anywhere in the text."""

    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"
    markers = (START,)

    def read_region(self, text, scanner):
        end = text.find(self.END, len(self.START))
        if end < 0:
            return None
        call = _call(_loads(text[len(self.START):end]), ("arguments",), arguments_needed=False)
        return end + len(self.END), [call] if call else None


class Llama3JsonToolParser(ToolParser):
    """Llama 3.x with JSON tools: an answer that starts with `<|python_tag|>` (kept only where special tokens
    are) or `{` is one call `{"name": ..., "parameters": {...}}` or several separated by ";". A JSON object without a
    name and parameters (or arguments) is content: an answer in JSON, not a call."""

    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"
    SEPARATOR = ";"
    markers = (PYTHON_TAG,)

    def region_start(self, text, *, started, after_call):
        tag = super().region_start(text, started=started, after_call=after_call)
        if not started:
            openers = "{"
        elif after_call:
            openers = "{" + self.SEPARATOR
        else:
            openers = ""
        first = _skip_blanks(text, 0)
        if first < len(text) and text[first] in openers:
            return first if tag is None else min(first, tag)
        return tag

    def read_region(self, text, scanner):
        opener = next((opener for opener in (self.PYTHON_TAG, self.SEPARATOR) if text.startswith(opener)), "")
        start = _skip_blanks(text, len(opener))
        if start == len(text):
            return None
        if text[start] != "{":  # e.g. Llama's built-in tools, `<|python_tag|>brave_search.call(query="...")`
            return start, None
        end = scanner.end(text, start)
        if end is None:
            return None
        call = _call(_loads(text[start:end]), ("parameters", "arguments"), arguments_needed=True)
        return end, [call] if call else None


class MistralToolParser(ToolParser):
    """Mistral: `[TOOL_CALLS]` and a JSON list of `{"name": ..., "arguments": {...}}` (tokenizers before v11),
    or `[TOOL_CALLS]name[ARGS]{...}` once per call (v11 on; `[ARGS]` absent from some tokenizers' text). The
    marker is a special token: the text has it only where the detokenizer keeps special tokens."""

    name = "mistral"
    START, ARGS = "[TOOL_CALLS]", "[ARGS]"
    markers = (START,)
    NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

    def read_region(self, text, scanner):
        start = _skip_blanks(text, len(self.START))
        if start == len(text):
            return None
        if text[start] == "[":
            end = scanner.end(text, start)
            if end is None:
                return None
            return end, self._listed_calls(text[start:end])
        name_end = start
        while name_end < len(text) and text[name_end] in self.NAME_CHARACTERS:
            name_end += 1
        arguments = name_end + len(self.ARGS) if text.startswith(self.ARGS, name_end) else name_end
        if arguments >= len(text) or self.ARGS.startswith(text[name_end:]):
            return None  # the name, or [ARGS], is still coming
        if name_end == start or text[arguments] != "{":
            return arguments, None
        end = scanner.end(text, arguments)
        if end is None:
            return None
        call = _call({"name": text[start:name_end], "arguments": _loads(text[arguments:end])}, ("arguments",),
                     arguments_needed=True)
        return end, [call] if call else None

    @staticmethod
    def _listed_calls(text: str) -> list[ToolCall] | None:
        value = _loads(text)
        if not isinstance(value, list) or not value:
            return None
        calls = [_call(item, ("arguments",), arguments_needed=False) for item in value]
        return None if None in calls else calls


PARSERS: dict[str, type[ToolParser]] = {parser.name: parser for parser in
                                        (HermesToolParser, Llama3JsonToolParser, MistralToolParser)}
# The marker a chat template writes around tool calls, and the parser of its format; the first found decides.
TEMPLATE_MARKERS = (("[TOOL_CALLS]", MistralToolParser.name), ("<tool_call>", HermesToolParser.name),
                    ("<|python_tag|>", Llama3JsonToolParser.name), ("ipython", Llama3JsonToolParser.name))


def parser_for_chat_template(chat_template: str | None) -> str:
    """The parser whose format a chat template's markers imply; "hermes", the most common, where none does."""
    for marker, name in TEMPLATE_MARKERS:
        if chat_template and marker in chat_template:
            return name
    return HermesToolParser.name
