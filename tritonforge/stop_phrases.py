"""String-level stop phrases over streamed text.

The engine matches stop words as token ids, and a phrase tokenizes differently alone and mid-sentence, so
some stops are missed there. This filter works on the text itself: text that could still become the start
of a stop phrase is held back until decided; the phrase and everything after it is never emitted.
"""

from __future__ import annotations


class StopPhraseFilter:
    def __init__(self, phrases: list[str]):
        self.phrases = [phrase for phrase in phrases if phrase]
        self._pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Feed new text; return what can be emitted now. After a stop, returns "" forever."""
        if self.stopped:
            return ""
        buffer = self._pending + text
        matches = [index for index in (buffer.find(phrase) for phrase in self.phrases) if index >= 0]
        if matches:
            self.stopped = True
            self._pending = ""
            return buffer[: min(matches)]
        held = self._held_suffix(buffer)
        self._pending = buffer[len(buffer) - held:]
        return buffer[: len(buffer) - held]

    def flush(self) -> str:
        """The stream ended without a stop: release what was held back."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def _held_suffix(self, buffer: str) -> int:
        """Length of the longest end of `buffer` that is a proper prefix of some phrase."""
        longest = 0
        for phrase in self.phrases:
            for size in range(min(len(phrase) - 1, len(buffer)), longest, -1):
                if buffer.endswith(phrase[:size]):
                    longest = size
                    break
        return longest


def truncate_at_stop(text: str, phrases: list[str]) -> tuple[str, bool]:
    """Non-streamed text cut before the first stop phrase; and whether one was found."""
    stop_filter = StopPhraseFilter(phrases)
    out = stop_filter.push(text)
    return (out, True) if stop_filter.stopped else (out + stop_filter.flush(), False)
