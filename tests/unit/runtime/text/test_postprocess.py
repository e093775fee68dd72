"""The postprocessing model's decode of the engine's token rows, without a server."""

import numpy as np

from tritonforge.runtime.text.postprocess import Postprocessor
from tritonforge.runtime.text.tokenization import load_tokenizer


def test_each_row_decodes_only_its_sequence_length_of_tokens(tiny_models):
    """Rows of one response share a width: the ids past a row's length are not part of its text."""
    tokenizer = load_tokenizer(tiny_models["bpe"])
    ids = tokenizer("the server reads", add_special_tokens=False).input_ids
    text = Postprocessor(str(tiny_models["bpe"]))(np.array([[ids], [ids]], dtype=np.int32),
                                                  np.array([[2], [len(ids)]], dtype=np.int32))
    assert text.tolist() == [tokenizer.decode(ids[:2]).encode(), tokenizer.decode(ids).encode()]


def test_rows_without_a_beam_axis_decode_as_one_beam_and_a_beam_count_mismatch_names_the_input(tiny_models):
    import pytest

    from tritonforge.facts.errors import RequestError

    tokenizer = load_tokenizer(tiny_models["bpe"])
    ids = tokenizer("the server reads", add_special_tokens=False).input_ids
    postprocessor = Postprocessor(str(tiny_models["bpe"]))
    flat = postprocessor(np.array([ids], dtype=np.int32), np.array([[len(ids)]], dtype=np.int32))  # [B, T]
    assert flat.tolist() == [tokenizer.decode(ids).encode()]
    with pytest.raises(RequestError, match="^SEQUENCE_LENGTH: has 2 beams, TOKENS_BATCH has 1$"):
        postprocessor(np.array([[ids]], dtype=np.int32), np.array([[len(ids), len(ids)]], dtype=np.int32))


def test_with_the_engines_alternatives_each_token_and_alternative_is_named_by_its_bytes(tiny_models):
    """The ensemble's log probabilities: token_bytes in TOKENS_BATCH's shape (none past a row's length), and
    top_token_bytes in top_token_ids' (none for the padding id -1); without top_token_ids, OUTPUT alone."""
    from tritonforge.facts.contract import POST_OUTPUT, TOKEN_BYTES, TOP_TOKEN_BYTES, TOP_TOKEN_IDS

    tokenizer = load_tokenizer(tiny_models["bpe"])
    ids = tokenizer("the server reads", add_special_tokens=False).input_ids[:3]
    postprocessor = Postprocessor(str(tiny_models["bpe"]))
    table = postprocessor.token_bytes
    inputs = {"TOKENS_BATCH": np.array([[ids]], dtype=np.int32), "SEQUENCE_LENGTH": np.array([[2]], dtype=np.int32)}
    assert set(postprocessor.answer(inputs)) == {POST_OUTPUT}
    top = np.array([[[[ids[1], -1], [ids[0], ids[2]], [ids[2], ids[1]]]]], dtype=np.int32)  # [1, 1 beam, 3, 2]
    answered = postprocessor.answer({**inputs, TOP_TOKEN_IDS: top})
    assert answered[TOKEN_BYTES].shape == (1, 1, 3) and answered[TOP_TOKEN_BYTES].shape == (1, 1, 3, 2)
    assert answered[TOKEN_BYTES].tolist() == [[[table.token_bytes(ids[0]), table.token_bytes(ids[1]), b""]]]
    assert answered[TOP_TOKEN_BYTES][0, 0, 0].tolist() == [table.token_bytes(ids[1]), b""]
    assert answered[TOP_TOKEN_BYTES][0, 0, 2].tolist() == [table.token_bytes(ids[2]), table.token_bytes(ids[1])]
