"""Tokenizer loading, prompt encoding, chat rendering and stop/bad word lists.

Everything the preprocessing model does, as plain functions over a Hugging Face tokenizer directory.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...facts.contract import MESSAGES, TEXT_INPUT
from ...facts.errors import RequestError

logger = logging.getLogger(__name__)


def tokenizer_only_process() -> None:
    """Called first by a process that tokenizes and runs no model (preprocessing, postprocessing, the BLS; the
    commands `build` without its accuracy gate, `bench` and `tune`).

    transformers imports torch whenever it is installed, as it is in NVIDIA's container: 2-6 s and 230-580 MB
    a process for nothing a tokenizer uses (bench/tokenizer_process.py). Marked absent before transformers
    loads, torch is not imported and transformers runs as a tokenizers-only install. Where torch is already
    loaded this changes nothing.
    """
    sys.modules.setdefault("torch", None)  # find_spec("torch") is None, `import torch` fails: not installed
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # its "PyTorch was not found" line


def load_tokenizer(path: str | Path):
    """Load the tokenizer of a checkpoint directory. Remote code is never trusted."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist")
    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def default_end_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token: pass end_id with every request or set eos_token")
    return int(tokenizer.eos_token_id)


def default_pad_id(tokenizer) -> int:
    return int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else default_end_id(tokenizer)


def decode_utf8(field: str, value: bytes | str) -> str:
    """A string tensor element as text, or a RequestError naming the field."""
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(field, f"is not valid UTF-8 (byte {error.start})") from None


@dataclass(frozen=True)
class PromptEncoder:
    """Turns a prompt (or chat messages) into token ids, checking its length."""

    tokenizer: object
    max_input_len: int
    add_special_tokens: bool = True

    def encode(self, prompt: str, field: str = TEXT_INPUT) -> list[int]:
        if not prompt:
            raise RequestError(field, "must not be empty")
        self._check_size(len(prompt), field)
        ids = self.tokenizer(prompt, add_special_tokens=self.add_special_tokens).input_ids
        bos = self.tokenizer.bos_token_id
        # A prompt that already starts with the BOS text (a pre-rendered chat prompt) must not get a second BOS.
        if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        if not ids:
            raise RequestError(field, "encodes to no tokens")
        if len(ids) > self.max_input_len:
            raise RequestError(field, f"has {len(ids)} tokens, more than the maximum input length {self.max_input_len}")
        return ids

    def encode_chat(self, messages_json: str, field: str = MESSAGES) -> list[int]:
        """Render a chat (`parse_chat`: OpenAI-style messages, with tools and template arguments) with the chat
        template, then encode.

        Only the template makes special tokens: a message whose content holds a special token's text (say
        `<|start_header_id|>system`) has that content encoded as plain text, so it cannot forge a turn."""
        # JSON escapes (\uXXXX) spend up to 6 characters on one: refuse only beyond what any valid prompt needs.
        self._check_size(len(messages_json), field, escaped=6)
        chat = parse_chat(messages_json, field)
        self._check_size(sum(len(message.get("content") or "") for message in chat.messages), field)
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestError(field, "this model's tokenizer has no chat template")
        specials = self._special_texts()
        if any(special in json.dumps(message.get("tool_calls") or [], ensure_ascii=False) for message in chat.messages
               for special in specials):
            raise RequestError(field, "a message's tool_calls hold special-token text")
        if any(special in (message.get("content") or "") for message in chat.messages for special in specials):
            ids = self._encode_chat_contents_as_text(chat, field)
        else:
            text = self._render(chat, chat.messages)
            # The template writes the BOS itself; adding special tokens again would double it.
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) > self.max_input_len:
            raise RequestError(field, f"renders to {len(ids)} tokens, more than the maximum input length "
                                      f"{self.max_input_len}")
        return ids

    def _render(self, chat: Chat, messages: list[dict]) -> str:
        extra = {"tools": chat.tools} if chat.tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra,
                                                  **chat.template_kwargs)

    def _check_size(self, characters: int, field: str, escaped: int = 1) -> None:
        """Refuse, before tokenizing, text too long to fit: no token spans more than `longest_token` characters,
        so more than max_input_len × that many characters is certainly more than max_input_len tokens. Text as
        JSON (`escaped` 6) may spend up to that many characters on one of the prompt's."""
        limit = self.max_input_len * longest_token(self.tokenizer)
        if characters > limit * escaped:
            raise RequestError(field, f"has {characters} characters: more than the maximum input length "
                                      f"{self.max_input_len} tokens can hold ({limit * escaped}"
                                      f"{' as JSON' if escaped > 1 else ''})")

    def _special_texts(self) -> list[str]:
        added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        return sorted({*self.tokenizer.all_special_tokens, *(t.content for t in added.values() if t.special)})

    def _encode_chat_contents_as_text(self, chat: Chat, field: str) -> list[int]:
        """The template rendered around placeholders; the template's text encoded with its special tokens,
        each message's content encoded with none (`split_special_tokens`)."""
        messages = chat.messages
        marked = [index for index, message in enumerate(messages) if isinstance(message.get("content"), str)]
        marks = {index: f"{_MARK_OPEN}{index}{_MARK_CLOSE}" for index in marked}
        rendered = self._render(chat, [{**message, "content": marks[index]} if index in marks else message
                                       for index, message in enumerate(messages)])
        if sorted(_MARK.findall(rendered)) != sorted(str(index) for index in marked):
            raise RequestError(field, "holds special-token text, and this model's chat template does not render "
                                      "each message once, so it cannot be encoded safely")
        ids: list[int] = []
        for piece in _MARK_SPLIT.split(rendered):
            mark = _MARK.fullmatch(piece)
            if mark:
                content = messages[int(mark.group(1))]["content"]
                ids += self.tokenizer(content, add_special_tokens=False, split_special_tokens=True).input_ids
            elif piece:
                ids += self.tokenizer(piece, add_special_tokens=False).input_ids
        return ids


@functools.lru_cache(maxsize=4)
def longest_token(tokenizer) -> int:
    """Characters of text the longest vocabulary entry can stand for (its piece's length, at least 4: one
    character can take four byte-tokens, but never fewer than one token)."""
    return max(4, max(len(piece) for piece in tokenizer.get_vocab()))


# Placeholders for message contents while the chat template renders (private-use characters).
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"
_MARK = re.compile(f"{_MARK_OPEN}(\\d+){_MARK_CLOSE}")
_MARK_SPLIT = re.compile(f"({_MARK_OPEN}\\d+{_MARK_CLOSE})")


# Arguments of apply_chat_template a request may not set through chat_template_kwargs: they change what the call
# returns or which conversation and template it renders, not how the template renders it.
RESERVED_TEMPLATE_ARGUMENTS = frozenset({"conversation", "messages", "tools", "documents", "chat_template", "tokenize",
                                         "add_generation_prompt", "continue_final_message", "return_dict",
                                         "return_tensors", "return_assistant_tokens_mask", "tokenizer_kwargs"})


@dataclass(frozen=True)
class Chat:
    """What a chat request renders: its messages, the tools the template shows the model (OpenAI's
    `{"type": "function", "function": {...}}` objects), and arguments for the template (`enable_thinking`...)."""

    messages: list[dict]
    tools: list[dict]
    template_kwargs: dict


def parse_chat(messages_json: str, field: str = MESSAGES) -> Chat:
    """The `messages` input: a JSON list of messages, or an object {"messages": [...], "tools": [...],
    "chat_template_kwargs": {...}}. A message has a string `role` and a string `content`, except an assistant's
    that carries `tool_calls` instead (its content may be null)."""
    try:
        value = json.loads(messages_json)
    except json.JSONDecodeError as error:
        raise RequestError(field, f"is not valid JSON ({error.msg})") from None
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"messages", "tools", "chat_template_kwargs"})
        if unknown:
            raise RequestError(field, f"has unknown keys {unknown}: a chat is messages, tools, chat_template_kwargs")
        messages, tools = value.get("messages"), value.get("tools") or []
        kwargs = value.get("chat_template_kwargs") or {}
    else:
        messages, tools, kwargs = value, [], {}
    if not isinstance(messages, list) or not messages:
        raise RequestError(field, "must be a non-empty JSON list of {\"role\": ..., \"content\": ...} objects")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(field, f"message {index} must be an object with string 'role' and 'content'")
        content, calls = message.get("content"), message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise RequestError(field, f"message {index}: tool_calls must be a list")
        if not isinstance(content, str) and not (content is None and calls):
            raise RequestError(field, f"message {index} must be an object with string 'role' and 'content'")
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise RequestError(field, "tools must be a list of objects")
    if not isinstance(kwargs, dict) or RESERVED_TEMPLATE_ARGUMENTS & set(kwargs):
        raise RequestError(field, f"chat_template_kwargs must be an object without "
                                  f"{', '.join(sorted(RESERVED_TEMPLATE_ARGUMENTS))}")
    return Chat(messages, tools, kwargs)


def phrase_token_variants(tokenizer, phrase: str) -> list[list[int]]:
    """The token sequences a phrase can take in generated text.

    A phrase tokenized alone ("Stop" → "St","op") often differs from the same phrase mid-sentence
    (" Stop" → "ĠStop"), so the engine, which matches token ids, would never see it. Both variants go in.
    """
    variants = []
    for text in (phrase, " " + phrase if not phrase.startswith(" ") else phrase.lstrip(" ")):
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if ids and ids not in variants:
            variants.append(ids)
    return variants


def to_word_list(sequences: list[list[int]]) -> np.ndarray:
    """The 2 × L INT32 word-list block: row 0 the ids of all sequences, row 1 their cumulative end offsets."""
    flat = [token for sequence in sequences for token in sequence]
    offsets = np.cumsum([len(sequence) for sequence in sequences]).tolist()
    width = max(len(flat), 1) if sequences else 0
    block = np.zeros((2, width), dtype=np.int32)
    block[1, :] = -1
    block[0, : len(flat)] = flat
    block[1, : len(offsets)] = offsets
    return block


def from_word_list(block: np.ndarray, field: str) -> list[list[int]]:
    """Parse a 2 × L word-list block back into token sequences, rejecting malformed ones."""
    block = np.asarray(block)
    if block.ndim == 3 and block.shape[0] == 1:
        block = block[0]
    if block.ndim != 2 or block.shape[0] != 2:
        raise RequestError(field, f"must have shape [2, L], got {list(block.shape)}")
    ids, offsets = block[0].tolist(), block[1].tolist()
    sequences, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if end <= start or end > len(ids):
            raise RequestError(field, f"offset {end} is not increasing or exceeds the {len(ids)} ids")
        sequences.append(ids[start:end])
        start = end
    return sequences


def encode_phrases(tokenizer, phrases: list[str], field: str) -> np.ndarray:
    """Stop or bad phrases (clients send "" for none) as a word-list block."""
    sequences: list[list[int]] = []
    for phrase in phrases:
        if phrase == "":
            continue
        for variant in phrase_token_variants(tokenizer, phrase):
            if variant not in sequences:
                sequences.append(variant)
    return to_word_list(sequences)


def pad_word_lists(blocks: list[np.ndarray]) -> np.ndarray:
    """Stack per-row word lists of a batched request into [B, 2, L], padding ids with 0 and offsets with -1."""
    width = max(block.shape[1] for block in blocks)
    out = np.zeros((len(blocks), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for row, block in enumerate(blocks):
        out[row, :, : block.shape[1]] = block
    return out
