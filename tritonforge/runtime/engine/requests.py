"""The engine model's inputs (the `tensorrt_llm` contract) as per-row generation requests.

Parses exactly the tensors of NVIDIA's `tensorrt_llm` model, so the transformers engine takes the same
requests as the `tensorrtllm` backend. Every error names the field as the client sent it through the ensemble
(`top_p`, not `runtime_top_p`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...facts import contract
from ...facts.errors import RequestError, UnsupportedError
from ..text.tokenization import decode_utf8, from_word_list
from .generation import check_supported
from .guided import GuidedDecoding, guided_decoding
from .sampling import SamplingParams

# Engine input → (SamplingParams field, type).
SAMPLING_INPUTS = {
    contract.TEMPERATURE: ("temperature", float), contract.RUNTIME_TOP_K: ("top_k", int),
    contract.RUNTIME_TOP_P: ("top_p", float), contract.REPETITION_PENALTY: ("repetition_penalty", float),
    contract.PRESENCE_PENALTY: ("presence_penalty", float), contract.FREQUENCY_PENALTY: ("frequency_penalty", float),
    contract.MIN_TOKENS: ("min_tokens", int), contract.SEED: ("seed", int),
}
FLAG_INPUTS = (contract.STREAMING, contract.EXCLUDE_INPUT_IN_OUTPUT, contract.RETURN_LOG_PROBS,
               contract.RETURN_PERF_METRICS, contract.RETURN_NUM_INPUT_TOKENS, contract.RETURN_NUM_OUTPUT_TOKENS,
               contract.RETURN_CONTEXT_LOGITS, contract.RETURN_GENERATION_LOGITS, contract.RETURN_PROMPT_LOG_PROBS)

# Inputs this engine accepts and ignores, as the tensorrtllm backend does for a decoder-only engine or because
# they change only speed or cache retention, never the tokens: decoder inputs (encoder-decoder engines only),
# beam-search-only settings, KV-cache retention hints, lookahead decoding, the draft acceptance threshold
# (drafts themselves are unsupported), and prompt-table ids (they only key cache reuse of prompt-table tokens).
IGNORED_INPUTS = frozenset({
    contract.DECODER_INPUT_IDS, contract.DECODER_INPUT_LENGTHS, contract.ENCODER_OUTPUT_LENGTHS,
    contract.EARLY_STOPPING, contract.BEAM_SEARCH_DIVERSITY_RATE, contract.LEN_PENALTY,
    contract.DRAFT_ACCEPTANCE_THRESHOLD, contract.PROMPT_TABLE_EXTRA_IDS, contract.PROMPT_VOCAB_SIZE,
    contract.RETENTION_TOKEN_RANGE_STARTS, contract.RETENTION_TOKEN_RANGE_ENDS,
    contract.RETENTION_TOKEN_RANGE_PRIORITIES, contract.RETENTION_TOKEN_RANGE_DURATIONS_MS,
    contract.RETENTION_DECODE_PRIORITY, contract.RETENTION_DECODE_DURATION_MS, contract.LOOKAHEAD_WINDOW_SIZE,
    contract.LOOKAHEAD_NGRAM_SIZE, contract.LOOKAHEAD_VERIFICATION_SET_SIZE, contract.PAD_ID,
})
# Inputs that ask for a feature this engine lacks when they hold anything but zeros, empties or false.
FEATURE_INPUTS = {
    contract.ENCODER_INPUT_FEATURES: "encoder-decoder and multimodal engines",
    contract.DRAFT_INPUT_IDS: "speculative decoding", contract.DRAFT_LOGITS: "speculative decoding",
    contract.PROMPT_EMBEDDING_TABLE: "prompt tuning", contract.CROSS_ATTENTION_MASK: "multimodal engines",
    contract.SKIP_CROSS_ATTN_BLOCKS: "multimodal engines", contract.MROPE_ROTARY_COS_SIN: "multimodal engines",
    contract.MROPE_POSITION_DELTAS: "multimodal engines",
    # An adapter's weights sent with a request (NVIDIA's first use of a task id); a built adapter is selected by
    # `lora_task_id` alone (build --lora NAME=PATH).
    contract.LORA_WEIGHTS: "LoRA weights in a request", contract.LORA_CONFIG: "LoRA weights in a request",
    contract.CONTEXT_PHASE_PARAMS: "disaggregated serving",
    contract.RUNTIME_TOP_P_MIN: "top-p decay", contract.RUNTIME_TOP_P_DECAY: "top-p decay",
    contract.RUNTIME_TOP_P_RESET_IDS: "top-p decay",
    contract.RETURN_CONTEXT_LOGITS: "returning logits", contract.RETURN_GENERATION_LOGITS: "returning logits",
}


def _client_name(name: str) -> str:
    return contract.CLIENT_NAME.get(name, name)


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
    num_top_log_probs: int  # ours: the likeliest tokens beside each generated one (0: none)
    return_prompt_log_probs: bool  # ours: the prompt's log probabilities too
    return_perf_metrics: bool
    return_num_input_tokens: bool
    return_num_output_tokens: bool
    embedding_bias: np.ndarray | None  # [vocab] added to the logits, or None
    guided_decoding: GuidedDecoding | None = None  # the grammar the answer must follow, or None
    lora_task_id: int | None = None  # the LoRA adapter the row runs with (None, or 0 given: the base model)


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
    stop = inputs.get(contract.STOP)
    return stop is not None and bool(np.asarray(stop).reshape(-1)[0])


def parse_engine_request(inputs: dict[str, np.ndarray], *, default_exclude_input: bool) -> list[EngineRow]:
    input_ids = inputs.get(contract.INPUT_IDS)
    if input_ids is None:
        raise RequestError(contract.INPUT_IDS, "is required")
    if input_ids.ndim == 1:
        input_ids = input_ids[None, :]
    batch = input_ids.shape[0]
    lengths = _column(inputs, contract.INPUT_LENGTHS, batch)
    if lengths is None:
        raise RequestError(contract.INPUT_LENGTHS, "is required")
    output_lens = _column(inputs, contract.REQUEST_OUTPUT_LEN, batch)
    if output_lens is None:
        raise RequestError(contract.MAX_TOKENS, "is required")
    check_features(inputs)
    columns = {name: _column(inputs, name, batch) for name in (
        contract.END_ID, contract.BEAM_WIDTH, contract.NUM_RETURN_SEQUENCES, contract.NUM_TOP_LOG_PROBS, *FLAG_INPUTS,
        *SAMPLING_INPUTS)}
    guides = _guides(inputs, batch)
    task_ids = inputs.get(contract.LORA_TASK_ID)  # empty: none, as the backend reads it
    tasks = _column(inputs, contract.LORA_TASK_ID, batch) if task_ids is not None and task_ids.size else None

    def value(name, row, default):
        column = columns[name]
        return default if column is None else column[row]

    rows = []
    for row in range(batch):
        length = int(lengths[row])
        if not 0 < length <= input_ids.shape[1]:
            raise RequestError(contract.INPUT_LENGTHS, f"row {row}: {length} is not in [1, {input_ids.shape[1]}]")
        check_supported(beam_width=int(value(contract.BEAM_WIDTH, row, 1)),
                        num_return_sequences=int(value(contract.NUM_RETURN_SEQUENCES, row, 1)))
        sampling = SamplingParams(**{field: cast(columns[name][row]) for name, (field, cast) in SAMPLING_INPUTS.items()
                                     if columns[name] is not None and not _unset(name, columns[name][row])})
        end_id = value(contract.END_ID, row, None)
        rows.append(EngineRow(
            prompt_ids=input_ids[row, :length].astype(np.int64).tolist(),
            max_new_tokens=int(output_lens[row]),
            end_id=None if end_id is None or end_id < 0 else int(end_id),
            sampling=sampling,
            stop_sequences=_word_list(inputs, contract.STOP_WORDS_LIST, row, batch),
            bad_sequences=_word_list(inputs, contract.BAD_WORDS_LIST, row, batch),
            stream=bool(value(contract.STREAMING, row, False)),
            exclude_input=bool(value(contract.EXCLUDE_INPUT_IN_OUTPUT, row, default_exclude_input)),
            return_log_probs=bool(value(contract.RETURN_LOG_PROBS, row, False)),
            num_top_log_probs=int(value(contract.NUM_TOP_LOG_PROBS, row, 0)),
            return_prompt_log_probs=bool(value(contract.RETURN_PROMPT_LOG_PROBS, row, False)),
            return_perf_metrics=bool(value(contract.RETURN_PERF_METRICS, row, False)),
            return_num_input_tokens=bool(value(contract.RETURN_NUM_INPUT_TOKENS, row, False)),
            return_num_output_tokens=bool(value(contract.RETURN_NUM_OUTPUT_TOKENS, row, False)),
            embedding_bias=_embedding_bias(inputs, row, batch),
            guided_decoding=guided_decoding(*guides[row]),
            lora_task_id=(int(tasks[row]) or None) if tasks else None,  # 0: none (a build's start at 1)
        ))
    return rows


def _guides(inputs: dict[str, np.ndarray], batch: int) -> list[tuple[str, str]]:
    """Each row's (guide type, guide) as text, "" where the input is absent."""
    def texts(name: str) -> list[str]:
        value = inputs.get(name)
        if value is None or value.size == 0:
            return [""] * batch
        items = value.reshape(value.shape[0], -1) if value.ndim else value.reshape(1, 1)
        if items.shape != (batch, 1):
            raise RequestError(name, f"must hold one string per row ({batch} rows), got shape {list(value.shape)}")
        return [decode_utf8(name, item) for item in items[:, 0]]

    types = [text.strip() for text in texts(contract.GUIDED_DECODING_GUIDE_TYPE)]
    return list(zip(types, texts(contract.GUIDED_DECODING_GUIDE)))


def _unset(name: str, value) -> bool:
    """The tensorrtllm backend's "not given" values: `runtime_top_p <= 0` (utils.cc,
    getSamplingConfigFromTensors), which NVIDIA's inflight_batcher_llm_client.py sends by default."""
    return name == contract.RUNTIME_TOP_P and value <= 0


def _embedding_bias(inputs: dict[str, np.ndarray], row: int, batch: int) -> np.ndarray | None:
    """One row's dense bias over the vocabulary; an empty tensor means none, as in the backend."""
    value = inputs.get(contract.EMBEDDING_BIAS)
    if value is None or value.size == 0:
        return None
    rows = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(1, -1)
    if rows.shape[0] != batch:
        raise RequestError(contract.EMBEDDING_BIAS, f"has {rows.shape[0]} rows, the request has {batch}")
    bias = rows[row].astype(np.float32)
    if not np.all(np.isfinite(bias)):
        raise RequestError(contract.EMBEDDING_BIAS_WEIGHTS, "must be finite numbers")
    return bias if np.any(bias) else None


def _word_list(inputs: dict[str, np.ndarray], name: str, row: int, batch: int) -> list[list[int]]:
    value = inputs.get(name)
    field = contract.STOP_WORDS if name == contract.STOP_WORDS_LIST else contract.BAD_WORDS
    if value is None or value.size == 0:
        return []
    if value.ndim == 2:
        value = value[None]
    if value.shape[0] != batch:
        raise RequestError(field, f"has {value.shape[0]} rows, the request has {batch}")
    return from_word_list(value[row], field)
