"""The C++ detokenizer (runtime/text/native/detokenizer.h) against its Python twin, byte for byte: the same table
read from the file the build saves, the same bytes for every token stream (special tokens, SentencePiece's
leading space, characters split across responses, padding ids), the same postprocessing answers and refusals.
Driven through its C API (detokenizer_capi.cc) with ctypes, on both tiny tokenizer families; no server."""

from __future__ import annotations

import ctypes
import json
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tritonforge.builder import native
from tritonforge.runtime.text.detokenization import SENTENCEPIECE, TABLE_FILE, TokenBytes
from tritonforge.runtime.text.postprocess import Postprocessor
from tritonforge.runtime.text.tokenization import load_tokenizer

from ..native_programs import compile_library

pytestmark = pytest.mark.skipif(native.compiler() is None,
                                reason="needs a C++ compiler (g++, c++ or $CXX) to build the C++ detokenizer")

NATIVE_SOURCES = native.RUNTIME / "text" / "native"
# The C API's flags: TokenBytes.decode, .decode_sequence, .decode_text.
DECODE, SEQUENCE, TEXT = 0, 1, 2
STREAMS = 400  # random streams per family: enough to meet split characters, BOS first, padding and specials
BATCHES = 300  # random postprocessing requests per family
UTF8_RUNS = 20_000  # random byte runs for the UTF-8 replacement rule, beside every two-byte string
# Bytes where UTF-8's rules change: ASCII, continuation bounds, leads with narrowed second bytes, never-valid ones.
UTF8_EDGES = bytes([0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC,
                    0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF])
MULTILINGUAL = ["你好，世界。模型正在生成文本。", "café naïve Ångström", "🚀 🎉 👍🏽 👨‍👩‍👧", "Привет, мир!",
                "こんにちは"]
INT32_EDGES = (-(2**31), -2, -1, 2**31 - 1)


class NativeError(Exception):
    pass


class NativeRequestError(NativeError):
    """A request the C++ postprocessing refuses (INVALID_ARG); the message is the client's."""


class NativeLibrary:
    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        out = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        i32, i64 = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)
        lib.tf_last_error.restype = ctypes.c_char_p
        lib.tf_free.argtypes = [ctypes.c_void_p]
        lib.tf_token_bytes_open.restype = ctypes.c_void_p
        lib.tf_token_bytes_open.argtypes = [ctypes.c_char_p]
        lib.tf_token_bytes_close.argtypes = [ctypes.c_void_p]
        lib.tf_token_bytes_size.restype = ctypes.c_size_t
        lib.tf_token_bytes_size.argtypes = [ctypes.c_void_p]
        lib.tf_token_bytes_decode.argtypes = [ctypes.c_void_p, i32, ctypes.c_size_t, ctypes.c_int, *out]
        lib.tf_postprocess.argtypes = [ctypes.c_void_p, i32, i64, ctypes.c_size_t, i32, ctypes.c_size_t, *out,
                                       ctypes.POINTER(ctypes.c_size_t)]
        lib.tf_utf8_replace.argtypes = [ctypes.c_char_p, ctypes.c_size_t, *out]
        self.lib = lib

    def error(self) -> str:
        return self.lib.tf_last_error().decode()

    def take(self, status: int, buffer: ctypes.c_void_p, size: ctypes.c_size_t) -> bytes:
        if status == 1:
            raise NativeRequestError(self.error())
        if status != 0:
            raise NativeError(self.error())
        try:
            return ctypes.string_at(buffer.value, size.value)
        finally:
            self.lib.tf_free(buffer)

    def open(self, tokenizer_dir: Path) -> NativeTable:
        handle = self.lib.tf_token_bytes_open(str(tokenizer_dir).encode())
        if not handle:
            raise NativeError(self.error())
        return NativeTable(self, handle)

    def utf8_replace(self, data: bytes) -> bytes:
        buffer, size = ctypes.c_void_p(), ctypes.c_size_t()
        return self.take(self.lib.tf_utf8_replace(data, len(data), ctypes.byref(buffer), ctypes.byref(size)),
                         buffer, size)


class NativeTable:
    def __init__(self, library: NativeLibrary, handle: int):
        self.library, self.lib, self.handle = library, library.lib, handle

    def __len__(self) -> int:
        return self.lib.tf_token_bytes_size(self.handle)

    def close(self) -> None:
        self.lib.tf_token_bytes_close(self.handle)

    def decode(self, ids: list[int], flags: int) -> bytes:
        array = np.ascontiguousarray(ids, dtype=np.int32)
        buffer, size = ctypes.c_void_p(), ctypes.c_size_t()
        status = self.lib.tf_token_bytes_decode(self.handle, array.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                                len(array), flags, ctypes.byref(buffer), ctypes.byref(size))
        return self.library.take(status, buffer, size)

    def postprocess(self, tokens: np.ndarray, lengths: np.ndarray) -> list[bytes]:
        """OUTPUT's elements, as the C++ backend answers TOKENS_BATCH and SEQUENCE_LENGTH."""
        tokens, lengths = np.ascontiguousarray(tokens, np.int32), np.ascontiguousarray(lengths, np.int32)
        shape = np.array(tokens.shape, dtype=np.int64)
        buffer, size, elements = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
        status = self.lib.tf_postprocess(self.handle, tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                         shape.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), tokens.ndim,
                                         lengths.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), lengths.size,
                                         ctypes.byref(buffer), ctypes.byref(size), ctypes.byref(elements))
        return bytes_tensor(self.library.take(status, buffer, size), elements.value)


def bytes_tensor(serialized: bytes, elements: int) -> list[bytes]:
    """The elements of a Triton BYTES tensor's buffer (each a 4-byte little-endian length, then its bytes)."""
    out, at = [], 0
    while at < len(serialized):
        length = int.from_bytes(serialized[at:at + 4], "little")
        out.append(serialized[at + 4:at + 4 + length])
        at += 4 + length
    assert len(out) == elements and at == len(serialized)
    return out


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> NativeLibrary:
    folder = tmp_path_factory.mktemp("native-detokenizer")
    return NativeLibrary(compile_library(NATIVE_SOURCES / "detokenizer_capi.cc", folder / "libdetokenizer.so"))


class Twins:
    """One tokenizer's table as each side reads it from the folder the build saved it in."""

    def __init__(self, folder: Path, tokenizer, python: TokenBytes, cpp: NativeTable):
        self.folder, self.tokenizer, self.python, self.cpp = folder, tokenizer, python, cpp
        size = len(python)
        self.special = sorted({*tokenizer.all_special_ids, *tokenizer.added_tokens_decoder})
        # Tokens whose bytes are part of a character: byte-fallback pieces, byte-level fragments.
        self.partial = [index for index in range(size) if not _is_utf8(python.token_bytes(index))]
        self.outside = [size, size + 7, *INT32_EDGES]  # padding and ids past the vocabulary
        self.bos = tokenizer.bos_token_id

    def random_ids(self, rng: random.Random, length: int) -> list[int]:
        pools = [range(len(self.python)), self.partial, self.special, self.outside]
        ids = [rng.choice(rng.choices(pools, weights=[6, 3, 1, 1])[0]) for _ in range(length)]
        if ids and rng.random() < 0.3:
            ids[0] = self.bos  # a whole text: SentencePiece drops its leading space
        return ids


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def saved_tokenizer(checkpoint: Path, folder: Path):
    """The checkpoint's tokenizer, copied into `folder` (weights left out) with its table saved beside it, as the
    build leaves it; an added text token and an added special one have rows of their own."""
    shutil.copytree(checkpoint, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    tokenizer = load_tokenizer(folder)
    tokenizer.add_tokens(["<think>"])
    tokenizer.add_tokens(["<|tool|>"], special_tokens=True)
    TokenBytes(tokenizer).save(folder)
    return tokenizer


@pytest.fixture(scope="module", params=["bpe", "sentencepiece"])
def twins(request, tiny_models, tmp_path_factory, library) -> Twins:
    folder = tmp_path_factory.mktemp("tokenizer") / "tokenizer"
    tokenizer = saved_tokenizer(tiny_models[request.param], folder)
    python = TokenBytes.saved(folder)
    assert python is not None, "the Python twin must read the saved table, not build one"
    cpp = library.open(folder)
    yield Twins(folder, tokenizer, python, cpp)
    cpp.close()


def test_every_id_has_the_same_bytes_in_both_tables(twins):
    assert len(twins.cpp) == len(twins.python) == len(twins.tokenizer)
    for index in range(-2, len(twins.python) + 2):
        assert twins.cpp.decode([index], DECODE) == twins.python.decode([index]), index


def test_random_streams_decode_to_the_python_bytes_under_every_rule(twins):
    rng = random.Random(20261205)
    replaced = stripped = 0
    for _ in range(STREAMS):
        ids = twins.random_ids(rng, rng.randint(0, 40))
        expected_text = twins.python.decode_text(ids).encode("utf-8")
        assert twins.cpp.decode(ids, DECODE) == twins.python.decode(ids), ids
        assert twins.cpp.decode(ids, SEQUENCE) == twins.python.decode_sequence(ids), ids
        assert twins.cpp.decode(ids, TEXT) == expected_text, ids
        replaced += "\ufffd".encode() in expected_text
        stripped += twins.python.decode_sequence(ids) != twins.python.decode(ids)
    assert replaced > STREAMS // 10  # the streams did meet characters left incomplete
    if twins.python.family == SENTENCEPIECE:
        assert stripped > STREAMS // 20  # and rows that start with BOS and a space


def test_a_character_split_across_responses_is_replaced_in_each_as_in_python(twins):
    """The ensemble decodes each streamed response alone: both sides answer U+FFFD for the halves."""
    split = 0
    for text in MULTILINGUAL:
        ids = twins.tokenizer(text, add_special_tokens=False).input_ids
        for index in range(len(ids)):
            response = ids[index:index + 1]
            expected = twins.python.decode_text(response).encode("utf-8")
            assert twins.cpp.decode(response, TEXT) == expected, response
            split += "\ufffd".encode() in expected
        assert twins.cpp.decode(ids, TEXT) == twins.python.decode_text(ids).encode("utf-8")
    assert split > 0, "no character was split across tokens: the test lost its subject"


def test_special_tokens_decode_to_nothing_and_a_leading_bos_drops_the_sentencepiece_space(twins):
    words = twins.tokenizer("the server", add_special_tokens=False).input_ids
    for special in twins.special:
        for ids in ([special], [special, *words], [*words, special], [words[0], special, *words[1:]]):
            for flags, decode in ((DECODE, twins.python.decode), (SEQUENCE, twins.python.decode_sequence)):
                assert twins.cpp.decode(ids, flags) == decode(ids), (ids, flags)
            assert twins.cpp.decode(ids, TEXT) == twins.python.decode_text(ids).encode("utf-8"), ids
    expected = b"the server" if twins.python.family == SENTENCEPIECE else twins.python.decode(words)
    assert twins.cpp.decode([twins.bos, *words], TEXT) == expected


def test_ids_outside_the_table_add_nothing_and_raise_nothing(twins):
    words = twins.tokenizer("padded text", add_special_tokens=False).input_ids
    for outside in twins.outside:
        for ids in ([outside], [outside, *words], [words[0], outside, *words[1:], outside], [outside, twins.bos]):
            assert twins.cpp.decode(ids, DECODE) == twins.python.decode(ids), ids
            assert twins.cpp.decode(ids, SEQUENCE) == twins.python.decode_sequence(ids), ids
            assert twins.cpp.decode(ids, TEXT) == twins.python.decode_text(ids).encode("utf-8"), ids


def test_no_ids_decode_to_nothing(twins):
    for flags in (DECODE, SEQUENCE, TEXT):
        assert twins.cpp.decode([], flags) == b""
    assert twins.cpp.postprocess(np.zeros((1, 1, 0)), np.array([[3]])) == [b""]


def test_utf8_replacement_is_cpythons_for_every_two_byte_string_and_random_runs(library):
    for first in range(256):
        for second in range(256):
            data = bytes([first, second])
            assert library.utf8_replace(data) == data.decode("utf-8", "replace").encode(), data
    rng = random.Random(8)
    for _ in range(UTF8_RUNS):
        data = bytes(rng.choice(UTF8_EDGES) if rng.random() < 0.8 else rng.randrange(256)
                     for _ in range(rng.randint(0, 9)))
        assert library.utf8_replace(data) == data.decode("utf-8", "replace").encode(), data


def random_request(rng: random.Random, twins: Twins) -> tuple[np.ndarray, np.ndarray]:
    rows, beams, width = rng.randint(1, 4), rng.randint(1, 3), rng.randint(0, 12)
    tokens = np.array([[twins.random_ids(rng, width) for _ in range(beams)] for _ in range(rows)],
                      dtype=np.int32).reshape(rows, beams, width)
    lengths = np.array([[rng.randint(-2, width + 2) for _ in range(beams)] for _ in range(rows)], dtype=np.int32)
    if beams == 1 and rng.random() < 0.3:
        tokens = tokens[:, 0, :]  # [B, T]: one beam without its axis
    return tokens, lengths


def test_postprocessing_requests_get_the_python_models_output(twins):
    """TOKENS_BATCH [B, beams, T] or [B, T], SEQUENCE_LENGTH [B, beams] (lengths past T or below 0 included)."""
    postprocessor = Postprocessor(str(twins.folder))
    rng = random.Random(4)
    for _ in range(BATCHES):
        tokens, lengths = random_request(rng, twins)
        assert twins.cpp.postprocess(tokens, lengths) == postprocessor(tokens, lengths).tolist(), (tokens, lengths)


def test_a_beam_count_mismatch_is_refused_with_the_python_models_message(twins):
    postprocessor = Postprocessor(str(twins.folder))
    tokens, lengths = np.zeros((2, 1, 3), np.int32), np.ones((2, 2), np.int32)
    with pytest.raises(ValueError) as python_error:
        postprocessor(tokens, lengths)
    with pytest.raises(NativeRequestError) as cpp_error:
        twins.cpp.postprocess(tokens, lengths)
    assert str(cpp_error.value) == str(python_error.value) == "SEQUENCE_LENGTH: has 2 beams, TOKENS_BATCH has 1"


@pytest.mark.parametrize(("tokens", "lengths", "field"), [
    (np.zeros((3,)), np.ones((3,)), "TOKENS_BATCH"),  # no beam or batch axis
    (np.zeros((1, 1, 1, 2)), np.ones((1, 1)), "TOKENS_BATCH"),
    (np.zeros((0, 1, 2)), np.ones((0, 1)), "TOKENS_BATCH"),  # a batch of no rows
    (np.zeros((2, 1, 2)), np.ones((3,)), "SEQUENCE_LENGTH")])  # values that do not divide into the rows
def test_shapes_python_fails_on_are_refused_naming_the_input(twins, tokens, lengths, field):
    """Triton's own shape checks keep these from the model; Python fails them inside numpy (an internal error),
    the C++ side names the input."""
    with pytest.raises(Exception):  # noqa: B017, PT011 - whichever numpy or indexing error Python meets
        Postprocessor(str(twins.folder))(tokens.astype(np.int32), lengths.astype(np.int32))
    with pytest.raises(NativeRequestError, match=f"^{field}: "):
        twins.cpp.postprocess(tokens, lengths)


def _record(folder: Path) -> dict:
    return json.loads((folder / TABLE_FILE).read_text())


def _with_entry(record: dict, index: int, value) -> dict:
    table = list(record["table"])
    table[index] = value
    return {**record, "table": table}


# Files Python refuses too (`TokenBytes.saved` is None, and it would build the table again): each keeps the right
# digest, so only the damage is refused.
DAMAGED = {
    "truncated": (lambda r: json.dumps(r)[:-20], "not JSON"),
    "a list": (lambda r: json.dumps([r]), "not a JSON object"),
    "extra data": (lambda r: json.dumps(r) + " {}", "extra data"),
    "a byte-order mark": (lambda r: "\ufeff" + json.dumps(r), "not JSON"),
    "no table": (lambda r: json.dumps({k: v for k, v in r.items() if k != "table"}), '"table"'),
    "a table string": (lambda r: json.dumps({**r, "table": "0a0b"}), '"table"'),
    "a non-hex entry": (lambda r: json.dumps(_with_entry(r, 3, "zz")), '"table"[3]'),
    "an odd-length entry": (lambda r: json.dumps(_with_entry(r, 4, "abc")), '"table"[4]'),
    "a number entry": (lambda r: json.dumps(_with_entry(r, 5, 65)), '"table"[5]'),
    "no family": (lambda r: json.dumps({k: v for k, v in r.items() if k != "family"}), '"family"'),
    "no bos_token_id": (lambda r: json.dumps({k: v for k, v in r.items() if k != "bos_token_id"}),
                        '"bos_token_id"'),
    "no digest": (lambda r: json.dumps({k: v for k, v in r.items() if k != "digest"}), '"digest"'),
}


@pytest.mark.parametrize("damage", DAMAGED)
def test_a_damaged_table_is_refused_by_both_readers_naming_the_file_and_the_fault(damage, tiny_models, tmp_path,
                                                                                    library):
    folder = tmp_path / "tokenizer"
    saved_tokenizer(tiny_models["sentencepiece"], folder)
    write, fault = DAMAGED[damage]
    (folder / TABLE_FILE).write_text(write(_record(folder)), encoding="utf-8")
    assert TokenBytes.saved(folder) is None
    with pytest.raises(NativeError) as refused:
        library.open(folder)
    message = str(refused.value)
    assert message.startswith(f"{folder / TABLE_FILE}: ") and fault in message and "tritonforge build" in message


def test_a_table_that_is_not_utf8_is_refused_by_both_readers(tiny_models, tmp_path, library):
    folder = tmp_path / "tokenizer"
    saved_tokenizer(tiny_models["bpe"], folder)
    (folder / TABLE_FILE).write_bytes(json.dumps({**_record(folder), "note": "x"}).encode().replace(b"x", b"\xff"))
    assert TokenBytes.saved(folder) is None
    with pytest.raises(NativeError, match="not UTF-8"):
        library.open(folder)


def test_a_missing_table_is_refused_naming_the_file_and_the_build_that_writes_it(tiny_models, tmp_path, library):
    folder = tmp_path / "tokenizer"
    saved_tokenizer(tiny_models["bpe"], folder)
    (folder / TABLE_FILE).unlink()
    with pytest.raises(NativeError, match=r"tritonforge_token_bytes\.json: cannot be read .*tritonforge build"):
        library.open(folder)


@pytest.mark.parametrize(("key", "value", "fault"), [
    ("family", "wordpiece", '"family"'), ("bos_token_id", "1", '"bos_token_id"'),
    ("bos_token_id", 1.0, '"bos_token_id"'), ("bos_token_id", True, '"bos_token_id"'),
    ("bos_token_id", float("nan"), "not JSON")])  # Python's json writes and reads NaN; JSON has none
def test_values_the_build_never_writes_are_refused_by_the_cpp_reader_though_python_reads_them(
        key, value, fault, tiny_models, tmp_path, library):
    """Deliberately stricter than Python (detokenizer.h says why): such a file was not written by the build."""
    folder = tmp_path / "tokenizer"
    saved_tokenizer(tiny_models["sentencepiece"], folder)
    (folder / TABLE_FILE).write_text(json.dumps({**_record(folder), key: value}))
    assert TokenBytes.saved(folder) is not None
    with pytest.raises(NativeError, match=fault):
        library.open(folder)


def test_a_table_in_another_json_layout_reads_as_python_reads_it(tiny_models, tmp_path, library):
    """Any JSON Python reads the same: keys reordered, indented, escaped, repeated (the last wins), extra keys,
    whitespace between hex pairs (bytes.fromhex skips it)."""
    folder = tmp_path / "tokenizer"
    saved_tokenizer(tiny_models["sentencepiece"], folder)
    record = _record(folder)
    table = list(record["table"])
    table[300] = " ".join(table[300][i:i + 2] for i in range(0, len(table[300]), 2)) + "\n"
    digest, bos = record["digest"], record["bos_token_id"]
    text = ('{\n  "extra": [1, {"a": null}],\n  "family": "oth\\u0065r",\n  "bos_token_id": null,\n'
            f'  "table": {json.dumps(table, indent=1)},\n  "digest": "{digest}",\n'
            f'  "family": "sentencepi\\u0065ce", "bos_token_id": {bos}\n}}')
    (folder / TABLE_FILE).write_text(text)
    python, cpp = TokenBytes.saved(folder), library.open(folder)
    rng = random.Random(3)
    for _ in range(50):
        ids = [rng.randrange(-1, len(python) + 1) for _ in range(rng.randint(0, 20))]
        if ids and rng.random() < 0.5:
            ids[0] = record["bos_token_id"]
        assert cpp.decode(ids, TEXT) == python.decode_text(ids).encode("utf-8")
    assert [cpp.decode([index], DECODE) for index in range(len(python))] == \
        [python.token_bytes(index) for index in range(len(python))]
    cpp.close()


def test_the_backend_compiles_from_its_one_source_with_the_builds_command(tmp_path):
    library = native.compile_backend(native.POSTPROCESSING, tmp_path)
    assert library.name == "libtriton_tritonforge_postprocessing.so" and library.is_file()
    nm = shutil.which("nm")
    if nm is not None:  # the entry points Triton looks up by name
        exported = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
        for entry in ("TRITONBACKEND_ModelInitialize", "TRITONBACKEND_ModelFinalize",
                      "TRITONBACKEND_ModelInstanceExecute"):
            assert f" T {entry}\n" in exported
