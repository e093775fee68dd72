"""Llama 3.x's JSON tool calls."""

from __future__ import annotations

from .base import ToolParser, loads, read_call, skip_blanks


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
        first = skip_blanks(text, 0)
        if first < len(text) and text[first] in openers:
            return first if tag is None else min(first, tag)
        return tag

    def read_region(self, text, scanner):
        opener = next((opener for opener in (self.PYTHON_TAG, self.SEPARATOR) if text.startswith(opener)), "")
        start = skip_blanks(text, len(opener))
        if start == len(text):
            return None
        if text[start] != "{":  # e.g. Llama's built-in tools, `<|python_tag|>brave_search.call(query="...")`
            return start, None
        end = scanner.end(text, start)
        if end is None:
            return None
        call = read_call(loads(text[start:end]), ("parameters", "arguments"), arguments_needed=True)
        return end, [call] if call else None
