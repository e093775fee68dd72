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
        # The phrase that completes first wins, as if the text had arrived one character at a time.
        matches = [(index + len(phrase), index) for phrase in self.phrases
                   if (index := buffer.find(phrase)) >= 0]
        if matches:
            self.stopped = True
            self._pending = ""
            return buffer[: min(matches)[1]]
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
    """Whole text cut before the first stop phrase to complete; and whether one was found."""
    stop_filter = StopPhraseFilter(phrases)
    out = "".join(stop_filter.push(char) for char in text)
    return (out, True) if stop_filter.stopped else (out + stop_filter.flush(), False)
