"""The engine's request parsing against the tensorrtllm backend's rules, without a server."""

import numpy as np
import pytest

from tritonforge.facts import contract
from tritonforge.facts.errors import RequestError, UnsupportedError
from tritonforge.runtime.engine.requests import (
    FEATURE_INPUTS,
    FLAG_INPUTS,
    IGNORED_INPUTS,
    SAMPLING_INPUTS,
    is_stop_request,
    parse_engine_request,
)

# Inputs the parser reads itself, besides the sampling and flag inputs.
PARSED = {"input_ids", "input_lengths", "request_output_len", "end_id", "stop", "beam_width", "num_return_sequences",
          "stop_words_list", "bad_words_list", "embedding_bias", "guided_decoding_guide_type", "guided_decoding_guide",
          "num_top_log_probs", "lora_task_id"}


def request(**extra):
    inputs = {"input_ids": np.array([[5, 6, 7]], dtype=np.int32), "input_lengths": np.array([[3]], dtype=np.int32),
              "request_output_len": np.array([[4]], dtype=np.int32)}
    inputs.update({name: np.asarray(value) for name, value in extra.items()})
    return inputs


def test_every_engine_input_is_parsed_ignored_or_refused_when_used():
    handled = PARSED | set(SAMPLING_INPUTS) | set(FLAG_INPUTS) | IGNORED_INPUTS | set(FEATURE_INPUTS)
    assert {tensor.name for tensor in contract.engine_inputs(messages=True)} == handled


def test_top_p_zero_is_unset_as_in_the_backend():
    (row,) = parse_engine_request(request(runtime_top_p=np.array([[0.0]], dtype=np.float32),
                                          runtime_top_k=np.array([[1]], dtype=np.int32)), default_exclude_input=True)
    assert row.sampling.top_p == 1.0 and row.sampling.greedy


def test_top_p_above_one_is_still_an_error_naming_the_client_field():
    with pytest.raises(RequestError, match="^top_p"):
        parse_engine_request(request(runtime_top_p=np.array([[1.5]], dtype=np.float32)), default_exclude_input=True)


@pytest.mark.parametrize(("name", "value", "field"), [
    ("lora_weights", np.ones((1, 2, 4), dtype=np.float16), "lora_weights"),
    ("prompt_embedding_table", np.ones((1, 2, 4), dtype=np.float16), "prompt_embedding_table"),
    ("return_generation_logits", np.array([[True]]), "return_generation_logits"),
    ("draft_input_ids", np.array([[1, 2]], dtype=np.int32), "draft_input_ids"),
])
def test_a_feature_really_asked_for_is_unsupported_naming_the_input(name, value, field):
    with pytest.raises(UnsupportedError, match=f"^{field}"):
        parse_engine_request(request(**{name: value}), default_exclude_input=True)


def test_each_rows_lora_task_id_is_read_and_zero_or_empty_is_the_base_model():
    batch = {"input_ids": np.array([[5, 6], [7, 8], [9, 1]], dtype=np.int32),
             "input_lengths": np.array([[2]] * 3, dtype=np.int32), "request_output_len": np.array([[4]] * 3, np.int32)}
    rows = parse_engine_request({**batch, "lora_task_id": np.array([[3], [0], [12]], dtype=np.uint64)},
                                default_exclude_input=True)
    assert [row.lora_task_id for row in rows] == [3, None, 12]
    empty = {**batch, "lora_task_id": np.zeros((0,), dtype=np.uint64)}
    assert [row.lora_task_id for row in parse_engine_request(empty, default_exclude_input=True)] == [None] * 3


def test_empty_or_false_feature_inputs_are_accepted():
    (row,) = parse_engine_request(request(lora_task_id=np.array([[0]], dtype=np.uint64),
                                          guided_decoding_guide_type=np.array([[b""]], dtype=object),
                                          return_context_logits=np.array([[False]]),
                                          embedding_bias=np.zeros((1, 0), dtype=np.float32),
                                          decoder_input_ids=np.array([[0]], dtype=np.int32)),
                                  default_exclude_input=True)
    assert row.embedding_bias is None and row.prompt_ids == [5, 6, 7] and row.guided_decoding is None


def test_end_id_zero_is_a_token_and_a_negative_end_id_means_none():
    """Some vocabularies end text with id 0 (GPT-NeoX's); the backend reads only a negative end id as none."""
    (zero,) = parse_engine_request(request(end_id=np.array([[0]], dtype=np.int32)), default_exclude_input=True)
    (negative,) = parse_engine_request(request(end_id=np.array([[-1]], dtype=np.int32)), default_exclude_input=True)
    assert zero.end_id == 0 and negative.end_id is None


def test_exclude_input_defaults_to_the_models_setting_and_a_request_overrides_it():
    (default,) = parse_engine_request(request(), default_exclude_input=False)
    (sent,) = parse_engine_request(request(exclude_input_in_output=np.array([[True]])), default_exclude_input=False)
    assert not default.exclude_input and sent.exclude_input


@pytest.mark.parametrize(("name", "attribute"), [
    ("streaming", "stream"), ("exclude_input_in_output", "exclude_input"), ("return_log_probs", "return_log_probs"),
    ("return_perf_metrics", "return_perf_metrics"), ("return_num_input_tokens", "return_num_input_tokens"),
    ("return_num_output_tokens", "return_num_output_tokens"),
])
def test_each_flag_input_sets_its_own_flag_only(name, attribute):
    attributes = ("stream", "exclude_input", "return_log_probs", "return_perf_metrics", "return_num_input_tokens",
                  "return_num_output_tokens")
    (row,) = parse_engine_request(request(**{name: np.array([[True]])}), default_exclude_input=False)
    assert {flag for flag in attributes if getattr(row, flag)} == {attribute}


def test_each_row_of_a_batch_gets_its_own_prompt_without_the_padding():
    inputs = request(input_ids=np.array([[5, 6, 7], [8, 9, 0]], dtype=np.int32),
                     input_lengths=np.array([[3], [2]], dtype=np.int32),
                     request_output_len=np.array([[4], [6]], dtype=np.int32))
    first, second = parse_engine_request(inputs, default_exclude_input=True)
    assert (first.prompt_ids, first.max_new_tokens) == ([5, 6, 7], 4)
    assert (second.prompt_ids, second.max_new_tokens) == ([8, 9], 6)


def test_each_row_of_a_batch_gets_its_own_words_bias_and_seed():
    words = {"stop_words_list": ([[11, 0], [1, -1]], [[12, 13], [2, -1]]),
             "bad_words_list": ([[21, 22], [2, -1]], [[23, 0], [1, -1]])}
    inputs = request(input_ids=np.array([[5, 6], [8, 9]], dtype=np.int32),
                     input_lengths=np.array([[2], [2]], dtype=np.int32),
                     request_output_len=np.array([[4], [4]], dtype=np.int32),
                     embedding_bias=np.array([[0.0, 1.5, 0.0], [0.0, 0.0, -2.0]], dtype=np.float32),
                     seed=np.array([[1], [2**32 + 1]], dtype=np.uint64),
                     **{name: np.array(rows, dtype=np.int32) for name, rows in words.items()})
    first, second = parse_engine_request(inputs, default_exclude_input=True)
    assert (first.stop_sequences, first.bad_sequences) == ([[11]], [[21, 22]])
    assert (second.stop_sequences, second.bad_sequences) == ([[12, 13]], [[23]])
    assert first.embedding_bias.tolist() == [0.0, 1.5, 0.0] and second.embedding_bias.tolist() == [0.0, 0.0, -2.0]
    assert (first.sampling.seed, second.sampling.seed) == (1, 2**32 + 1)


def test_a_sampling_input_with_more_than_one_value_per_row_is_refused_naming_the_client_field():
    with pytest.raises(RequestError, match="^top_k: must hold one value per row"):
        parse_engine_request(request(runtime_top_k=np.array([[1, 2]], dtype=np.int32)), default_exclude_input=True)


def test_a_malformed_bad_words_list_is_refused_naming_bad_words():
    malformed = np.array([[[5, 6], [3, -1]]], dtype=np.int32)  # an end offset past the two ids
    with pytest.raises(RequestError, match="^bad_words: offset 3"):
        parse_engine_request(request(bad_words_list=malformed), default_exclude_input=True)
    with pytest.raises(RequestError, match="^stop_words: offset 3"):
        parse_engine_request(request(stop_words_list=malformed), default_exclude_input=True)


def test_an_embedding_bias_must_have_a_row_per_request_row_and_finite_weights():
    with pytest.raises(RequestError, match="^embedding_bias: has 2 rows, the request has 1"):
        parse_engine_request(request(embedding_bias=np.zeros((2, 8), dtype=np.float32)), default_exclude_input=True)
    bias = np.zeros((1, 8), dtype=np.float32)
    bias[0, 3] = np.inf
    with pytest.raises(RequestError, match="^embedding_bias_weights: must be finite"):
        parse_engine_request(request(embedding_bias=bias), default_exclude_input=True)


@pytest.mark.parametrize("name", ["beam_width", "num_return_sequences"])
def test_more_than_one_beam_or_sequence_is_unsupported_naming_the_input(name):
    with pytest.raises(UnsupportedError, match=f"^{name}"):
        parse_engine_request(request(**{name: np.array([[2]], dtype=np.int32)}), default_exclude_input=True)


def test_only_a_stop_input_that_is_true_makes_a_stop_request():
    """NVIDIA's clients may send `stop` false on every request: that one must generate."""
    assert not is_stop_request(request(stop=np.array([[False]])))
    assert not is_stop_request(request())
    assert is_stop_request(request(stop=np.array([[True]])))


@pytest.mark.parametrize(("name", "field"), [("stop_words_list", "stop_words"), ("bad_words_list", "bad_words")])
def test_a_word_list_with_another_row_count_than_the_request_is_refused_naming_it(name, field):
    two_rows = np.array([[[11], [1]], [[12], [1]]], dtype=np.int32)
    with pytest.raises(RequestError, match=f"^{field}: has 2 rows, the request has 1"):
        parse_engine_request(request(**{name: two_rows}), default_exclude_input=True)


def strings(*values: str) -> np.ndarray:
    """A [rows, 1] string input, as the ensemble sends one."""
    return np.array([[value.encode()] for value in values], dtype=object)


def test_each_row_of_a_batch_gets_its_own_guide_and_json_ignores_a_guide_as_the_backend_does():
    inputs = request(input_ids=np.array([[5, 6], [8, 9], [1, 2]], dtype=np.int32),
                     input_lengths=np.array([[2], [2], [2]], dtype=np.int32),
                     request_output_len=np.array([[4], [4], [4]], dtype=np.int32),
                     guided_decoding_guide_type=strings("regex", "json", ""),
                     guided_decoding_guide=strings("[ab]+", "{ignored", ""))
    regex, json_any, unguided = parse_engine_request(inputs, default_exclude_input=True)
    assert (regex.guided_decoding.guide_type, regex.guided_decoding.guide) == ("regex", "[ab]+")
    assert (json_any.guided_decoding.guide_type, json_any.guided_decoding.guide) == ("json", "")
    assert unguided.guided_decoding is None


@pytest.mark.parametrize(("guide_type", "guide", "field", "problem"), [
    ("ebnf", "root ::= \"a\"", "guided_decoding_guide_type", "must be one of json, json_schema, regex, ebnf_grammar, "
                                                              "structural_tag, got 'ebnf'"),
    ("", "[ab]+", "guided_decoding_guide_type", "must name the type of guided_decoding_guide"),
    ("json_schema", " ", "guided_decoding_guide", "is required with guided_decoding_guide_type json_schema"),
    ("regex", None, "guided_decoding_guide", "is required with guided_decoding_guide_type regex"),
])
def test_a_guide_that_cannot_be_read_is_refused_naming_the_field(guide_type, guide, field, problem):
    extra = {"guided_decoding_guide_type": strings(guide_type)}
    if guide is not None:
        extra["guided_decoding_guide"] = strings(guide)
    with pytest.raises(RequestError, match=f"^{field}: {problem}") as raised:
        parse_engine_request(request(**extra), default_exclude_input=True)
    assert not isinstance(raised.value, UnsupportedError)


def test_a_guide_that_is_not_utf8_is_refused_naming_the_field():
    with pytest.raises(RequestError, match="^guided_decoding_guide: is not valid UTF-8"):
        parse_engine_request(request(guided_decoding_guide_type=strings("regex"),
                                     guided_decoding_guide=np.array([[b"\xff"]], dtype=object)),
                             default_exclude_input=True)
