"""The engine model's inputs (the `tensorrt_llm` contract) as per-row generation requests.

Parses exactly the tensors of NVIDIA's `tensorrt_llm` model, so the transformers engine takes the same
requests as the `tensorrtllm` backend. Every error names the field as the client sent it through the ensemble
(`top_p`, not `runtime_top_p`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec.contract import CLIENT_NAME
from ..spec.errors import RequestError, UnsupportedError
from .generation import check_supported
from .sampling import SamplingParams
from .tokenization import from_word_list

# Engine input → (SamplingParams field, type).
SAMPLING_INPUTS = {
    "temperature": ("temperature", float), "runtime_top_k": ("top_k", int), "runtime_top_p": ("top_p", float),
    "repetition_penalty": ("repetition_penalty", float), "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float), "min_tokens": ("min_tokens", int), "seed": ("seed", int),
}
FLAG_INPUTS = ("streaming", "exclude_input_in_output", "return_log_probs", "return_perf_metrics",
               "return_num_input_tokens", "return_num_output_tokens", "return_context_logits",
               "return_generation_logits")

# Inputs this engine accepts and ignores, as the tensorrtllm backend does for a decoder-only engine or because
# they change only speed or cache retention, never the tokens: decoder inputs (encoder-decoder engines only),
# beam-search-only settings, KV-cache retention hints, lookahead decoding, the draft acceptance threshold
# (drafts themselves are unsupported), and prompt-table ids (they only key cache reuse of prompt-table tokens).
IGNORED_INPUTS = frozenset({
    "decoder_input_ids", "decoder_input_lengths", "encoder_output_lengths", "early_stopping",
    "beam_search_diversity_rate", "len_penalty", "draft_acceptance_threshold", "prompt_table_extra_ids",
    "prompt_vocab_size", "retention_token_range_starts", "retention_token_range_ends",
    "retention_token_range_priorities", "retention_token_range_durations_ms", "retention_decode_priority",
    "retention_decode_duration_ms", "lookahead_window_size", "lookahead_ngram_size",
    "lookahead_verification_set_size", "pad_id",
})
# Inputs that ask for a feature this engine lacks when they hold anything but zeros, empties or false.
FEATURE_INPUTS = {
    "encoder_input_features": "encoder-decoder and multimodal engines",
    "draft_input_ids": "speculative decoding", "draft_logits": "speculative decoding",
    "prompt_embedding_table": "prompt tuning", "cross_attention_mask": "multimodal engines",
    "skip_cross_attn_blocks": "multimodal engines", "mrope_rotary_cos_sin": "multimodal engines",
    "mrope_position_deltas": "multimodal engines", "lora_task_id": "LoRA", "lora_weights": "LoRA",
    "lora_config": "LoRA", "context_phase_params": "disaggregated serving",
    "guided_decoding_guide_type": "guided decoding", "guided_decoding_guide": "guided decoding",
    "runtime_top_p_min": "top-p decay", "runtime_top_p_decay": "top-p decay", "runtime_top_p_reset_ids": "top-p decay",
    "return_context_logits": "returning logits", "return_generation_logits": "returning logits",
}


def _client_name(name: str) -> str:
    return CLIENT_NAME.get(name, name)


def _asks_for(value: np.ndarray) -> bool:
    """Whether an input asks for its feature: anything but zeros, empty strings, false or an empty tensor."""
    if value.size == 0:
        return False
    if value.dtype == object or value.dtype.kind in "SU":
        return any(bytes(item) if not isinstance(item, str) else item for item in value.reshape(-1))
    return bool(np.any(value))


def check_features(inputs: dict[str, np.ndarray]) -> None:
    """UNSUPPORTED, naming the input, when a request really asks for a feature this engine lacks."""
    for name, feature in FEATURE_INPUTS.items():
        value = inputs.get(name)
        if value is not None and _asks_for(value):
            raise UnsupportedError(_client_name(name), f"{feature} is not supported by this engine; use the "
                                                       f"TensorRT-LLM engine")


@dataclass(frozen=True, kw_only=True)
class EngineRow:
    """One row of an engine request, ready for `GenerationRequest`."""

    prompt_ids: list[int]
    max_new_tokens: int
    end_id: int | None
    sampling: SamplingParams
    stop_sequences: list[list[int]]
    bad_sequences: list[list[int]]
    stream: bool
    exclude_input: bool
    return_log_probs: bool
    return_perf_metrics: bool
    return_num_input_tokens: bool
    return_num_output_tokens: bool
    embedding_bias: np.ndarray | None  # [vocab] added to the logits, or None


def _column(inputs: dict[str, np.ndarray], name: str, batch: int) -> list | None:
    value = inputs.get(name)
    if value is None:
        return None
    flat = value.reshape(value.shape[0], -1) if value.ndim else value.reshape(1, 1)
    field = _client_name(name)
    if flat.shape[0] != batch or flat.shape[1] != 1:
        raise RequestError(field, f"must hold one value per row ({batch} rows), got shape {list(value.shape)}")
    return [item.item() for item in flat[:, 0]]


def is_stop_request(inputs: dict[str, np.ndarray]) -> bool:
    stop = inputs.get("stop")
    return stop is not None and bool(np.asarray(stop).reshape(-1)[0])


def parse_engine_request(inputs: dict[str, np.ndarray], *, default_exclude_input: bool) -> list[EngineRow]:
    input_ids = inputs.get("input_ids")
    if input_ids is None:
        raise RequestError("input_ids", "is required")
    if input_ids.ndim == 1:
        input_ids = input_ids[None, :]
    batch = input_ids.shape[0]
    lengths = _column(inputs, "input_lengths", batch)
    if lengths is None:
        raise RequestError("input_lengths", "is required")
    output_lens = _column(inputs, "request_output_len", batch)
    if output_lens is None:
        raise RequestError("max_tokens", "is required")
    check_features(inputs)
    columns = {name: _column(inputs, name, batch) for name in (
        "end_id", "beam_width", "num_return_sequences", *FLAG_INPUTS, *SAMPLING_INPUTS)}

    def value(name, row, default):
        column = columns[name]
        return default if column is None else column[row]

    rows = []
    for row in range(batch):
        length = int(lengths[row])
        if not 0 < length <= input_ids.shape[1]:
            raise RequestError("input_lengths", f"row {row}: {length} is not in [1, {input_ids.shape[1]}]")
        check_supported(beam_width=int(value("beam_width", row, 1)),
                        num_return_sequences=int(value("num_return_sequences", row, 1)))
        sampling = SamplingParams(**{field: cast(columns[name][row]) for name, (field, cast) in SAMPLING_INPUTS.items()
                                     if columns[name] is not None and not _unset(name, columns[name][row])})
        end_id = value("end_id", row, None)
        rows.append(EngineRow(
            prompt_ids=input_ids[row, :length].astype(np.int64).tolist(),
            max_new_tokens=int(output_lens[row]),
            end_id=None if end_id is None or end_id < 0 else int(end_id),
            sampling=sampling,
            stop_sequences=_word_list(inputs, "stop_words_list", row, batch),
            bad_sequences=_word_list(inputs, "bad_words_list", row, batch),
            stream=bool(value("streaming", row, False)),
            exclude_input=bool(value("exclude_input_in_output", row, default_exclude_input)),
            return_log_probs=bool(value("return_log_probs", row, False)),
            return_perf_metrics=bool(value("return_perf_metrics", row, False)),
            return_num_input_tokens=bool(value("return_num_input_tokens", row, False)),
            return_num_output_tokens=bool(value("return_num_output_tokens", row, False)),
            embedding_bias=_embedding_bias(inputs, row, batch),
        ))
    return rows


def _unset(name: str, value) -> bool:
    """The tensorrtllm backend's "not given" values: `runtime_top_p <= 0` (utils.cc,
    getSamplingConfigFromTensors), which NVIDIA's inflight_batcher_llm_client.py sends by default."""
    return name == "runtime_top_p" and value <= 0


def _embedding_bias(inputs: dict[str, np.ndarray], row: int, batch: int) -> np.ndarray | None:
    """One row's dense bias over the vocabulary; an empty tensor means none, as in the backend."""
    value = inputs.get("embedding_bias")
    if value is None or value.size == 0:
        return None
    rows = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(1, -1)
    if rows.shape[0] != batch:
        raise RequestError("embedding_bias", f"has {rows.shape[0]} rows, the request has {batch}")
    bias = rows[row].astype(np.float32)
    if not np.all(np.isfinite(bias)):
        raise RequestError("embedding_bias_weights", "must be finite numbers")
    return bias if np.any(bias) else None


def _word_list(inputs: dict[str, np.ndarray], name: str, row: int, batch: int) -> list[list[int]]:
    value = inputs.get(name)
    field = "stop_words" if name == "stop_words_list" else "bad_words"
    if value is None or value.size == 0:
        return []
    if value.ndim == 2:
        value = value[None]
    if value.shape[0] != batch:
        raise RequestError(field, f"has {value.shape[0]} rows, the request has {batch}")
    return from_word_list(value[row], field)
