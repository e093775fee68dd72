"""The tool calls a model writes in its own format, read when a request lets it choose (tool_choice auto): one
parser a file, as vLLM lays them out, registered here by the name `--tool-parser` takes."""

from __future__ import annotations

from .base import ToolParser
from .hermes import HermesToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser

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
