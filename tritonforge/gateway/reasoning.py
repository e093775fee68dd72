"""A reasoning model's thinking, set apart from its answer: the text between `<think>` and `</think>` is a chat
answer's `reasoning_content`, what follows is its `content` (and where tool calls are read).

Two formats, as the models write them: `qwen3` (Qwen3, and others that open their thinking themselves: the
answer thinks only when it starts with `<think>`) and `deepseek_r1` (DeepSeek-R1, whose chat template opens the
thinking in the prompt: the answer thinks from its first token until `</think>`, whether or not it repeats
the opening tag). Read as the text streams: a piece that may begin a tag is held back until it is known.
"""

from __future__ import annotations

THINK_START, THINK_END = "<think>", "</think>"
REASONING_PARSERS = ("qwen3", "deepseek_r1")


def _held_prefix(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag`."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ReasoningReader:
    """One answer's text in pieces → (reasoning, content) pieces, in the `parser` format (REASONING_PARSERS)."""

    def __init__(self, parser: str):
        if parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning parser must be one of {', '.join(REASONING_PARSERS)}, got {parser!r}")
        self.state = "thinking" if parser == "deepseek_r1" else "start"
        self.thought = self.state == "thinking"  # did the answer think at all
        self.opening_allowed = True  # a leading <think> is the thinking's tag, not its text
        self.after_thinking = False  # the blank lines between </think> and the answer are neither
        self.held = ""

    def push(self, text: str) -> tuple[str, str]:
        self.held += text
        reasoning, content = "", ""
        while self.held:
            if self.state == "answering":
                if self.after_thinking:
                    self.held = self.held.lstrip()
                    self.after_thinking = not self.held
                content, self.held = content + self.held, ""
            elif self.opening_allowed:
                stripped = self.held.lstrip()
                if len(stripped) < len(THINK_START) and THINK_START.startswith(stripped):
                    break  # may still become the opening tag
                self.opening_allowed = False
                if stripped.startswith(THINK_START):
                    self.held, self.state, self.thought = stripped[len(THINK_START):], "thinking", True
                elif self.state == "start":
                    self.state = "answering"
            else:  # thinking
                end = self.held.find(THINK_END)
                if end >= 0:
                    reasoning += self.held[:end]
                    self.held, self.state = self.held[end + len(THINK_END):], "answering"
                    self.after_thinking = True
                    continue
                keep = _held_prefix(self.held, THINK_END)
                reasoning += self.held[:len(self.held) - keep]
                self.held = self.held[len(self.held) - keep:]
                break
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What is held at the end: thinking cut short stays reasoning; anything else is content."""
        held, self.held = self.held, ""
        return (held, "") if self.state == "thinking" else ("", held)


def split_reasoning(parser: str, text: str) -> tuple[str | None, str]:
    """A whole answer → (its reasoning, None when it did not think; its content)."""
    reader = ReasoningReader(parser)
    reasoning, content = reader.push(text)
    rest_reasoning, rest_content = reader.finish()
    return (reasoning + rest_reasoning if reader.thought else None), content + rest_content
