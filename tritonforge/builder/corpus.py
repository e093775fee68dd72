"""A few pages of English prose (data/corpus.txt): the replay engine's tokens are this text through the
model's tokenizer, the tiny models' tokenizers are trained on it and the benchmarks' prompts are cut from it,
so that every token streamed in a test or a benchmark decodes to ordinary text."""

from __future__ import annotations

from importlib import resources


def corpus_lines() -> list[str]:
    text = resources.files("tritonforge.builder").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]
