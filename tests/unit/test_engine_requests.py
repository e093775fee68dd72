"""The engine's request parsing against the tensorrtllm backend's rules, without a server."""

import numpy as np
import pytest

from tritonforge.runtime.engine_requests import (
    FEATURE_INPUTS,
    FLAG_INPUTS,
    IGNORED_INPUTS,
    SAMPLING_INPUTS,
    parse_engine_request,
)
from tritonforge.spec import contract
from tritonforge.spec.errors import RequestError, UnsupportedError

# Inputs the parser reads itself, besides the sampling and flag inputs.
PARSED = {"input_ids", "input_lengths", "request_output_len", "end_id", "stop", "beam_width", "num_return_sequences",
          "stop_words_list", "bad_words_list", "embedding_bias"}


def request(**extra):
    inputs = {"input_ids": np.array([[5, 6, 7]], dtype=np.int32), "input_lengths": np.array([[3]], dtype=np.int32),
              "request_output_len": np.array([[4]], dtype=np.int32)}
    inputs.update({name: np.asarray(value) for name, value in extra.items()})
    return inputs


def test_every_engine_input_is_parsed_ignored_or_refused_when_used():
    handled = PARSED | set(SAMPLING_INPUTS) | set(FLAG_INPUTS) | IGNORED_INPUTS | set(FEATURE_INPUTS)
    assert {tensor.name for tensor in contract.ENGINE_INPUTS} == handled


def test_top_p_zero_is_unset_as_in_the_backend():
    (row,) = parse_engine_request(request(runtime_top_p=np.array([[0.0]], dtype=np.float32),
                                          runtime_top_k=np.array([[1]], dtype=np.int32)), default_exclude_input=True)
    assert row.sampling.top_p == 1.0 and row.sampling.greedy


def test_top_p_above_one_is_still_an_error_naming_the_client_field():
    with pytest.raises(RequestError, match="^top_p"):
        parse_engine_request(request(runtime_top_p=np.array([[1.5]], dtype=np.float32)), default_exclude_input=True)


@pytest.mark.parametrize(("name", "value", "field"), [
    ("lora_task_id", np.array([[7]], dtype=np.uint64), "lora_task_id"),
    ("guided_decoding_guide_type", np.array([[b"json"]], dtype=object), "guided_decoding_guide_type"),
    ("return_generation_logits", np.array([[True]]), "return_generation_logits"),
    ("draft_input_ids", np.array([[1, 2]], dtype=np.int32), "draft_input_ids"),
])
def test_a_feature_really_asked_for_is_unsupported_naming_the_input(name, value, field):
    with pytest.raises(UnsupportedError, match=f"^{field}"):
        parse_engine_request(request(**{name: value}), default_exclude_input=True)


def test_empty_or_false_feature_inputs_are_accepted():
    (row,) = parse_engine_request(request(lora_task_id=np.array([[0]], dtype=np.uint64),
                                          guided_decoding_guide_type=np.array([[b""]], dtype=object),
                                          return_context_logits=np.array([[False]]),
                                          embedding_bias=np.zeros((1, 0), dtype=np.float32),
                                          decoder_input_ids=np.array([[0]], dtype=np.int32)),
                                  default_exclude_input=True)
    assert row.embedding_bias is None and row.prompt_ids == [5, 6, 7]
