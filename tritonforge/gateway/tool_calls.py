"""Tool calling and structured output in OpenAI's chat API: what a request asks for, and the calls the model made.

Reading: `tools` and `tool_choice` become `Tool`s and a `ToolChoice`, `response_format` a `Guide`; every
refusal is one `OpenAIError`, HTTP 400, whose message names the field. Guiding: what the engine must enforce
(the arguments of the one named tool, a list of calls when one is required, the answer's schema) goes as an
EBNF grammar, which xgrammar writes from the JSON schema with no free whitespace: a model may otherwise pad
JSON with blanks until max_tokens, as a random-weight model does. Parsing: the calls in what the model wrote,
guided (`calls_from_guided_output`); the calls a model writes in its own format when it chose to call are
read by `tool_parsers/`, one parser a file. Nothing here knows Triton; xgrammar is imported only where a grammar
is written.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

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
