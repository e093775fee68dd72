"""`--engine transformers` (the default): Hugging Face transformers with in-flight batching, in a Python model
(`tensorrt_llm_transformers/`, `runtime/engine/transformers/`), on CPUs or a GPU: CI, demos, small models."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...facts.model_parameters import TransformersEngineParameters
from ..repository import CHECKPOINT_SUBDIR
from . import EngineKind, EnginePlan, Progress

if TYPE_CHECKING:
    from ..options import BuildOptions


def parameters(options: BuildOptions) -> dict[str, str]:
    return TransformersEngineParameters(
        model_path=f"1/{CHECKPOINT_SUBDIR}", max_batch_size=options.max_batch_size,
        max_input_len=options.max_input_len, max_seq_len=options.max_seq_len, dtype=options.dtype,
        device=options.device, exclude_input_in_output=options.serving.exclude_input_in_output,
        stream_interval=options.stream_interval, response_lanes=options.response_lanes).to_config()


def plan(options: BuildOptions, checkpoint_config: dict, progress: Progress) -> EnginePlan:
    return EnginePlan(parameters=parameters(options), serving=options.serving)


KIND = EngineKind(
    name="transformers", summary="Hugging Face transformers with in-flight batching (the embedded default: CPUs, CI, "
    "demos)", model_source="tensorrt_llm_transformers", runtime_room="transformers", plan=plan,
    weight_patterns=("*.safetensors",), serves_checkpoint=True)
