"""What every tool-call parser shares: the base class that splits a text into content and call regions, the
streaming reader that runs it over chunks, the scanner that finds where a JSON value ends, and the readers of a
call's JSON."""

from __future__ import annotations

import json
from typing import ClassVar

from ..tool_calls import ToolCall


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


def loads(text: str):
    """The JSON value of `text`, None where it is not JSON (raw control characters in its strings accepted, as a
    model writes them: the call's arguments are written again, escaped)."""
    try:
        return json.loads(text, strict=False)
    except ValueError:
        return None


def read_call(value, argument_keys: tuple[str, ...], arguments_needed: bool) -> ToolCall | None:
    """The call `{"name": ..., <one of argument_keys>: {...}}` makes, None where `value` is no call."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    present = [key for key in argument_keys if key in value]
    if not present and arguments_needed:
        return None
    arguments = value[present[0]] if present else {}
    if isinstance(arguments, str):  # some models write the arguments as JSON text, as OpenAI answers them
        arguments = loads(arguments)
    return ToolCall.new(name=value["name"], arguments=arguments) if isinstance(arguments, dict) else None


def skip_blanks(text: str, index: int) -> int:
    while index < len(text) and text[index].isspace():
        index += 1
    return index
