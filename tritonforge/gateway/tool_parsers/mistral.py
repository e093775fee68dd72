"""Mistral's tool calls."""

from __future__ import annotations

from ..tool_calls import ToolCall
from .base import ToolParser, loads, read_call, skip_blanks


class MistralToolParser(ToolParser):
    """Mistral: `[TOOL_CALLS]` and a JSON list of `{"name": ..., "arguments": {...}}` (tokenizers before v11),
    or `[TOOL_CALLS]name[ARGS]{...}` once per call (v11 on; `[ARGS]` absent from some tokenizers' text). The
    marker is a special token: the text has it only where the detokenizer keeps special tokens."""

    name = "mistral"
    START, ARGS = "[TOOL_CALLS]", "[ARGS]"
    markers = (START,)
    NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

    def read_region(self, text, scanner):
        start = skip_blanks(text, len(self.START))
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
        call = read_call({"name": text[start:name_end], "arguments": loads(text[arguments:end])}, ("arguments",),
                     arguments_needed=True)
        return end, [call] if call else None

    @staticmethod
    def _listed_calls(text: str) -> list[ToolCall] | None:
        value = loads(text)
        if not isinstance(value, list) or not value:
            return None
        calls = [read_call(item, ("arguments",), arguments_needed=False) for item in value]
        return None if None in calls else calls
