"""Guided decoding in the transformers engine, with xgrammar (the library TensorRT-LLM uses).

`Grammars` compiles a request's guide (runtime/engine/guided.py) once, in `validate`, against the tokenizer's
vocabulary read once per engine; xgrammar's compiler caches what it compiled, so a schema many requests share
compiles once. `GrammarMasks` holds a token bitmask per slot ([slots, ceil(vocab / 32)] int32, a set bit = an
allowed token): before each step the engine thread fills the rows of the guided sequences from their matchers
and copies the bitmask to the device once; `apply` sets the logits of every disallowed token to -inf with
fixed-shape ops, so it runs inside a captured decode step too. A slot without a grammar keeps every bit set:
its logits go through unchanged.
"""

from __future__ import annotations

import json
import logging
import math

import torch

from ....facts.contract import GUIDED_DECODING_GUIDE
from ....facts.errors import RequestError
from ..guided import EBNF_GRAMMAR, JSON, JSON_SCHEMA, REGEX, STRUCTURAL_TAG, GuidedDecoding, compile_error

logger = logging.getLogger(__name__)

# What compiled grammars may hold in memory: TensorRT-LLM's default (XGRAMMAR_CACHE_LIMIT_GB=1).
CACHE_LIMIT_BYTES = 1 << 30
ALL_ALLOWED = -1  # a bitmask word with every bit set


def xgrammar_available() -> bool:
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return False
    return True


class Grammars:
    """Compiles guides for one tokenizer. `vocab_size` is the model's (its logits' width), which may exceed the
    tokenizer's: the ids past the tokenizer's are never allowed."""

    def __init__(self, tokenizer, vocab_size: int):
        import xgrammar

        self._xgrammar = xgrammar
        self.vocab_size = max(vocab_size, len(tokenizer))
        self.info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
        self.compiler = xgrammar.GrammarCompiler(self.info, cache_enabled=True, cache_limit_bytes=CACHE_LIMIT_BYTES)

    def compile(self, guided: GuidedDecoding):
        """The compiled grammar, or a RequestError naming guided_decoding_guide and xgrammar's reason."""
        compiler = self.compiler
        try:
            if guided.guide_type == JSON:
                return compiler.compile_builtin_json_grammar()
            if guided.guide_type == JSON_SCHEMA:
                return compiler.compile_json_schema(guided.guide)
            if guided.guide_type == REGEX:
                return compiler.compile_regex(guided.guide)
            if guided.guide_type == EBNF_GRAMMAR:
                return compiler.compile_grammar(guided.guide)
            if guided.guide_type == STRUCTURAL_TAG:
                return self._structural_tag(guided.guide)
        except RequestError:
            raise
        except Exception as error:  # noqa: BLE001 - xgrammar raises RuntimeError, ValueError, its own errors
            raise RequestError(GUIDED_DECODING_GUIDE, f"the {guided.guide_type} guide does not compile: "
                                                      f"{compile_error(error)}") from None
        raise ValueError(f"unknown guide type {guided.guide_type!r}")  # guided.py admits none other

    def _structural_tag(self, guide: str):
        """xgrammar's format as it is; the older `{"structures": [{begin, schema, end}], "triggers": [...]}`
        (vLLM's and TensorRT-LLM's OpenAI servers) through xgrammar's call for it."""
        try:
            spec = json.loads(guide)
        except ValueError as error:
            raise RequestError(GUIDED_DECODING_GUIDE, f"the structural_tag guide is not JSON: {error}") from None
        if isinstance(spec, dict) and "structures" in spec:
            items = spec["structures"]
            if not isinstance(items, list) or not all(isinstance(item, dict) and {"begin", "schema", "end"} <= set(item)
                                                      for item in items):
                raise RequestError(GUIDED_DECODING_GUIDE, "the structural_tag guide's structures must each have "
                                                          "begin, schema and end")
            tags = [self._xgrammar.StructuralTagItem(begin=item["begin"], schema=item["schema"], end=item["end"])
                    for item in items]
            return self.compiler.compile_structural_tag(tags, spec.get("triggers", []))
        return self.compiler.compile_structural_tag(guide)

    def matcher(self, grammar):
        """A fresh matcher of a compiled grammar. Its stop tokens are the tokenizer's EOS, as in TensorRT-LLM: the
        grammar allows them only where the text may end, and the engine ends the row once one is accepted."""
        return self._xgrammar.GrammarMatcher(grammar)


class GrammarMasks:
    """The token bitmask of every slot, on the host (pinned on CUDA) and at a fixed address on the device."""

    def __init__(self, slots: int, grammars: Grammars, logits_vocab: int, device: torch.device):
        words = math.ceil(grammars.vocab_size / 32)
        self.host = torch.full((slots, words), ALL_ALLOWED, dtype=torch.int32, pin_memory=device.type == "cuda")
        self.device = self.host if device.type == "cpu" else self.host.to(device)
        token = torch.arange(logits_vocab, device=device)
        self._word, self._shift = token // 32, (token % 32).to(torch.int32)  # [vocab]: where each token's bit is

    def fill(self, slot: int, matcher) -> None:
        """The slot's allowed tokens for the next step, from its matcher's state."""
        matcher.fill_next_token_bitmask(self.host, slot)

    def clear(self, slot: int) -> None:
        """Every token allowed: the slot's next sequence may have no grammar."""
        self.host[slot] = ALL_ALLOWED

    def upload(self) -> None:
        """The filled rows to the device: one copy, which the step's sync completes before the next fill."""
        if self.device is not self.host:
            self.device.copy_(self.host, non_blocking=True)

    def apply(self, logits: torch.Tensor, rows) -> torch.Tensor:
        """-inf for every token the slots `rows` may not choose, on logits [rows, vocab]."""
        words = self.device[rows]  # [rows, words]
        allowed = (words[:, self._word] >> self._shift) & 1  # [rows, vocab]
        return logits.masked_fill(allowed == 0, -math.inf)
