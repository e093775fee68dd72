"""Every generated config parses back with the model-config proto and carries the right settings."""

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.facts.limits import EngineLimits


def test_repository_configs_parse_and_carry_serving_settings(tiny_models, tmp_path):
    serving = configs.ServingConfig(postprocessing_instances=3, max_queue_delay_microseconds=100)
    out = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", max_input_len=64,
                             max_seq_len=128, serving=serving))
    parsed = {d.name: configs.parse_text((d / "config.pbtxt").read_text())
              for d in Path(out).iterdir() if (d / "config.pbtxt").exists()}
    assert set(parsed) == {"preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls",
                           "tensorrt_llm_coalescer"}
    assert parsed["tensorrt_llm"].model_transaction_policy.decoupled
    assert parsed["tensorrt_llm_coalescer"].model_transaction_policy.decoupled
    assert parsed["tensorrt_llm_bls"].model_transaction_policy.decoupled
    assert parsed["postprocessing"].instance_group[0].count == 3
    assert parsed["postprocessing"].dynamic_batching.preserve_ordering
    assert parsed["preprocessing"].dynamic_batching.max_queue_delay_microseconds == 100
    engine_inputs = {i.name: i for i in parsed["tensorrt_llm"].input}
    assert engine_inputs["temperature"].HasField("reshape") and engine_inputs["input_lengths"].optional is False
    assert parsed["tensorrt_llm"].instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


def test_the_ensemble_calls_the_engine_through_the_coalescer_unless_told_not_to_or_unstreamed():
    def engine_step(serving):
        return configs.ensemble_config(serving).ensemble_scheduling.step[1].model_name

    assert engine_step(configs.ServingConfig()) == "tensorrt_llm_coalescer"
    assert engine_step(configs.ServingConfig(coalescer=False)) == "tensorrt_llm"
    assert engine_step(configs.ServingConfig(decoupled=False)) == "tensorrt_llm"


@pytest.mark.parametrize("ours", [True, False], ids=["our-wiring", "nvidia-wiring"])
def test_the_coalescer_takes_the_engines_tensors_with_the_shapes_the_engine_expects_before_its_reshape(ours):
    # The engine's tensors of the same wiring: ours adds the log probabilities' alternatives to both.
    engine = configs.engine_config(configs.ServingConfig(messages_input=ours), backend="python", parameters={})
    coalescer = configs.coalescer_config(configs.ServingConfig(coalescer_max_responses_per_second=5000,
                                                               messages_input=ours), "tritonforge_coalescer")
    assert [(i.name, list(i.dims)) for i in coalescer.input] == [(i.name, list(i.dims)) for i in engine.input]
    assert not any(i.HasField("reshape") for i in coalescer.input)
    assert [o.name for o in coalescer.output] == [o.name for o in engine.output]
    assert coalescer.model_transaction_policy.decoupled
    assert coalescer.parameters["tensorrt_llm_model_name"].string_value == "tensorrt_llm"
    assert coalescer.parameters["max_responses_per_second"].string_value == "5000"


def test_ensemble_wires_every_step_input():
    config = configs.ensemble_config(configs.ServingConfig())
    produced = {i.name for i in config.input}
    for step in config.ensemble_scheduling.step:
        produced |= set(step.output_map.values())
    for step in config.ensemble_scheduling.step:
        assert set(step.input_map.values()) <= produced, step.model_name
    assert {o.name for o in config.output} <= produced


# NVIDIA's tensor names at TensorRT-LLM 1.1.0 (triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt),
# kept here independently of tritonforge/facts/contract.py; multimodal-only tensors are left out on purpose. Checked
# again for the 1.2.1 pin in the 1.x templates as stored: tensorrt_llm and ensemble @2a9abd95, tensorrt_llm_bls
# @0193dbd4, preprocessing @08dc37e3 (which adds only multimodal inputs, such as IMAGES): the same names.
NVIDIA_ENGINE_INPUTS = {
    "input_ids", "encoder_input_features", "encoder_output_lengths", "input_lengths", "request_output_len",
    "num_return_sequences", "draft_input_ids", "decoder_input_ids", "decoder_input_lengths", "draft_logits",
    "draft_acceptance_threshold", "end_id", "pad_id", "stop_words_list", "bad_words_list", "embedding_bias",
    "beam_width", "temperature", "runtime_top_k", "runtime_top_p", "runtime_top_p_min", "runtime_top_p_decay",
    "runtime_top_p_reset_ids", "len_penalty", "early_stopping", "repetition_penalty", "min_tokens",
    "beam_search_diversity_rate", "presence_penalty", "frequency_penalty", "seed", "return_log_probs",
    "return_context_logits", "return_generation_logits", "return_perf_metrics", "return_num_input_tokens",
    "return_num_output_tokens", "exclude_input_in_output", "stop", "streaming", "prompt_embedding_table",
    "prompt_table_extra_ids", "prompt_vocab_size", "cross_attention_mask", "mrope_rotary_cos_sin",
    "mrope_position_deltas", "lora_task_id", "lora_weights", "lora_config", "context_phase_params",
    "skip_cross_attn_blocks", "retention_token_range_starts", "retention_token_range_ends",
    "retention_token_range_priorities", "retention_token_range_durations_ms", "retention_decode_priority",
    "retention_decode_duration_ms", "guided_decoding_guide_type", "guided_decoding_guide", "lookahead_window_size",
    "lookahead_ngram_size", "lookahead_verification_set_size",
}
NVIDIA_STATISTICS = {
    "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns",
    "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
    "total_accepted_draft_tokens", "total_draft_tokens", "num_input_tokens", "num_output_tokens",
}
NVIDIA_ENGINE_OUTPUTS = {"output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "context_logits",
                         "generation_logits", "batch_index", "sequence_index", "context_phase_params",
                         *NVIDIA_STATISTICS}
NVIDIA_ENSEMBLE_INPUTS = {
    "text_input", "decoder_text_input", "max_tokens", "num_return_sequences", "bad_words", "stop_words",
    "exclude_input_in_output", "end_id", "pad_id", "top_k", "top_p", "temperature", "length_penalty",
    "repetition_penalty", "min_tokens", "presence_penalty", "frequency_penalty", "seed", "return_log_probs",
    "return_context_logits", "return_generation_logits", "return_perf_metrics", "return_num_input_tokens",
    "return_num_output_tokens", "beam_width", "stream", "prompt_embedding_table", "prompt_table_extra_id",
    "prompt_vocab_size", "embedding_bias_words", "embedding_bias_weights", "lora_task_id", "lora_weights",
    "lora_config", "guided_decoding_guide_type", "guided_decoding_guide",
}
NVIDIA_CLIENT_OUTPUTS = {"text_output", "cum_log_probs", "output_log_probs", "context_logits", "generation_logits",
                         "batch_index", "sequence_index", *NVIDIA_STATISTICS}
NVIDIA_PREPROCESSING_INPUTS = {"QUERY", "DECODER_QUERY", "REQUEST_OUTPUT_LEN", "BAD_WORDS_DICT", "STOP_WORDS_DICT",
                               "EMBEDDING_BIAS_WORDS", "EMBEDDING_BIAS_WEIGHTS", "END_ID", "PAD_ID",
                               "PROMPT_TABLE_EXTRA_ID"}
NVIDIA_PREPROCESSING_OUTPUTS = {"INPUT_ID", "REQUEST_INPUT_LEN", "DECODER_INPUT_ID", "REQUEST_DECODER_INPUT_LEN",
                                "BAD_WORDS_IDS", "STOP_WORDS_IDS", "EMBEDDING_BIAS", "REQUEST_OUTPUT_LEN",
                                "OUT_END_ID", "OUT_PAD_ID", "OUT_PROMPT_TABLE_EXTRA_IDS"}
LIMITS = EngineLimits(max_batch_size=4, max_input_len=64, max_seq_len=128)


def names(tensors) -> set[str]:
    return {tensor.name for tensor in tensors}


def test_nvidia_wiring_declares_exactly_nvidias_tensors():
    serving = configs.ServingConfig(messages_input=False)
    engine = configs.engine_config(serving, backend="python", parameters={})
    assert (names(engine.input), names(engine.output)) == (NVIDIA_ENGINE_INPUTS, NVIDIA_ENGINE_OUTPUTS)
    ensemble = configs.ensemble_config(serving)
    assert (names(ensemble.input), names(ensemble.output)) == (NVIDIA_ENSEMBLE_INPUTS, NVIDIA_CLIENT_OUTPUTS)
    assert {i.name: i.optional for i in ensemble.input}["text_input"] is False
    assert {i.name: i.optional for i in ensemble.input}["max_tokens"] is False
    bls = configs.bls_config(serving, LIMITS, "tok")
    assert names(bls.input) == NVIDIA_ENSEMBLE_INPUTS | {"num_draft_tokens", "use_draft_logits"}
    assert names(bls.output) == NVIDIA_CLIENT_OUTPUTS
    pre = configs.preprocessing_config(serving, LIMITS, "tok")
    assert (names(pre.input), names(pre.output)) == (NVIDIA_PREPROCESSING_INPUTS, NVIDIA_PREPROCESSING_OUTPUTS)
    wired = {key for step in ensemble.ensemble_scheduling.step for key in step.input_map}
    assert "MESSAGES" not in wired


def test_default_wiring_adds_only_the_messages_input_and_the_log_probabilities():
    serving = configs.ServingConfig()
    ensemble = configs.ensemble_config(serving)
    assert names(ensemble.input) == NVIDIA_ENSEMBLE_INPUTS | {"messages", "num_top_log_probs"}
    assert names(ensemble.output) == NVIDIA_CLIENT_OUTPUTS | {"token_bytes", "top_token_bytes", "top_log_probs"}
    assert {i.name: i.optional for i in ensemble.input}["text_input"] is True
    assert {i.name: i.optional for i in ensemble.input}["num_top_log_probs"] is True


def test_default_wiring_lets_a_request_without_max_tokens_reach_the_models_that_refuse_it():
    """Optional wherever the request enters: Triton 2.51 runs no ensemble step whose required input is missing,
    and answers with an empty success (tests/integration/test_serve_lifecycle.py sends one)."""
    serving = configs.ServingConfig()
    optional = {
        "ensemble": {i.name: i.optional for i in configs.ensemble_config(serving).input}["max_tokens"],
        "bls": {i.name: i.optional for i in configs.bls_config(serving, LIMITS, "tok").input}["max_tokens"],
        "preprocessing": {i.name: i.optional for i in configs.preprocessing_config(serving, LIMITS, "tok").input}[
            "REQUEST_OUTPUT_LEN"]}
    assert optional == {"ensemble": True, "bls": True, "preprocessing": True}
    assert names(configs.preprocessing_config(serving, LIMITS, "tok").input) == NVIDIA_PREPROCESSING_INPUTS | {
        "MESSAGES"}


def test_the_build_copies_the_checkpoints_tokenizer_files_as_they_are(tiny_models, tmp_path):
    out = build(BuildOptions(model=tiny_models["sentencepiece"], output=tmp_path / "repo", max_input_len=64,
                             max_seq_len=128))
    copied = out / "preprocessing" / "tokenizer"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (copied / name).read_bytes() == (tiny_models["sentencepiece"] / name).read_bytes()
    # transformers 4.x (NVIDIA's containers) does not know transformers 5's TokenizersBackend class.
    assert "TokenizersBackend" not in (copied / "tokenizer_config.json").read_text()


@pytest.mark.parametrize("name", ["max_queue_delay_microseconds", "postprocessing_delay_microseconds",
                                  "max_queue_size"])
def test_a_negative_queue_setting_is_refused_naming_it(name):
    with pytest.raises(ValueError, match=f"^{name} must be >= 0, got -5$"):
        configs.ServingConfig(**{name: -5})


def test_the_engine_queue_limit_is_written_and_the_engine_reads_it_back():
    """`max_queue_size` goes to the engine's default queue policy, where the engine step reads it from the
    model config Triton hands to `initialize` (as JSON with the proto's field names)."""
    from google.protobuf import json_format

    from tritonforge.facts.model_parameters import EngineParameters
    from tritonforge.runtime.engine.service import EngineSettings

    parameters = EngineParameters(max_batch_size=4, max_input_len=16, max_seq_len=32)

    def written_and_read(serving):
        config = configs.engine_config(serving, backend="python", parameters=parameters.to_config())
        args = {"model_config": json_format.MessageToJson(config, preserving_proto_field_name=True)}
        return config.dynamic_batching, EngineSettings.from_model_args(args, EngineParameters.from_model_args(args))

    batching, settings = written_and_read(configs.ServingConfig(max_queue_size=8))
    assert batching.default_queue_policy.max_queue_size == 8 and settings.limits.max_queue_size == 8
    batching, settings = written_and_read(configs.ServingConfig())
    assert not batching.HasField("default_queue_policy") and settings.limits.max_queue_size == 0


@pytest.mark.parametrize("preserve", [True, False])
def test_postprocessing_keeps_arrival_order_unless_told_not_to(preserve):
    serving = configs.ServingConfig(postprocessing_preserve_ordering=preserve)
    assert configs.postprocessing_config(serving, "tokenizer").dynamic_batching.preserve_ordering is preserve


@pytest.mark.parametrize(("target", "limit"), [((2, 51), None), ((2, 62), None), ((2, 63), 64), ((3, 0), 64)])
def test_the_ensemble_bounds_its_inflight_requests_from_triton_2_63(target, limit):
    """2.63 added `max_inflight_requests` (backpressure between steps); 2.51's config parser refuses it."""
    scheduling = configs.ensemble_config(configs.ServingConfig(target_triton=target)).ensemble_scheduling
    assert (scheduling.max_inflight_requests or None) == limit


def test_the_engine_step_takes_its_dtype_device_and_echo_from_its_parameters():
    """What `--dtype`, `--device` and `--include-input-in-output` wrote is what the transformers engine runs."""
    from tritonforge.facts.model_parameters import TransformersEngineParameters
    from tritonforge.runtime.engine.service import EngineSettings

    parameters = TransformersEngineParameters(model_path="", max_batch_size=4, max_input_len=16, max_seq_len=32,
                                              dtype="bfloat16", device="cpu", exclude_input_in_output=False)
    settings = EngineSettings.from_parameters(parameters, decoupled=False, max_queue_size=3)
    assert (settings.dtype, settings.device, settings.exclude_input_in_output, settings.decoupled) == (
        "bfloat16", "cpu", False, False)
    assert (settings.limits.max_batch_size, settings.limits.max_queue_size) == (4, 3)
