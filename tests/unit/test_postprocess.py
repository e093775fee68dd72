"""The postprocessing model's decode of the engine's token rows, without a server."""

import numpy as np

from tritonforge.runtime.postprocess import Postprocessor
from tritonforge.runtime.tokenization import load_tokenizer


def test_each_row_decodes_only_its_sequence_length_of_tokens(tiny_models):
    """Rows of one response share a width: the ids past a row's length are not part of its text."""
    tokenizer = load_tokenizer(tiny_models["bpe"])
    ids = tokenizer("the server reads", add_special_tokens=False).input_ids
    text = Postprocessor(str(tiny_models["bpe"]))(np.array([[ids], [ids]], dtype=np.int32),
                                                  np.array([[2], [len(ids)]], dtype=np.int32))
    assert text.tolist() == [tokenizer.decode(ids[:2]).encode(), tokenizer.decode(ids).encode()]
