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
