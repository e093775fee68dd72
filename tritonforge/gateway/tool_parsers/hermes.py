"""Hermes and Qwen's tool calls."""

from __future__ import annotations

from .base import ToolParser, loads, read_call


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
        call = read_call(loads(text[len(self.START):end]), ("arguments",), arguments_needed=False)
        return end + len(self.END), [call] if call else None
