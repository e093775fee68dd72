"""Byte-exact detokenization: every token id maps to the exact bytes it adds to the text.

Why bytes: a token of a byte-level BPE or a SentencePiece byte-fallback piece can hold part of a UTF-8
character, and a SentencePiece piece carries its word's leading space. Decoding a chunk of tokens alone with
the tokenizer's own decoder loses both (U+FFFD, vanished spaces). Concatenating each token's bytes does not:
for any cut of a token sequence into chunks, the chunks' bytes concatenate to the bytes of the whole.

- `TokenBytes` builds the table once per tokenizer; decoding is then a lookup per token, so its cost does not
  grow with the sequence length and needs no per-request state (the ensemble's postprocessing relies on this).
- `IncrementalDetokenizer` turns those bytes into text chunks that are each valid UTF-8, holding back an
  incomplete character until the token that completes it arrives (the BLS relies on this).
- The build saves the table beside the repository's tokenizer (`TokenBytes.save`), so that postprocessing,
  which only detokenizes, starts without loading transformers (`token_bytes_of`): a second of CPU and a
  library's memory less for each of its instances.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

# Beside the tokenizer's files in a built repository. It holds their digest and this module's, and is used only
# while both match: a tokenizer replaced by hand, or other rules here, and the table is built again.
TABLE_FILE = "tritonforge_token_bytes.json"
BYTE_LEVEL = "byte_level"
SENTENCEPIECE = "sentencepiece"
OTHER = "other"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def _decoder_types(decoder: dict | None) -> list[dict]:
    if not decoder:
        return []
    if decoder.get("type") == "Sequence":
        return [part for child in decoder.get("decoders", []) for part in _decoder_types(child)]
    return [decoder]


def tokenizer_family(tokenizer) -> str:
    """Which byte mapping the tokenizer's decoder implies: byte-level, SentencePiece-style, or other."""
    decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder")
    parts = _decoder_types(decoder)
    types = {part.get("type") for part in parts}
    if "ByteLevel" in types:
        return BYTE_LEVEL
    if "ByteFallback" in types or "Metaspace" in types or any(
            part.get("type") == "Replace" and part.get("pattern", {}).get("String") == "▁" for part in parts):
        return SENTENCEPIECE
    return OTHER


class TokenBytes:
    """The bytes of every token id of a tokenizer. Special tokens decode to nothing (skip_special_tokens)."""

    def __init__(self, tokenizer):
        self.family = tokenizer_family(tokenizer)
        self.bos_token_id = tokenizer.bos_token_id
        size = len(tokenizer)
        tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
        special_ids = set(tokenizer.all_special_ids)
        added = {index: token for index, token in tokenizer.added_tokens_decoder.items()}
        byte_of = {char: byte for byte, char in _bytes_to_unicode().items()}
        table: list[bytes] = []
        for index, token in enumerate(tokens):
            if index in special_ids or (index in added and added[index].special):
                table.append(b"")
            elif index in added and self.family != SENTENCEPIECE:
                table.append(added[index].content.encode("utf-8"))
            elif token is None:
                table.append(b"")
            elif self.family == BYTE_LEVEL:
                table.append(bytes(byte_of[char] for char in token) if all(c in byte_of for c in token)
                             else token.encode("utf-8"))
            elif self.family == SENTENCEPIECE:
                # An added token too: one added as normalized text is held with the word boundary the
                # normalizer gave it ("▁<think>"), which decodes to a space as in any other token.
                if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                    table.append(bytes([int(token[3:5], 16)]))
                else:
                    table.append(token.replace("▁", " ").encode("utf-8"))
            else:
                # Unknown decoder (WordPiece, ...): the token's own decode; exact for whole-character tokens.
                table.append(tokenizer.decode([index]).encode("utf-8"))
        if self.family == OTHER:
            logger.warning("tokenizer decoder not recognised: streamed text may differ from a full decode")
        self._table = table
        self._set_space_rule()

    def _set_space_rule(self) -> None:
        # SentencePiece adds a space before the first word; a whole sequence (one starting with BOS) drops it.
        # The postprocessing step sees only the engine's tokens (Triton refuses an ensemble step fed by both
        # a decoupled step and the client), so BOS is how it tells an echoed prompt from a completion; a
        # completion whose FIRST token is a generated BOS therefore loses its leading space. Streamed
        # responses never carry the prompt, and this project's engines send a generated BOS that heads a
        # longer chunk alone (`runtime/engine/service.streamed_responses`), so a stream decodes chunk by chunk to its
        # whole text.
        self._strip_first_space = self.family == SENTENCEPIECE

    def save(self, tokenizer_dir: Path) -> None:
        """Write the table into the tokenizer's folder, with the digest it is valid for."""
        record = {"digest": _digest(tokenizer_dir), "family": self.family, "bos_token_id": self.bos_token_id,
                  "table": [token.hex() for token in self._table]}
        (Path(tokenizer_dir) / TABLE_FILE).write_text(json.dumps(record))

    @classmethod
    def saved(cls, tokenizer_dir: Path) -> TokenBytes | None:
        """The table saved in the tokenizer's folder, if it was made from the files there now by these rules."""
        try:
            record = json.loads((Path(tokenizer_dir) / TABLE_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("digest") != _digest(tokenizer_dir):
            return None
        token_bytes = cls.__new__(cls)
        try:
            token_bytes.family, token_bytes.bos_token_id = record["family"], record["bos_token_id"]
            token_bytes._table = [bytes.fromhex(token) for token in record["table"]]
        except (KeyError, TypeError, ValueError):  # a damaged file: built again from the tokenizer
            return None
        token_bytes._set_space_rule()
        return token_bytes

    def __len__(self) -> int:
        return len(self._table)

    def token_bytes(self, token_id: int) -> bytes:
        if 0 <= token_id < len(self._table):
            return self._table[token_id]
        return b""

    def decode(self, token_ids: Iterable[int]) -> bytes:
        """The bytes of a run of generated tokens. Ids outside the vocabulary (padding) add nothing."""
        table, size = self._table, len(self._table)
        return b"".join(table[token] for token in token_ids if 0 <= token < size)

    def decode_sequence(self, token_ids: list[int]) -> bytes:
        """Like `decode`, but a row that starts with BOS is a whole text and loses the tokenizer's prefix space."""
        data = self.decode(token_ids)
        if (self._strip_first_space and token_ids and token_ids[0] == self.bos_token_id
                and data.startswith(b" ")):
            return data[1:]
        return data

    def decode_text(self, token_ids: list[int]) -> str:
        """`decode_sequence` as text: bytes that do not form a character become U+FFFD, as in the
        tokenizer's own decode (one per maximal invalid run, Python's and Rust's common rule)."""
        return self.decode_sequence(token_ids).decode("utf-8", errors="replace")


def _digest(tokenizer_dir: Path) -> str:
    """sha256 over the tokenizer's files (every file of the folder but the table) and this module's source."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in sorted(Path(tokenizer_dir).iterdir()):
        if path.is_file() and path.name != TABLE_FILE:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def token_bytes_of(tokenizer_dir: str | os.PathLike) -> TokenBytes:
    """The table saved beside the tokenizer, else one built from the tokenizer (loading transformers)."""
    from .tokenization import load_tokenizer

    return TokenBytes.saved(Path(tokenizer_dir)) or TokenBytes(load_tokenizer(tokenizer_dir))


class IncrementalDetokenizer:
    """Per-request streaming state: feed token ids, get text that is always complete UTF-8 characters."""

    def __init__(self, token_bytes: TokenBytes):
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Iterable[int]) -> str:
        return self._utf8.decode(self._token_bytes.decode(token_ids))

    def flush(self) -> str:
        """The end of the stream: an incomplete character left over becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)
