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
models. Ours adds one optional input, `messages` (chat), and declares `text_input` and `max_tokens` optional
(the models refuse a request without them, naming the field), except in NVIDIA-exact wiring (`messages=False`,
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
# Ours: the ensemble's engine step, which calls ENGINE_MODEL in-process and sends the ensemble fewer, larger
# streamed responses (tritonforge/runtime/engine/coalescer/coalescer_backend.cc).
COALESCER_MODEL = "tensorrt_llm_coalescer"

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


# --- tensor names: each once, for the lists below and every module that reads or writes a tensor ----------
# The client's inputs: the ensemble's, and the BLS's (NVIDIA's order).
TEXT_INPUT = "text_input"
DECODER_TEXT_INPUT = "decoder_text_input"
MAX_TOKENS = "max_tokens"
NUM_RETURN_SEQUENCES = "num_return_sequences"
BAD_WORDS = "bad_words"
STOP_WORDS = "stop_words"
EXCLUDE_INPUT_IN_OUTPUT = "exclude_input_in_output"
END_ID = "end_id"
PAD_ID = "pad_id"
TOP_K = "top_k"
TOP_P = "top_p"
TEMPERATURE = "temperature"
LENGTH_PENALTY = "length_penalty"
REPETITION_PENALTY = "repetition_penalty"
MIN_TOKENS = "min_tokens"
PRESENCE_PENALTY = "presence_penalty"
FREQUENCY_PENALTY = "frequency_penalty"
SEED = "seed"
RETURN_LOG_PROBS = "return_log_probs"
RETURN_CONTEXT_LOGITS = "return_context_logits"
RETURN_GENERATION_LOGITS = "return_generation_logits"
RETURN_PERF_METRICS = "return_perf_metrics"
RETURN_NUM_INPUT_TOKENS = "return_num_input_tokens"
RETURN_NUM_OUTPUT_TOKENS = "return_num_output_tokens"
BEAM_WIDTH = "beam_width"
STREAM = "stream"
PROMPT_EMBEDDING_TABLE = "prompt_embedding_table"
PROMPT_TABLE_EXTRA_ID = "prompt_table_extra_id"
PROMPT_VOCAB_SIZE = "prompt_vocab_size"
EMBEDDING_BIAS_WORDS = "embedding_bias_words"
EMBEDDING_BIAS_WEIGHTS = "embedding_bias_weights"
LORA_TASK_ID = "lora_task_id"
LORA_WEIGHTS = "lora_weights"
LORA_CONFIG = "lora_config"
GUIDED_DECODING_GUIDE_TYPE = "guided_decoding_guide_type"
GUIDED_DECODING_GUIDE = "guided_decoding_guide"
# Ours: the client's chat input.
MESSAGES = "messages"
# The BLS's own inputs (speculative decoding).
NUM_DRAFT_TOKENS = "num_draft_tokens"
USE_DRAFT_LOGITS = "use_draft_logits"
# Ours, the BLS's: engine responses per streamed response after the first.
STREAM_INTERVAL = "stream_interval"
# Ours, the BLS's and the engine's: each generated token's log probability with this many of the likeliest
# tokens beside it (0 to MAX_TOP_LOG_PROBS), what OpenAI's `logprobs` / `top_logprobs` ask.
NUM_TOP_LOG_PROBS = "num_top_log_probs"
MAX_TOP_LOG_PROBS = 20  # OpenAI's limit on top_logprobs
# Ours, with it: the prompt's tokens' log probabilities too (each but the first, which nothing predicts), what
# OpenAI's `echo` with `logprobs` asks, and evaluation harnesses score answers by.
RETURN_PROMPT_LOG_PROBS = "return_prompt_log_probs"
# The client's output: the text.
TEXT_OUTPUT = "text_output"
# The engine's outputs that pass through the ensemble and the BLS to the client.
CUM_LOG_PROBS = "cum_log_probs"
OUTPUT_LOG_PROBS = "output_log_probs"
CONTEXT_LOGITS = "context_logits"
GENERATION_LOGITS = "generation_logits"
BATCH_INDEX = "batch_index"
SEQUENCE_INDEX = "sequence_index"
KV_CACHE_ALLOC_NEW_BLOCKS = "kv_cache_alloc_new_blocks"
KV_CACHE_REUSED_BLOCKS = "kv_cache_reused_blocks"
KV_CACHE_ALLOC_TOTAL_BLOCKS = "kv_cache_alloc_total_blocks"
ARRIVAL_TIME_NS = "arrival_time_ns"
FIRST_SCHEDULED_TIME_NS = "first_scheduled_time_ns"
FIRST_TOKEN_TIME_NS = "first_token_time_ns"
LAST_TOKEN_TIME_NS = "last_token_time_ns"
ACCEPTANCE_RATE = "acceptance_rate"
TOTAL_ACCEPTED_DRAFT_TOKENS = "total_accepted_draft_tokens"
TOTAL_DRAFT_TOKENS = "total_draft_tokens"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"
# Ours, with num_top_log_probs: the likeliest tokens at each generated token's step (the engine's and the
# BLS's), and the BLS's per response: the tokens it adds, each one's bytes and log probability, and the bytes of
# the likeliest beside each (a token's bytes may be part of a character: they are what its text is made of).
TOP_LOG_PROBS = "top_log_probs"
TOP_TOKEN_IDS = "top_token_ids"
TOKEN_IDS = "token_ids"
TOKEN_BYTES = "token_bytes"
TOKEN_LOG_PROBS = "token_log_probs"
TOP_TOKEN_BYTES = "top_token_bytes"
# Ours, the engine's, with return_prompt_log_probs, on its first response: each prompt token's log probability
# (NaN for the first) and the likeliest tokens at its place, [1, prompt tokens(, k)].
PROMPT_LOG_PROBS = "prompt_log_probs"
PROMPT_TOP_TOKEN_IDS = "prompt_top_token_ids"
PROMPT_TOP_LOG_PROBS = "prompt_top_log_probs"
# tensorrt_llm's inputs and outputs (those named as the client's are above: end_id, temperature, ...).
INPUT_IDS = "input_ids"
ENCODER_INPUT_FEATURES = "encoder_input_features"
ENCODER_OUTPUT_LENGTHS = "encoder_output_lengths"
INPUT_LENGTHS = "input_lengths"
REQUEST_OUTPUT_LEN = "request_output_len"
DRAFT_INPUT_IDS = "draft_input_ids"
DECODER_INPUT_IDS = "decoder_input_ids"
DECODER_INPUT_LENGTHS = "decoder_input_lengths"
DRAFT_LOGITS = "draft_logits"
DRAFT_ACCEPTANCE_THRESHOLD = "draft_acceptance_threshold"
STOP_WORDS_LIST = "stop_words_list"
BAD_WORDS_LIST = "bad_words_list"
EMBEDDING_BIAS = "embedding_bias"
RUNTIME_TOP_K = "runtime_top_k"
RUNTIME_TOP_P = "runtime_top_p"
RUNTIME_TOP_P_MIN = "runtime_top_p_min"
RUNTIME_TOP_P_DECAY = "runtime_top_p_decay"
RUNTIME_TOP_P_RESET_IDS = "runtime_top_p_reset_ids"
LEN_PENALTY = "len_penalty"
EARLY_STOPPING = "early_stopping"
BEAM_SEARCH_DIVERSITY_RATE = "beam_search_diversity_rate"
STOP = "stop"
STREAMING = "streaming"
PROMPT_TABLE_EXTRA_IDS = "prompt_table_extra_ids"
CROSS_ATTENTION_MASK = "cross_attention_mask"
MROPE_ROTARY_COS_SIN = "mrope_rotary_cos_sin"
MROPE_POSITION_DELTAS = "mrope_position_deltas"
CONTEXT_PHASE_PARAMS = "context_phase_params"
SKIP_CROSS_ATTN_BLOCKS = "skip_cross_attn_blocks"
RETENTION_TOKEN_RANGE_STARTS = "retention_token_range_starts"
RETENTION_TOKEN_RANGE_ENDS = "retention_token_range_ends"
RETENTION_TOKEN_RANGE_PRIORITIES = "retention_token_range_priorities"
RETENTION_TOKEN_RANGE_DURATIONS_MS = "retention_token_range_durations_ms"
RETENTION_DECODE_PRIORITY = "retention_decode_priority"
RETENTION_DECODE_DURATION_MS = "retention_decode_duration_ms"
LOOKAHEAD_WINDOW_SIZE = "lookahead_window_size"
LOOKAHEAD_NGRAM_SIZE = "lookahead_ngram_size"
LOOKAHEAD_VERIFICATION_SET_SIZE = "lookahead_verification_set_size"
OUTPUT_IDS = "output_ids"
SEQUENCE_LENGTH = "sequence_length"
# preprocessing's inputs and outputs, NVIDIA's upper-case names (PRE_, apart from the client's and engine's).
PRE_QUERY = "QUERY"
PRE_DECODER_QUERY = "DECODER_QUERY"
PRE_REQUEST_OUTPUT_LEN = "REQUEST_OUTPUT_LEN"
PRE_BAD_WORDS_DICT = "BAD_WORDS_DICT"
PRE_STOP_WORDS_DICT = "STOP_WORDS_DICT"
PRE_EMBEDDING_BIAS_WORDS = "EMBEDDING_BIAS_WORDS"
PRE_EMBEDDING_BIAS_WEIGHTS = "EMBEDDING_BIAS_WEIGHTS"
PRE_END_ID = "END_ID"
PRE_PAD_ID = "PAD_ID"
PRE_PROMPT_TABLE_EXTRA_ID = "PROMPT_TABLE_EXTRA_ID"
PRE_MESSAGES = "MESSAGES"
PRE_INPUT_ID = "INPUT_ID"
PRE_REQUEST_INPUT_LEN = "REQUEST_INPUT_LEN"
PRE_DECODER_INPUT_ID = "DECODER_INPUT_ID"
PRE_REQUEST_DECODER_INPUT_LEN = "REQUEST_DECODER_INPUT_LEN"
PRE_BAD_WORDS_IDS = "BAD_WORDS_IDS"
PRE_STOP_WORDS_IDS = "STOP_WORDS_IDS"
PRE_EMBEDDING_BIAS = "EMBEDDING_BIAS"
PRE_OUT_END_ID = "OUT_END_ID"
PRE_OUT_PAD_ID = "OUT_PAD_ID"
PRE_OUT_PROMPT_TABLE_EXTRA_IDS = "OUT_PROMPT_TABLE_EXTRA_IDS"
# postprocessing's inputs and output.
POST_TOKENS_BATCH = "TOKENS_BATCH"
POST_SEQUENCE_LENGTH = "SEQUENCE_LENGTH"
POST_OUTPUT = "OUTPUT"
# The ensemble's own tensors, between its steps (private: the wiring below alone names them).
_INPUT_ID = "_INPUT_ID"
_REQUEST_INPUT_LEN = "_REQUEST_INPUT_LEN"
_DECODER_INPUT_ID = "_DECODER_INPUT_ID"
_REQUEST_DECODER_INPUT_LEN = "_REQUEST_DECODER_INPUT_LEN"
_REQUEST_OUTPUT_LEN = "_REQUEST_OUTPUT_LEN"
_STOP_WORDS_IDS = "_STOP_WORDS_IDS"
_BAD_WORDS_IDS = "_BAD_WORDS_IDS"
_EMBEDDING_BIAS = "_EMBEDDING_BIAS"
_PREPROCESSOR_END_ID = "_PREPROCESSOR_END_ID"
_PREPROCESSOR_PAD_ID = "_PREPROCESSOR_PAD_ID"
_OUT_PROMPT_TABLE_EXTRA_IDS = "_OUT_PROMPT_TABLE_EXTRA_IDS"
_TOKENS_BATCH = "_TOKENS_BATCH"
_SEQUENCE_LENGTH = "_SEQUENCE_LENGTH"
_TOP_TOKEN_IDS = "_TOP_TOKEN_IDS"  # ours


# --- the client contract (ensemble) --------------------------------------------------------------------------
# `text_input` is required in NVIDIA's wiring; ours makes it optional so that `messages` can replace it.
MESSAGES_INPUT = _opt(MESSAGES, S, (1,))  # ours: chat messages, rendered with the tokenizer's template
ENSEMBLE_INPUTS = [
    Tensor(TEXT_INPUT, S, (1,)),
    _opt(DECODER_TEXT_INPUT, S, (1,)),
    Tensor(MAX_TOKENS, I32, (1,)),
    _opt(NUM_RETURN_SEQUENCES, I32, (1,)),
    _opt(BAD_WORDS, S, (-1,)),
    _opt(STOP_WORDS, S, (-1,)),
    _opt(EXCLUDE_INPUT_IN_OUTPUT, BOOL, (1,)),
    _opt(END_ID, I32, (1,)),
    _opt(PAD_ID, I32, (1,)),
    _opt(TOP_K, I32, (1,)),
    _opt(TOP_P, F32, (1,)),
    _opt(TEMPERATURE, F32, (1,)),
    _opt(LENGTH_PENALTY, F32, (1,)),
    _opt(REPETITION_PENALTY, F32, (1,)),
    _opt(MIN_TOKENS, I32, (1,)),
    _opt(PRESENCE_PENALTY, F32, (1,)),
    _opt(FREQUENCY_PENALTY, F32, (1,)),
    _opt(SEED, U64, (1,)),
    _opt(RETURN_LOG_PROBS, BOOL, (1,)),
    _opt(RETURN_CONTEXT_LOGITS, BOOL, (1,)),
    _opt(RETURN_GENERATION_LOGITS, BOOL, (1,)),
    _opt(RETURN_PERF_METRICS, BOOL, (1,)),
    _opt(RETURN_NUM_INPUT_TOKENS, BOOL, (1,)),
    _opt(RETURN_NUM_OUTPUT_TOKENS, BOOL, (1,)),
    _opt(BEAM_WIDTH, I32, (1,)),
    _opt(STREAM, BOOL, (1,)),
    _opt(PROMPT_EMBEDDING_TABLE, F16, (-1, -1)),
    _opt(PROMPT_TABLE_EXTRA_ID, U64, (1,)),
    _opt(PROMPT_VOCAB_SIZE, I32, (1,)),
    _opt(EMBEDDING_BIAS_WORDS, S, (-1,)),
    _opt(EMBEDDING_BIAS_WEIGHTS, F32, (-1,)),
    _opt(LORA_TASK_ID, U64, (1,)),
    _opt(LORA_WEIGHTS, F16, (-1, -1), ragged=True),
    _opt(LORA_CONFIG, I32, (-1, 3), ragged=True),
    _opt(GUIDED_DECODING_GUIDE_TYPE, S, (1,), ragged=True),
    _opt(GUIDED_DECODING_GUIDE, S, (1,), ragged=True),
]

# Outputs the engine produces besides tokens, passed straight through the ensemble and the BLS.
ENGINE_PASSTHROUGH_OUTPUTS = [
    Tensor(CUM_LOG_PROBS, F32, (-1,)),
    Tensor(OUTPUT_LOG_PROBS, F32, (-1, -1)),
    Tensor(CONTEXT_LOGITS, LOGITS, (-1, -1)),
    Tensor(GENERATION_LOGITS, LOGITS, (-1, -1, -1)),
    Tensor(BATCH_INDEX, I32, (1,)),
    Tensor(SEQUENCE_INDEX, I32, (1,)),
    Tensor(KV_CACHE_ALLOC_NEW_BLOCKS, I32, (1,)),
    Tensor(KV_CACHE_REUSED_BLOCKS, I32, (1,)),
    Tensor(KV_CACHE_ALLOC_TOTAL_BLOCKS, I32, (1,)),
    Tensor(ARRIVAL_TIME_NS, I64, (1,)),
    Tensor(FIRST_SCHEDULED_TIME_NS, I64, (1,)),
    Tensor(FIRST_TOKEN_TIME_NS, I64, (1,)),
    Tensor(LAST_TOKEN_TIME_NS, I64, (1,)),
    Tensor(ACCEPTANCE_RATE, F32, (1,)),
    Tensor(TOTAL_ACCEPTED_DRAFT_TOKENS, I32, (1,)),
    Tensor(TOTAL_DRAFT_TOKENS, I32, (1,)),
    Tensor(NUM_INPUT_TOKENS, I32, (1,)),
    Tensor(NUM_OUTPUT_TOKENS, I32, (1,)),
]
# NVIDIA's ensemble template lists kv_cache_alloc_total_blocks twice; a typed config lists it once.
CLIENT_OUTPUTS = [Tensor(TEXT_OUTPUT, S, (-1,)), *ENGINE_PASSTHROUGH_OUTPUTS]
# The engine's outputs the BLS passes on to its client as the engine sent them last (its statistics); the log
# probs, the row and sequence indexes and the output token count it makes itself.
BLS_ENGINE_STATISTICS = [tensor.name for tensor in ENGINE_PASSTHROUGH_OUTPUTS
                         if tensor.name not in {CUM_LOG_PROBS, OUTPUT_LOG_PROBS, BATCH_INDEX, SEQUENCE_INDEX,
                                                NUM_OUTPUT_TOKENS}]

# --- tensorrt_llm_bls: the ensemble's client inputs, some reshaped to scalars, plus speculative decoding ------
BLS_SCALAR_INPUTS = {RETURN_LOG_PROBS, RETURN_CONTEXT_LOGITS, RETURN_GENERATION_LOGITS,
                     NUM_RETURN_SEQUENCES, LORA_TASK_ID, RETURN_PERF_METRICS, RETURN_NUM_INPUT_TOKENS,
                     RETURN_NUM_OUTPUT_TOKENS}
BLS_EXTRA_INPUTS = [
    _opt(NUM_DRAFT_TOKENS, I32, (1,)),
    _opt(USE_DRAFT_LOGITS, BOOL, (1,), scalar=True),
]
# Ours: fewer, larger streamed chunks for a client that asks (the OpenAI gateway), left out of NVIDIA's wiring.
STREAM_INTERVAL_INPUT = _opt(STREAM_INTERVAL, I32, (1,))
# Ours, left out of NVIDIA's wiring: per-token log probabilities with their top alternatives (the gateway's
# `logprobs`). The engine answers them as it answers `output_log_probs`, [beams, tokens, k]; the BLS, per
# response, for the tokens that response adds.
BLS_LOG_PROB_INPUTS = [_opt(NUM_TOP_LOG_PROBS, I32, (1,)), _opt(RETURN_PROMPT_LOG_PROBS, BOOL, (1,))]
BLS_LOG_PROB_OUTPUTS = [
    Tensor(TOKEN_IDS, I32, (-1,)),
    Tensor(TOKEN_BYTES, S, (-1,)),
    Tensor(TOKEN_LOG_PROBS, F32, (-1,)),
    Tensor(TOP_TOKEN_IDS, I32, (-1, -1)),
    Tensor(TOP_TOKEN_BYTES, S, (-1, -1)),
    Tensor(TOP_LOG_PROBS, F32, (-1, -1)),
]
ENGINE_LOG_PROB_INPUTS = [_opt(NUM_TOP_LOG_PROBS, I32, (1,), scalar=True),
                          _opt(RETURN_PROMPT_LOG_PROBS, BOOL, (1,), scalar=True)]
ENGINE_TOP_LOG_PROBS = Tensor(TOP_LOG_PROBS, F32, (-1, -1, -1))  # [beams, tokens, k], as the ensemble passes it on
ENGINE_LOG_PROB_OUTPUTS = [Tensor(TOP_TOKEN_IDS, I32, (-1, -1, -1)), ENGINE_TOP_LOG_PROBS,
                           Tensor(PROMPT_LOG_PROBS, F32, (-1,)), Tensor(PROMPT_TOP_TOKEN_IDS, I32, (-1, -1)),
                           Tensor(PROMPT_TOP_LOG_PROBS, F32, (-1, -1))]

# --- preprocessing ---------------------------------------------------------------------------------------------
PREPROCESSING_INPUTS = [
    Tensor(PRE_QUERY, S, (1,)),
    _opt(PRE_DECODER_QUERY, S, (1,)),
    Tensor(PRE_REQUEST_OUTPUT_LEN, I32, (1,)),
    _opt(PRE_BAD_WORDS_DICT, S, (-1,)),
    _opt(PRE_STOP_WORDS_DICT, S, (-1,)),
    _opt(PRE_EMBEDDING_BIAS_WORDS, S, (-1,)),
    _opt(PRE_EMBEDDING_BIAS_WEIGHTS, F32, (-1,)),
    _opt(PRE_END_ID, I32, (1,)),
    _opt(PRE_PAD_ID, I32, (1,)),
    _opt(PRE_PROMPT_TABLE_EXTRA_ID, U64, (1,)),
]
MESSAGES_PREPROCESSING_INPUT = _opt(PRE_MESSAGES, S, (1,))  # ours
PREPROCESSING_OUTPUTS = [
    Tensor(PRE_INPUT_ID, I32, (-1,)),
    Tensor(PRE_REQUEST_INPUT_LEN, I32, (1,)),
    Tensor(PRE_DECODER_INPUT_ID, I32, (-1,)),
    Tensor(PRE_REQUEST_DECODER_INPUT_LEN, I32, (1,)),
    Tensor(PRE_BAD_WORDS_IDS, I32, (2, -1)),
    Tensor(PRE_STOP_WORDS_IDS, I32, (2, -1)),
    Tensor(PRE_EMBEDDING_BIAS, F32, (-1,)),
    Tensor(PRE_REQUEST_OUTPUT_LEN, I32, (-1,)),
    Tensor(PRE_OUT_END_ID, I32, (1,)),
    Tensor(PRE_OUT_PAD_ID, I32, (1,)),
    Tensor(PRE_OUT_PROMPT_TABLE_EXTRA_IDS, U64, (-1,)),
]

# --- tensorrt_llm (the engine step) ----------------------------------------------------------------------------
ENGINE_INPUTS = [
    _opt(INPUT_IDS, I32, (-1,), ragged=True),
    _opt(ENCODER_INPUT_FEATURES, F16, (-1, -1), ragged=True),
    _opt(ENCODER_OUTPUT_LENGTHS, I32, (1,), scalar=True),
    Tensor(INPUT_LENGTHS, I32, (1,), scalar=True),
    Tensor(REQUEST_OUTPUT_LEN, I32, (1,), scalar=True),
    _opt(NUM_RETURN_SEQUENCES, I32, (1,), scalar=True),
    _opt(DRAFT_INPUT_IDS, I32, (-1,), ragged=True),
    _opt(DECODER_INPUT_IDS, I32, (-1,), ragged=True),
    _opt(DECODER_INPUT_LENGTHS, I32, (1,), scalar=True),
    _opt(DRAFT_LOGITS, LOGITS, (-1, -1), ragged=True),
    _opt(DRAFT_ACCEPTANCE_THRESHOLD, F32, (1,), scalar=True),
    _opt(END_ID, I32, (1,), scalar=True),
    _opt(PAD_ID, I32, (1,), scalar=True),
    _opt(STOP_WORDS_LIST, I32, (2, -1), ragged=True),
    _opt(BAD_WORDS_LIST, I32, (2, -1), ragged=True),
    _opt(EMBEDDING_BIAS, F32, (-1,), ragged=True),
    _opt(BEAM_WIDTH, I32, (1,), scalar=True),
    _opt(TEMPERATURE, F32, (1,), scalar=True),
    _opt(RUNTIME_TOP_K, I32, (1,), scalar=True),
    _opt(RUNTIME_TOP_P, F32, (1,), scalar=True),
    _opt(RUNTIME_TOP_P_MIN, F32, (1,), scalar=True),
    _opt(RUNTIME_TOP_P_DECAY, F32, (1,), scalar=True),
    _opt(RUNTIME_TOP_P_RESET_IDS, I32, (1,), scalar=True),
    _opt(LEN_PENALTY, F32, (1,), scalar=True),
    _opt(EARLY_STOPPING, BOOL, (1,), scalar=True),
    _opt(REPETITION_PENALTY, F32, (1,), scalar=True),
    _opt(MIN_TOKENS, I32, (1,), scalar=True),
    _opt(BEAM_SEARCH_DIVERSITY_RATE, F32, (1,), scalar=True),
    _opt(PRESENCE_PENALTY, F32, (1,), scalar=True),
    _opt(FREQUENCY_PENALTY, F32, (1,), scalar=True),
    _opt(SEED, U64, (1,), scalar=True),
    _opt(RETURN_LOG_PROBS, BOOL, (1,), scalar=True),
    _opt(RETURN_CONTEXT_LOGITS, BOOL, (1,), scalar=True),
    _opt(RETURN_GENERATION_LOGITS, BOOL, (1,), scalar=True),
    _opt(RETURN_PERF_METRICS, BOOL, (1,), scalar=True),
    _opt(RETURN_NUM_INPUT_TOKENS, BOOL, (1,), scalar=True),
    _opt(RETURN_NUM_OUTPUT_TOKENS, BOOL, (1,), scalar=True),
    _opt(EXCLUDE_INPUT_IN_OUTPUT, BOOL, (1,), scalar=True),
    _opt(STOP, BOOL, (1,), scalar=True),
    _opt(STREAMING, BOOL, (1,), scalar=True),
    _opt(PROMPT_EMBEDDING_TABLE, F16, (-1, -1), ragged=True),
    _opt(PROMPT_TABLE_EXTRA_IDS, U64, (-1,), ragged=True),
    _opt(PROMPT_VOCAB_SIZE, I32, (1,), scalar=True),
    _opt(CROSS_ATTENTION_MASK, BOOL, (-1, -1), ragged=True),
    _opt(MROPE_ROTARY_COS_SIN, F32, (-1,)),
    _opt(MROPE_POSITION_DELTAS, I64, (1,)),
    _opt(LORA_TASK_ID, U64, (1,), scalar=True),
    _opt(LORA_WEIGHTS, F16, (-1, -1), ragged=True),
    _opt(LORA_CONFIG, I32, (-1, 3), ragged=True),
    _opt(CONTEXT_PHASE_PARAMS, U8, (-1,), ragged=True),
    _opt(SKIP_CROSS_ATTN_BLOCKS, BOOL, (1,), ragged=True),
    _opt(RETENTION_TOKEN_RANGE_STARTS, I32, (-1,), ragged=True),
    _opt(RETENTION_TOKEN_RANGE_ENDS, I32, (-1,), ragged=True),
    _opt(RETENTION_TOKEN_RANGE_PRIORITIES, I32, (-1,), ragged=True),
    _opt(RETENTION_TOKEN_RANGE_DURATIONS_MS, I32, (-1,), ragged=True),
    _opt(RETENTION_DECODE_PRIORITY, I32, (1,), ragged=True),
    _opt(RETENTION_DECODE_DURATION_MS, I32, (1,), ragged=True),
    _opt(GUIDED_DECODING_GUIDE_TYPE, S, (1,), ragged=True),
    _opt(GUIDED_DECODING_GUIDE, S, (1,), ragged=True),
    _opt(LOOKAHEAD_WINDOW_SIZE, I32, (1,), ragged=True),
    _opt(LOOKAHEAD_NGRAM_SIZE, I32, (1,), ragged=True),
    _opt(LOOKAHEAD_VERIFICATION_SET_SIZE, I32, (1,), ragged=True),
]
ENGINE_OUTPUTS = [
    Tensor(OUTPUT_IDS, I32, (-1, -1)),
    Tensor(SEQUENCE_LENGTH, I32, (-1,)),
    *ENGINE_PASSTHROUGH_OUTPUTS[:6],  # log probs, logits, batch and sequence index
    Tensor(CONTEXT_PHASE_PARAMS, U8, (-1,)),
    *ENGINE_PASSTHROUGH_OUTPUTS[6:],  # KV-cache and timing statistics, draft counts, token counts
]



def stop_request_inputs() -> dict[str, np.ndarray]:
    """A request to the engine that stops its running request with the same request id (the tensorrtllm
    backend's `stop`): the required inputs, and `stop`. The engine answers it with an empty final response."""
    return {INPUT_LENGTHS: np.array([[1]], dtype=np.int32), REQUEST_OUTPUT_LEN: np.array([[1]], dtype=np.int32),
            STOP: np.array([[True]])}


# --- postprocessing --------------------------------------------------------------------------------------------
POSTPROCESSING_INPUTS = [Tensor(POST_TOKENS_BATCH, I32, (-1, -1)), Tensor(POST_SEQUENCE_LENGTH, I32, (-1,))]
POSTPROCESSING_OUTPUTS = [Tensor(POST_OUTPUT, S, (-1,))]
# Ours, in our wiring: with the engine's likeliest tokens beside each token (the ensemble's `num_top_log_probs`),
# postprocessing names the response's tokens and those by their bytes, [beams, tokens(, k)], as it decodes them.
POSTPROCESSING_LOG_PROB_INPUTS = [_opt(TOP_TOKEN_IDS, I32, (-1, -1, -1))]
POSTPROCESSING_LOG_PROB_OUTPUTS = [Tensor(TOKEN_BYTES, S, (-1, -1)), Tensor(TOP_TOKEN_BYTES, S, (-1, -1, -1))]

# --- the ensemble's wiring (NVIDIA's, plus `messages`) ---------------------------------------------------------
# preprocessing input → client input
PREPROCESSING_FROM_CLIENT = {
    PRE_QUERY: TEXT_INPUT, PRE_DECODER_QUERY: DECODER_TEXT_INPUT, PRE_REQUEST_OUTPUT_LEN: MAX_TOKENS,
    PRE_BAD_WORDS_DICT: BAD_WORDS, PRE_STOP_WORDS_DICT: STOP_WORDS, PRE_EMBEDDING_BIAS_WORDS: EMBEDDING_BIAS_WORDS,
    PRE_EMBEDDING_BIAS_WEIGHTS: EMBEDDING_BIAS_WEIGHTS, PRE_END_ID: END_ID, PRE_PAD_ID: PAD_ID,
    PRE_PROMPT_TABLE_EXTRA_ID: PROMPT_TABLE_EXTRA_ID,
}
MESSAGES_WIRING = {PRE_MESSAGES: MESSAGES}  # ours
# preprocessing output → ensemble tensor
PREPROCESSING_TO_ENSEMBLE = {
    PRE_REQUEST_INPUT_LEN: _REQUEST_INPUT_LEN, PRE_INPUT_ID: _INPUT_ID,
    PRE_REQUEST_DECODER_INPUT_LEN: _REQUEST_DECODER_INPUT_LEN, PRE_DECODER_INPUT_ID: _DECODER_INPUT_ID,
    PRE_REQUEST_OUTPUT_LEN: _REQUEST_OUTPUT_LEN, PRE_STOP_WORDS_IDS: _STOP_WORDS_IDS,
    PRE_BAD_WORDS_IDS: _BAD_WORDS_IDS, PRE_EMBEDDING_BIAS: _EMBEDDING_BIAS, PRE_OUT_END_ID: _PREPROCESSOR_END_ID,
    PRE_OUT_PAD_ID: _PREPROCESSOR_PAD_ID, PRE_OUT_PROMPT_TABLE_EXTRA_IDS: _OUT_PROMPT_TABLE_EXTRA_IDS,
}
# engine input → ensemble tensor written by preprocessing
ENGINE_FROM_PREPROCESSING = {
    INPUT_IDS: _INPUT_ID, DECODER_INPUT_IDS: _DECODER_INPUT_ID, INPUT_LENGTHS: _REQUEST_INPUT_LEN,
    DECODER_INPUT_LENGTHS: _REQUEST_DECODER_INPUT_LEN, REQUEST_OUTPUT_LEN: _REQUEST_OUTPUT_LEN,
    END_ID: _PREPROCESSOR_END_ID, PAD_ID: _PREPROCESSOR_PAD_ID, EMBEDDING_BIAS: _EMBEDDING_BIAS,
    STOP_WORDS_LIST: _STOP_WORDS_IDS, BAD_WORDS_LIST: _BAD_WORDS_IDS,
    PROMPT_TABLE_EXTRA_IDS: _OUT_PROMPT_TABLE_EXTRA_IDS,
}
# engine input → client input
ENGINE_FROM_CLIENT = {
    EXCLUDE_INPUT_IN_OUTPUT: EXCLUDE_INPUT_IN_OUTPUT, RUNTIME_TOP_K: TOP_K, RUNTIME_TOP_P: TOP_P,
    TEMPERATURE: TEMPERATURE, LEN_PENALTY: LENGTH_PENALTY, REPETITION_PENALTY: REPETITION_PENALTY,
    MIN_TOKENS: MIN_TOKENS, PRESENCE_PENALTY: PRESENCE_PENALTY, FREQUENCY_PENALTY: FREQUENCY_PENALTY,
    SEED: SEED, RETURN_LOG_PROBS: RETURN_LOG_PROBS, RETURN_CONTEXT_LOGITS: RETURN_CONTEXT_LOGITS,
    RETURN_GENERATION_LOGITS: RETURN_GENERATION_LOGITS, RETURN_PERF_METRICS: RETURN_PERF_METRICS,
    RETURN_NUM_INPUT_TOKENS: RETURN_NUM_INPUT_TOKENS, RETURN_NUM_OUTPUT_TOKENS: RETURN_NUM_OUTPUT_TOKENS,
    NUM_RETURN_SEQUENCES: NUM_RETURN_SEQUENCES, BEAM_WIDTH: BEAM_WIDTH, STREAMING: STREAM,
    PROMPT_EMBEDDING_TABLE: PROMPT_EMBEDDING_TABLE, PROMPT_VOCAB_SIZE: PROMPT_VOCAB_SIZE,
    LORA_TASK_ID: LORA_TASK_ID, LORA_WEIGHTS: LORA_WEIGHTS, LORA_CONFIG: LORA_CONFIG,
    GUIDED_DECODING_GUIDE_TYPE: GUIDED_DECODING_GUIDE_TYPE, GUIDED_DECODING_GUIDE: GUIDED_DECODING_GUIDE,
}
ENGINE_TOKEN_OUTPUTS = {OUTPUT_IDS: _TOKENS_BATCH, SEQUENCE_LENGTH: _SEQUENCE_LENGTH}
POSTPROCESSING_FROM_ENSEMBLE = {POST_TOKENS_BATCH: _TOKENS_BATCH, POST_SEQUENCE_LENGTH: _SEQUENCE_LENGTH}
POSTPROCESSING_TO_CLIENT = {POST_OUTPUT: TEXT_OUTPUT}
# Ours, in our wiring: log probabilities through the ensemble. The client's count of alternatives goes to the
# engine step; the engine's `output_log_probs` reaches the client as NVIDIA's wiring has it, its alternatives'
# log probs straight, and their ids through postprocessing, which adds the bytes of every token and alternative.
ENSEMBLE_LOG_PROB_INPUTS = [_opt(NUM_TOP_LOG_PROBS, I32, (1,))]
ENSEMBLE_LOG_PROB_OUTPUTS = [*POSTPROCESSING_LOG_PROB_OUTPUTS, ENGINE_TOP_LOG_PROBS]
ENGINE_LOG_PROBS_FROM_CLIENT = {NUM_TOP_LOG_PROBS: NUM_TOP_LOG_PROBS}
ENGINE_LOG_PROB_OUTPUTS_TO_ENSEMBLE = {TOP_TOKEN_IDS: _TOP_TOKEN_IDS, TOP_LOG_PROBS: TOP_LOG_PROBS}
POSTPROCESSING_LOG_PROBS_FROM_ENSEMBLE = {TOP_TOKEN_IDS: _TOP_TOKEN_IDS}
POSTPROCESSING_LOG_PROBS_TO_CLIENT = {TOKEN_BYTES: TOKEN_BYTES, TOP_TOKEN_BYTES: TOP_TOKEN_BYTES}


# Inputs NVIDIA requires that our wiring declares optional and our models require themselves: Triton 2.51 runs no
# ensemble step whose required input a request left out, and answers that request with an empty success (HTTP
# 200, no text); an optional one reaches preprocessing, which refuses it naming the field (INVALID_ARG).
REQUIRED_BY_THE_MODELS = (MAX_TOKENS, PRE_REQUEST_OUTPUT_LEN)


def _ours(inputs: list[Tensor], chat: Tensor) -> list[Tensor]:
    """NVIDIA's inputs with our chat input after the prompt, which it makes optional (it may replace it), and
    the inputs our models require themselves optional."""
    prompt, *rest = inputs
    rest = [_opt(t.name, t.dtype, t.dims, scalar=t.scalar, ragged=t.ragged) if t.name in REQUIRED_BY_THE_MODELS
            else t for t in rest]
    return [_opt(prompt.name, prompt.dtype, prompt.dims), chat, *rest]


def client_inputs(*, messages: bool) -> list[Tensor]:
    """The client inputs the ensemble and the BLS share: NVIDIA's, and with `messages` our chat input."""
    return _ours(ENSEMBLE_INPUTS, MESSAGES_INPUT) if messages else list(ENSEMBLE_INPUTS)


def ensemble_inputs(*, messages: bool) -> list[Tensor]:
    """The ensemble's inputs: the client's, and with `messages` (our wiring) the top log probabilities' count."""
    return [*client_inputs(messages=messages), *(ENSEMBLE_LOG_PROB_INPUTS if messages else [])]


def ensemble_outputs(*, messages: bool) -> list[Tensor]:
    """The ensemble's outputs: NVIDIA's, and with `messages` the tokens' and alternatives' bytes and log probs."""
    return [*CLIENT_OUTPUTS, *(ENSEMBLE_LOG_PROB_OUTPUTS if messages else [])]


def bls_inputs(*, messages: bool) -> list[Tensor]:
    """The BLS's inputs: the ensemble's with NVIDIA's scalar reshapes, plus speculative decoding, and with
    `messages` our stream interval."""
    inputs = [Tensor(t.name, t.dtype, t.dims, t.optional, scalar=t.name in BLS_SCALAR_INPUTS, ragged=t.ragged)
              for t in client_inputs(messages=messages)]
    return [*inputs, *BLS_EXTRA_INPUTS, *([STREAM_INTERVAL_INPUT, *BLS_LOG_PROB_INPUTS] if messages else [])]


def bls_outputs(*, messages: bool) -> list[Tensor]:
    """The BLS's outputs: the ensemble's, and with `messages` the per-token log probabilities."""
    return [*CLIENT_OUTPUTS, *(BLS_LOG_PROB_OUTPUTS if messages else [])]


def engine_inputs(*, messages: bool) -> list[Tensor]:
    """The engine's inputs: NVIDIA's, and with `messages` (our wiring) the top log probabilities' count."""
    return [*ENGINE_INPUTS, *(ENGINE_LOG_PROB_INPUTS if messages else [])]


def engine_outputs(*, messages: bool) -> list[Tensor]:
    return [*ENGINE_OUTPUTS, *(ENGINE_LOG_PROB_OUTPUTS if messages else [])]


def preprocessing_inputs(*, messages: bool) -> list[Tensor]:
    return _ours(PREPROCESSING_INPUTS, MESSAGES_PREPROCESSING_INPUT) if messages else list(PREPROCESSING_INPUTS)


def postprocessing_inputs(*, messages: bool) -> list[Tensor]:
    return [*POSTPROCESSING_INPUTS, *(POSTPROCESSING_LOG_PROB_INPUTS if messages else [])]


def postprocessing_outputs(*, messages: bool) -> list[Tensor]:
    return [*POSTPROCESSING_OUTPUTS, *(POSTPROCESSING_LOG_PROB_OUTPUTS if messages else [])]


# A client's name for each preprocessing and engine input, for error messages (`top_p`, not `runtime_top_p`).
CLIENT_NAME = {**PREPROCESSING_FROM_CLIENT, **MESSAGES_WIRING, **ENGINE_FROM_CLIENT,
               REQUEST_OUTPUT_LEN: MAX_TOKENS}
