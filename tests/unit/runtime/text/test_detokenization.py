"""Byte-exact streaming decode: any cut of any token sequence concatenates to the full decode."""

import json
import random
import shutil

import pytest

from tritonforge.runtime.engine.service import TokenRun, streamed_responses
from tritonforge.runtime.text.detokenization import (
    BYTE_LEVEL,
    OTHER,
    SENTENCEPIECE,
    TABLE_FILE,
    IncrementalDetokenizer,
    TokenBytes,
    token_bytes_of,
)
from tritonforge.runtime.text.tokenization import load_tokenizer

MULTILINGUAL = ["Hello world, the server", "你好，世界。模型正在生成文本。", "café naïve Ångström",
                "🚀 🎉 👍🏽 👨‍👩‍👧", "Привет, мир!", "  two  spaces\nand a newline", "こんにちは、世界"]
SEQUENCES = 1500  # random sequences per family: enough to hit split characters and byte-fallback runs


def random_chunks(rng, ids):
    cuts = sorted(rng.sample(range(1, len(ids)), rng.randint(0, len(ids) - 1))) if len(ids) > 1 else []
    bounds = [0, *cuts, len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


def test_family_is_detected(tiny_models):
    assert TokenBytes(load_tokenizer(tiny_models["bpe"])).family == BYTE_LEVEL
    assert TokenBytes(load_tokenizer(tiny_models["sentencepiece"])).family == SENTENCEPIECE


def _contents(table: TokenBytes) -> tuple:
    return table.family, table.bos_token_id, [table.token_bytes(index) for index in range(len(table))]


def test_a_saved_table_is_used_only_while_the_tokenizer_files_are_the_ones_it_was_made_from(tiny_model, tmp_path):
    folder = tmp_path / "tokenizer"
    shutil.copytree(tiny_model, folder)
    tokenizer = load_tokenizer(folder)
    built = TokenBytes(tokenizer)
    assert TokenBytes.saved(folder) is None  # none saved yet
    built.save(folder)
    assert (folder / TABLE_FILE).is_file() and _contents(TokenBytes.saved(folder)) == _contents(built)
    assert _contents(token_bytes_of(folder)) == _contents(built)
    ids = tokenizer("Hello world").input_ids  # a whole text: SentencePiece's leading space goes, as in decode
    assert TokenBytes.saved(folder).decode_sequence(ids) == built.decode_sequence(ids)
    saved = json.loads((folder / TABLE_FILE).read_text())
    (folder / TABLE_FILE).write_text(json.dumps({**saved, "table": ["not hex"]}))  # damaged, digest intact
    assert TokenBytes.saved(folder) is None
    built.save(folder)
    with open(folder / "tokenizer_config.json", "a") as config:
        config.write("\n")  # a tokenizer changed by hand after the build
    assert TokenBytes.saved(folder) is None
    assert _contents(token_bytes_of(folder)) == _contents(built)  # built again from the tokenizer


@pytest.mark.parametrize("text", MULTILINGUAL)
def test_whole_sequence_decode_equals_tokenizer_decode(tiny_model, text):
    tokenizer = load_tokenizer(tiny_model)
    ids = tokenizer(text).input_ids
    assert TokenBytes(tokenizer).decode_sequence(ids).decode() == tokenizer.decode(ids, skip_special_tokens=True)


def test_random_chunkings_concatenate_to_full_decode(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    table = TokenBytes(tokenizer)
    rng = random.Random(1234)
    for _ in range(SEQUENCES):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 48))]
        full = table.decode(ids)
        chunks = random_chunks(rng, ids)
        assert b"".join(table.decode(chunk) for chunk in chunks) == full
        detokenizer = IncrementalDetokenizer(table)
        streamed = [detokenizer.push(chunk) for chunk in chunks] + [detokenizer.flush()]
        assert "".join(streamed) == full.decode("utf-8", errors="replace")


def test_incremental_chunks_are_whole_characters_for_split_multibyte_text(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    table = TokenBytes(tokenizer)
    for text in MULTILINGUAL:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        detokenizer = IncrementalDetokenizer(table)
        pieces = [detokenizer.push([token]) for token in ids] + [detokenizer.flush()]
        assert all("\ufffd" not in piece for piece in pieces)
        assert "".join(pieces).lstrip(" ") == text.lstrip(" ")


def test_sentencepiece_word_spaces_survive_token_by_token_streaming(tiny_models):
    """Regression for NVIDIA's ensemble defect: "▁word" decoded alone loses its space."""
    tokenizer = load_tokenizer(tiny_models["sentencepiece"])
    table = TokenBytes(tokenizer)
    ids = tokenizer("the server reads the request", add_special_tokens=False).input_ids
    assert b"".join(table.decode([token]) for token in ids).decode() == " the server reads the request"


def test_padding_ids_decode_to_nothing(tiny_models):
    """-1 (NVIDIA's padding) and ids past the vocabulary (a pad id beyond it) add nothing between real tokens."""
    tokenizer = load_tokenizer(tiny_models["bpe"])
    table = TokenBytes(tokenizer)
    ids = tokenizer.encode("padded text", add_special_tokens=False)
    assert table.decode([-1, -1]) == b""
    assert table.decode([ids[0], len(table), *ids[1:], len(table) + 7, -1]) == table.decode(ids)


def test_a_sentencepiece_completion_keeps_its_leading_space_and_a_whole_sequence_drops_it(tiny_models):
    """The postprocessing model tells an echoed prompt (it starts with BOS) from a completion, which follows
    the prompt's text and so needs its word space."""
    tokenizer = load_tokenizer(tiny_models["sentencepiece"])
    table = TokenBytes(tokenizer)
    ids = tokenizer("the server", add_special_tokens=False).input_ids
    assert table.decode_text(ids) == " the server"
    assert table.decode_text([tokenizer.bos_token_id, *ids]) == "the server"


def test_a_stream_with_generated_bos_tokens_decodes_response_by_response_to_its_whole_completion(tiny_models):
    """As the postprocessing step decodes a stream: each response alone, with the prefix-space rule of a whole
    sequence. The engine's responses (`streamed_responses`) keep a generated BOS from heading a longer one."""
    tokenizer = load_tokenizer(tiny_models["sentencepiece"])
    table, bos = TokenBytes(tokenizer), tokenizer.bos_token_id
    words = tokenizer("the server streams text", add_special_tokens=False).input_ids
    rng = random.Random(7)
    for _ in range(200):
        completion = [words[0], *(rng.choice([*words, bos, bos]) for _ in range(12))]
        responses = [run.ids for chunk in random_chunks(rng, completion)
                     for run in streamed_responses(TokenRun(chunk, [0.0] * len(chunk)), bos)]
        assert "".join(table.decode_text(ids) for ids in responses) == table.decode_text(completion)


def test_added_tokens_decode_to_their_text_and_added_special_ones_to_nothing(tiny_model):
    """Tokens added to a tokenizer (a reasoning or tool marker) are text, unless added as special tokens."""
    tokenizer = load_tokenizer(tiny_model)
    tokenizer.add_tokens(["<think>"])
    tokenizer.add_tokens(["<|tool|>"], special_tokens=True)
    ids = tokenizer("Hello <think>world<|tool|>").input_ids
    decoded = TokenBytes(tokenizer).decode_sequence(ids).decode()
    assert decoded == tokenizer.decode(ids, skip_special_tokens=True)
    assert "<think>" in decoded and "<|tool|>" not in decoded


@pytest.mark.parametrize(("decoder", "family"), [
    ({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}, SENTENCEPIECE),  # Mistral v3, T5
    ({"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}, SENTENCEPIECE),
    ({"type": "ByteLevel"}, BYTE_LEVEL),
    ({"type": "WordPiece", "prefix": "##"}, OTHER)])
def test_the_family_is_read_from_the_tokenizers_decoder(decoder, family):
    import json
    from types import SimpleNamespace

    from tritonforge.runtime.text.detokenization import tokenizer_family

    tokenizer = SimpleNamespace(backend_tokenizer=SimpleNamespace(to_str=lambda: json.dumps({"decoder": decoder})))
    assert tokenizer_family(tokenizer) == family
