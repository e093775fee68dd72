"""Each model's typed parameters: what the build writes is what the model reads; bad values name the key."""

import pytest

from tritonforge.facts.model_parameters import (
    BlsParameters,
    ParameterError,
    PreprocessingParameters,
    ReplayEngineParameters,
    TransformersEngineParameters,
)


@pytest.mark.parametrize("parameters", [
    PreprocessingParameters(tokenizer_dir="tokenizer", max_input_len=64, max_seq_len=256, add_special_tokens=False),
    BlsParameters(tokenizer_dir="../preprocessing/tokenizer", max_input_len=8, max_seq_len=10, max_concurrency=3),
    TransformersEngineParameters(model_path="1/checkpoint", max_batch_size=4, max_input_len=8, max_seq_len=16,
                                 dtype="bfloat16", exclude_input_in_output=False),
    ReplayEngineParameters(replay_tokens="1/t.json", replay_step_ms=8.5, vocab_size=100, shared_batch=True,
                           max_batch_size=128, max_input_len=8, max_seq_len=16),
])
def test_written_parameters_read_back_equal(parameters):
    written = parameters.to_config()
    assert all(isinstance(value, str) for value in written.values())
    assert type(parameters).from_config(written) == parameters


def test_absent_keys_take_the_field_default_and_required_ones_are_named():
    read = BlsParameters.from_config({"tokenizer_dir": "t", "max_input_len": "8", "max_seq_len": "10"})
    assert read.tensorrt_llm_model_name == "tensorrt_llm" and read.max_concurrency == 256 and read.add_special_tokens
    with pytest.raises(ParameterError, match="'max_input_len' is required"):
        PreprocessingParameters.from_config({"tokenizer_dir": "t", "max_seq_len": "10"})


def test_an_empty_value_reads_as_an_absent_key():
    """A config whose template left a parameter's string_value empty: the default, or the key named required."""
    read = BlsParameters.from_config({"tokenizer_dir": "t", "max_input_len": "8", "max_seq_len": "10",
                                      "max_concurrency": "", "add_special_tokens": ""})
    assert read.max_concurrency == 256 and read.add_special_tokens
    with pytest.raises(ParameterError, match="'max_input_len' is required"):
        PreprocessingParameters.from_config({"tokenizer_dir": "t", "max_input_len": "", "max_seq_len": "10"})


@pytest.mark.parametrize("key, value, message", [("max_input_len", "many", "must be int"),
                                                 ("add_special_tokens", "yes", "must be true or false")])
def test_unreadable_values_are_refused_naming_the_key(key, value, message):
    config = {"tokenizer_dir": "t", "max_input_len": "8", "max_seq_len": "10", key: value}
    with pytest.raises(ParameterError, match=f"'{key}' {message}"):
        PreprocessingParameters.from_config(config)


@pytest.mark.parametrize(("text", "value"), [("true", True), ("True", True), ("TRUE", True), ("1", True),
                                             ("false", False), ("False", False), ("0", False)])
def test_a_boolean_parameter_reads_as_hand_edited_configs_write_it(text, value):
    """NVIDIA's configs and hand edits write booleans in several ways; each reads as what it says."""
    from tritonforge.facts.model_parameters import PreprocessingParameters

    parameters = PreprocessingParameters.from_config({"tokenizer_dir": "t", "max_input_len": "8", "max_seq_len": "16",
                                                      "add_special_tokens": text})
    assert parameters.add_special_tokens is value
