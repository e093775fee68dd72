"""The engine model's inputs (the `tensorrt_llm` contract) as per-row generation requests.

Parses exactly the tensors of NVIDIA's `tensorrt_llm` model, so the transformers engine takes the same
requests as the `tensorrtllm` backend. Every error names the field as the client sent it through the ensemble
(`top_p`, not `runtime_top_p`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import RequestError
from .generation import check_supported
from .model_configs import ENGINE_FROM_CLIENT
from .sampling import SamplingParams
from .tokenization import from_word_list

# Engine input → the name a client uses through the ensemble (its wiring), for error messages.
CLIENT_NAMES = {**ENGINE_FROM_CLIENT, "request_output_len": "max_tokens"}

# Engine input → (SamplingParams field, type).
SAMPLING_INPUTS = {
    "temperature": ("temperature", float), "runtime_top_k": ("top_k", int), "runtime_top_p": ("top_p", float),
    "repetition_penalty": ("repetition_penalty", float), "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float), "min_tokens": ("min_tokens", int), "seed": ("seed", int),
}


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


def _column(inputs: dict[str, np.ndarray], name: str, batch: int) -> list | None:
    value = inputs.get(name)
    if value is None:
        return None
    flat = value.reshape(value.shape[0], -1) if value.ndim else value.reshape(1, 1)
    field = CLIENT_NAMES.get(name, name)
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
    columns = {name: _column(inputs, name, batch) for name in (
        "end_id", "streaming", "exclude_input_in_output", "return_log_probs", "beam_width",
        "num_return_sequences", *SAMPLING_INPUTS)}

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
        sampling = SamplingParams(**{field: cast(columns[name][row])
                                     for name, (field, cast) in SAMPLING_INPUTS.items() if columns[name] is not None})
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
        ))
    return rows


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
