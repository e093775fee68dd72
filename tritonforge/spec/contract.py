"""The tensor contract of every model: names, dtypes, dims, optional flags, and the ensemble's wiring.

One source of truth: the configs (`model_configs.py`), request parsing, the clients and the tests read it.
The lists are NVIDIA's `inflight_batcher_llm` model set (`triton_backend/all_models/inflight_batcher_llm/
*/config.pbtxt` of the TensorRT-LLM repository), in NVIDIA's order, with the template types filled as NVIDIA's
docs fill them (`logits_datatype` FP32, `encoder_input_features_data_type` and `prompt_embedding_table_data_type`
FP16). Read for TensorRT-LLM 1.1.0 (container 25.12) and checked again for the pin, 1.2.1 (container 26.07),
against the 1.x templates as stored (tensorrt_llm/config.pbtxt @2a9abd95 and @0c8de69a): the tensors are the
same. Release differences that matter: 1.x names `min_tokens`/`seed` (v0.19 and older: `min_length`/
`random_seed`) and has `return_num_input_tokens`/`return_num_output_tokens` → `num_input_tokens`/
`num_output_tokens`.

Left out on purpose, each a multimodal-only tensor of preprocessing (`IMAGE_*`, `VIDEO_BYTES`,
`PIXEL_VALUES`, ...) or of the BLS (`image_*_input`, `video_bytes_input`): this repository serves text
models. Ours adds one optional input, `messages` (chat), except in NVIDIA-exact wiring (`messages=False`,
the build's `--nvidia-wiring`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

S = mc.TYPE_STRING
I32 = mc.TYPE_INT32
I64 = mc.TYPE_INT64
U64 = mc.TYPE_UINT64
U8 = mc.TYPE_UINT8
F16 = mc.TYPE_FP16
F32 = mc.TYPE_FP32
BOOL = mc.TYPE_BOOL
LOGITS = F32  # NVIDIA's `logits_datatype` as its docs fill it

# The repository's model names, NVIDIA's (clients call them by these names).
ENGINE_MODEL = "tensorrt_llm"
PREPROCESSING_MODEL = "preprocessing"
POSTPROCESSING_MODEL = "postprocessing"
ENSEMBLE_MODEL = "ensemble"
BLS_MODEL = "tensorrt_llm_bls"

# Triton's response parameter that marks the last response of a decoupled request's stream.
FINAL_RESPONSE_PARAMETER = "triton_final_response"
# Ours: the tokens our clients and tools ask for when a request names no `max_tokens`.
DEFAULT_MAX_TOKENS = 64


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: int
    dims: tuple[int, ...]
    optional: bool = False
    scalar: bool = False  # reshape [1] → [] (the tensorrtllm backend's per-request scalars)
    ragged: bool = False


def _opt(name, dtype, dims, *, scalar=False, ragged=False) -> Tensor:
    return Tensor(name, dtype, dims, optional=True, scalar=scalar, ragged=ragged)


# --- the client contract (ensemble) --------------------------------------------------------------------------
# `text_input` is required in NVIDIA's wiring; ours makes it optional so that `messages` can replace it.
MESSAGES_INPUT = _opt("messages", S, (1,))  # ours: chat messages, rendered with the tokenizer's template
ENSEMBLE_INPUTS = [
    Tensor("text_input", S, (1,)),
    _opt("decoder_text_input", S, (1,)),
    Tensor("max_tokens", I32, (1,)),
    _opt("num_return_sequences", I32, (1,)),
    _opt("bad_words", S, (-1,)),
    _opt("stop_words", S, (-1,)),
    _opt("exclude_input_in_output", BOOL, (1,)),
    _opt("end_id", I32, (1,)),
    _opt("pad_id", I32, (1,)),
    _opt("top_k", I32, (1,)),
    _opt("top_p", F32, (1,)),
    _opt("temperature", F32, (1,)),
    _opt("length_penalty", F32, (1,)),
    _opt("repetition_penalty", F32, (1,)),
    _opt("min_tokens", I32, (1,)),
    _opt("presence_penalty", F32, (1,)),
    _opt("frequency_penalty", F32, (1,)),
    _opt("seed", U64, (1,)),
    _opt("return_log_probs", BOOL, (1,)),
    _opt("return_context_logits", BOOL, (1,)),
    _opt("return_generation_logits", BOOL, (1,)),
    _opt("return_perf_metrics", BOOL, (1,)),
    _opt("return_num_input_tokens", BOOL, (1,)),
    _opt("return_num_output_tokens", BOOL, (1,)),
    _opt("beam_width", I32, (1,)),
    _opt("stream", BOOL, (1,)),
    _opt("prompt_embedding_table", F16, (-1, -1)),
    _opt("prompt_table_extra_id", U64, (1,)),
    _opt("prompt_vocab_size", I32, (1,)),
    _opt("embedding_bias_words", S, (-1,)),
    _opt("embedding_bias_weights", F32, (-1,)),
    _opt("lora_task_id", U64, (1,)),
    _opt("lora_weights", F16, (-1, -1), ragged=True),
    _opt("lora_config", I32, (-1, 3), ragged=True),
    _opt("guided_decoding_guide_type", S, (1,), ragged=True),
    _opt("guided_decoding_guide", S, (1,), ragged=True),
]

# Outputs the engine produces besides tokens, passed straight through the ensemble and the BLS.
ENGINE_PASSTHROUGH_OUTPUTS = [
    Tensor("cum_log_probs", F32, (-1,)),
    Tensor("output_log_probs", F32, (-1, -1)),
    Tensor("context_logits", LOGITS, (-1, -1)),
    Tensor("generation_logits", LOGITS, (-1, -1, -1)),
    Tensor("batch_index", I32, (1,)),
    Tensor("sequence_index", I32, (1,)),
    Tensor("kv_cache_alloc_new_blocks", I32, (1,)),
    Tensor("kv_cache_reused_blocks", I32, (1,)),
    Tensor("kv_cache_alloc_total_blocks", I32, (1,)),
    Tensor("arrival_time_ns", I64, (1,)),
    Tensor("first_scheduled_time_ns", I64, (1,)),
    Tensor("first_token_time_ns", I64, (1,)),
    Tensor("last_token_time_ns", I64, (1,)),
    Tensor("acceptance_rate", F32, (1,)),
    Tensor("total_accepted_draft_tokens", I32, (1,)),
    Tensor("total_draft_tokens", I32, (1,)),
    Tensor("num_input_tokens", I32, (1,)),
    Tensor("num_output_tokens", I32, (1,)),
]
# NVIDIA's ensemble template lists kv_cache_alloc_total_blocks twice; a typed config lists it once.
CLIENT_OUTPUTS = [Tensor("text_output", S, (-1,)), *ENGINE_PASSTHROUGH_OUTPUTS]

# --- tensorrt_llm_bls: the ensemble's client inputs, some reshaped to scalars, plus speculative decoding ------
BLS_SCALAR_INPUTS = {"return_log_probs", "return_context_logits", "return_generation_logits",
                     "num_return_sequences", "lora_task_id", "return_perf_metrics", "return_num_input_tokens",
                     "return_num_output_tokens"}
BLS_EXTRA_INPUTS = [
    _opt("num_draft_tokens", I32, (1,)),
    _opt("use_draft_logits", BOOL, (1,), scalar=True),
]

# --- preprocessing ---------------------------------------------------------------------------------------------
PREPROCESSING_INPUTS = [
    Tensor("QUERY", S, (1,)),
    _opt("DECODER_QUERY", S, (1,)),
    Tensor("REQUEST_OUTPUT_LEN", I32, (1,)),
    _opt("BAD_WORDS_DICT", S, (-1,)),
    _opt("STOP_WORDS_DICT", S, (-1,)),
    _opt("EMBEDDING_BIAS_WORDS", S, (-1,)),
    _opt("EMBEDDING_BIAS_WEIGHTS", F32, (-1,)),
    _opt("END_ID", I32, (1,)),
    _opt("PAD_ID", I32, (1,)),
    _opt("PROMPT_TABLE_EXTRA_ID", U64, (1,)),
]
MESSAGES_PREPROCESSING_INPUT = _opt("MESSAGES", S, (1,))  # ours
PREPROCESSING_OUTPUTS = [
    Tensor("INPUT_ID", I32, (-1,)),
    Tensor("REQUEST_INPUT_LEN", I32, (1,)),
    Tensor("DECODER_INPUT_ID", I32, (-1,)),
    Tensor("REQUEST_DECODER_INPUT_LEN", I32, (1,)),
    Tensor("BAD_WORDS_IDS", I32, (2, -1)),
    Tensor("STOP_WORDS_IDS", I32, (2, -1)),
    Tensor("EMBEDDING_BIAS", F32, (-1,)),
    Tensor("REQUEST_OUTPUT_LEN", I32, (-1,)),
    Tensor("OUT_END_ID", I32, (1,)),
    Tensor("OUT_PAD_ID", I32, (1,)),
    Tensor("OUT_PROMPT_TABLE_EXTRA_IDS", U64, (-1,)),
]

# --- tensorrt_llm (the engine step) ----------------------------------------------------------------------------
ENGINE_INPUTS = [
    _opt("input_ids", I32, (-1,), ragged=True),
    _opt("encoder_input_features", F16, (-1, -1), ragged=True),
    _opt("encoder_output_lengths", I32, (1,), scalar=True),
    Tensor("input_lengths", I32, (1,), scalar=True),
    Tensor("request_output_len", I32, (1,), scalar=True),
    _opt("num_return_sequences", I32, (1,), scalar=True),
    _opt("draft_input_ids", I32, (-1,), ragged=True),
    _opt("decoder_input_ids", I32, (-1,), ragged=True),
    _opt("decoder_input_lengths", I32, (1,), scalar=True),
    _opt("draft_logits", LOGITS, (-1, -1), ragged=True),
    _opt("draft_acceptance_threshold", F32, (1,), scalar=True),
    _opt("end_id", I32, (1,), scalar=True),
    _opt("pad_id", I32, (1,), scalar=True),
    _opt("stop_words_list", I32, (2, -1), ragged=True),
    _opt("bad_words_list", I32, (2, -1), ragged=True),
    _opt("embedding_bias", F32, (-1,), ragged=True),
    _opt("beam_width", I32, (1,), scalar=True),
    _opt("temperature", F32, (1,), scalar=True),
    _opt("runtime_top_k", I32, (1,), scalar=True),
    _opt("runtime_top_p", F32, (1,), scalar=True),
    _opt("runtime_top_p_min", F32, (1,), scalar=True),
    _opt("runtime_top_p_decay", F32, (1,), scalar=True),
    _opt("runtime_top_p_reset_ids", I32, (1,), scalar=True),
    _opt("len_penalty", F32, (1,), scalar=True),
    _opt("early_stopping", BOOL, (1,), scalar=True),
    _opt("repetition_penalty", F32, (1,), scalar=True),
    _opt("min_tokens", I32, (1,), scalar=True),
    _opt("beam_search_diversity_rate", F32, (1,), scalar=True),
    _opt("presence_penalty", F32, (1,), scalar=True),
    _opt("frequency_penalty", F32, (1,), scalar=True),
    _opt("seed", U64, (1,), scalar=True),
    _opt("return_log_probs", BOOL, (1,), scalar=True),
    _opt("return_context_logits", BOOL, (1,), scalar=True),
    _opt("return_generation_logits", BOOL, (1,), scalar=True),
    _opt("return_perf_metrics", BOOL, (1,), scalar=True),
    _opt("return_num_input_tokens", BOOL, (1,), scalar=True),
    _opt("return_num_output_tokens", BOOL, (1,), scalar=True),
    _opt("exclude_input_in_output", BOOL, (1,), scalar=True),
    _opt("stop", BOOL, (1,), scalar=True),
    _opt("streaming", BOOL, (1,), scalar=True),
    _opt("prompt_embedding_table", F16, (-1, -1), ragged=True),
    _opt("prompt_table_extra_ids", U64, (-1,), ragged=True),
    _opt("prompt_vocab_size", I32, (1,), scalar=True),
    _opt("cross_attention_mask", BOOL, (-1, -1), ragged=True),
    _opt("mrope_rotary_cos_sin", F32, (-1,)),
    _opt("mrope_position_deltas", I64, (1,)),
    _opt("lora_task_id", U64, (1,), scalar=True),
    _opt("lora_weights", F16, (-1, -1), ragged=True),
    _opt("lora_config", I32, (-1, 3), ragged=True),
    _opt("context_phase_params", U8, (-1,), ragged=True),
    _opt("skip_cross_attn_blocks", BOOL, (1,), ragged=True),
    _opt("retention_token_range_starts", I32, (-1,), ragged=True),
    _opt("retention_token_range_ends", I32, (-1,), ragged=True),
    _opt("retention_token_range_priorities", I32, (-1,), ragged=True),
    _opt("retention_token_range_durations_ms", I32, (-1,), ragged=True),
    _opt("retention_decode_priority", I32, (1,), ragged=True),
    _opt("retention_decode_duration_ms", I32, (1,), ragged=True),
    _opt("guided_decoding_guide_type", S, (1,), ragged=True),
    _opt("guided_decoding_guide", S, (1,), ragged=True),
    _opt("lookahead_window_size", I32, (1,), ragged=True),
    _opt("lookahead_ngram_size", I32, (1,), ragged=True),
    _opt("lookahead_verification_set_size", I32, (1,), ragged=True),
]
ENGINE_OUTPUTS = [
    Tensor("output_ids", I32, (-1, -1)),
    Tensor("sequence_length", I32, (-1,)),
    *ENGINE_PASSTHROUGH_OUTPUTS[:6],  # log probs, logits, batch and sequence index
    Tensor("context_phase_params", U8, (-1,)),
    *ENGINE_PASSTHROUGH_OUTPUTS[6:],  # KV-cache and timing statistics, draft counts, token counts
]



def stop_request_inputs() -> dict[str, np.ndarray]:
    """A request to the engine that stops its running request with the same request id (the tensorrtllm
    backend's `stop`): the required inputs, and `stop`. The engine answers it with an empty final response."""
    return {"input_lengths": np.array([[1]], dtype=np.int32), "request_output_len": np.array([[1]], dtype=np.int32),
            "stop": np.array([[True]])}


# --- postprocessing --------------------------------------------------------------------------------------------
POSTPROCESSING_INPUTS = [Tensor("TOKENS_BATCH", I32, (-1, -1)), Tensor("SEQUENCE_LENGTH", I32, (-1,))]
POSTPROCESSING_OUTPUTS = [Tensor("OUTPUT", S, (-1,))]

# --- the ensemble's wiring (NVIDIA's, plus `messages`) ---------------------------------------------------------
# preprocessing input → client input
PREPROCESSING_FROM_CLIENT = {
    "QUERY": "text_input", "DECODER_QUERY": "decoder_text_input", "REQUEST_OUTPUT_LEN": "max_tokens",
    "BAD_WORDS_DICT": "bad_words", "STOP_WORDS_DICT": "stop_words", "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
    "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights", "END_ID": "end_id", "PAD_ID": "pad_id",
    "PROMPT_TABLE_EXTRA_ID": "prompt_table_extra_id",
}
MESSAGES_WIRING = {"MESSAGES": "messages"}  # ours
# preprocessing output → ensemble tensor
PREPROCESSING_TO_ENSEMBLE = {
    "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN", "INPUT_ID": "_INPUT_ID",
    "REQUEST_DECODER_INPUT_LEN": "_REQUEST_DECODER_INPUT_LEN", "DECODER_INPUT_ID": "_DECODER_INPUT_ID",
    "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN", "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
    "BAD_WORDS_IDS": "_BAD_WORDS_IDS", "EMBEDDING_BIAS": "_EMBEDDING_BIAS", "OUT_END_ID": "_PREPROCESSOR_END_ID",
    "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID", "OUT_PROMPT_TABLE_EXTRA_IDS": "_OUT_PROMPT_TABLE_EXTRA_IDS",
}
# engine input → ensemble tensor written by preprocessing
ENGINE_FROM_PREPROCESSING = {
    "input_ids": "_INPUT_ID", "decoder_input_ids": "_DECODER_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN",
    "decoder_input_lengths": "_REQUEST_DECODER_INPUT_LEN", "request_output_len": "_REQUEST_OUTPUT_LEN",
    "end_id": "_PREPROCESSOR_END_ID", "pad_id": "_PREPROCESSOR_PAD_ID", "embedding_bias": "_EMBEDDING_BIAS",
    "stop_words_list": "_STOP_WORDS_IDS", "bad_words_list": "_BAD_WORDS_IDS",
    "prompt_table_extra_ids": "_OUT_PROMPT_TABLE_EXTRA_IDS",
}
# engine input → client input
ENGINE_FROM_CLIENT = {
    "exclude_input_in_output": "exclude_input_in_output", "runtime_top_k": "top_k", "runtime_top_p": "top_p",
    "temperature": "temperature", "len_penalty": "length_penalty", "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "seed": "seed", "return_log_probs": "return_log_probs", "return_context_logits": "return_context_logits",
    "return_generation_logits": "return_generation_logits", "return_perf_metrics": "return_perf_metrics",
    "return_num_input_tokens": "return_num_input_tokens", "return_num_output_tokens": "return_num_output_tokens",
    "num_return_sequences": "num_return_sequences", "beam_width": "beam_width", "streaming": "stream",
    "prompt_embedding_table": "prompt_embedding_table", "prompt_vocab_size": "prompt_vocab_size",
    "lora_task_id": "lora_task_id", "lora_weights": "lora_weights", "lora_config": "lora_config",
    "guided_decoding_guide_type": "guided_decoding_guide_type", "guided_decoding_guide": "guided_decoding_guide",
}
ENGINE_TOKEN_OUTPUTS = {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"}
POSTPROCESSING_FROM_ENSEMBLE = {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"}
POSTPROCESSING_TO_CLIENT = {"OUTPUT": "text_output"}


def _with_chat(inputs: list[Tensor], chat: Tensor) -> list[Tensor]:
    """NVIDIA's inputs with our chat input after the prompt, which it makes optional (it may replace it)."""
    prompt = inputs[0]
    return [_opt(prompt.name, prompt.dtype, prompt.dims), chat, *inputs[1:]]


def client_inputs(*, messages: bool) -> list[Tensor]:
    """The ensemble's inputs: NVIDIA's, and with `messages` ours."""
    return _with_chat(ENSEMBLE_INPUTS, MESSAGES_INPUT) if messages else list(ENSEMBLE_INPUTS)


def bls_inputs(*, messages: bool) -> list[Tensor]:
    """The BLS's inputs: the ensemble's with NVIDIA's scalar reshapes, plus speculative decoding."""
    inputs = [Tensor(t.name, t.dtype, t.dims, t.optional, scalar=t.name in BLS_SCALAR_INPUTS, ragged=t.ragged)
              for t in client_inputs(messages=messages)]
    return [*inputs, *BLS_EXTRA_INPUTS]


def preprocessing_inputs(*, messages: bool) -> list[Tensor]:
    return _with_chat(PREPROCESSING_INPUTS, MESSAGES_PREPROCESSING_INPUT) if messages else list(PREPROCESSING_INPUTS)


# A client's name for each preprocessing and engine input, for error messages ("top_p", not "runtime_top_p").
CLIENT_NAME = {**PREPROCESSING_FROM_CLIENT, **MESSAGES_WIRING, **ENGINE_FROM_CLIENT,
               "request_output_len": "max_tokens"}
