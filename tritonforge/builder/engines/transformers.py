"""`--engine transformers` (the default): Hugging Face transformers with in-flight batching, in a Python model
(`tensorrt_llm_transformers/`, `runtime/engine/transformers/`), on CPUs or GPUs: CI, demos, small models.

`--gpus N` runs one engine instance per GPU (Triton's KIND_GPU instances, each with its own batch), `--tp-size T`
splits one engine's weights over T devices (torch.distributed ranks that the engine model starts); together, N/T
instances of T GPUs each (docs/design/transformers-engine.md#several-gpus)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from ...facts.contract import PREPROCESSING_MODEL
from ...facts.model_parameters import TransformersEngineParameters
from ...runtime.engine.lora import records_to_parameter
from .. import trtllm
from ..lora import BuiltAdapter, copy_adapters, manifest_record, plan_adapters
from ..planner import frontend_instances
from ..repository import CHECKPOINT_SUBDIR, TOKENIZER_SUBDIR
from . import EngineKind, EnginePlan, Progress

if TYPE_CHECKING:
    from ..options import BuildOptions


def parameters(options: BuildOptions, adapters: list[BuiltAdapter]) -> dict[str, str]:
    return TransformersEngineParameters(
        model_path=f"1/{CHECKPOINT_SUBDIR}", tokenizer_dir=f"../{PREPROCESSING_MODEL}/{TOKENIZER_SUBDIR}",
        max_batch_size=options.max_batch_size,
        max_input_len=options.max_input_len, max_seq_len=options.max_seq_len, dtype=options.dtype,
        device=options.device, exclude_input_in_output=options.serving.exclude_input_in_output,
        stream_interval=options.stream_interval, response_lanes=options.response_lanes,
        tensor_parallel_size=options.tp_size,
        lora_adapters=records_to_parameter([built.record for built in adapters]) if adapters else "").to_config()


def check(options: BuildOptions) -> None:
    if options.gpus < 0:
        raise ValueError(f"--gpus must be >= 0, got {options.gpus}")
    if options.tp_size < 1:
        raise ValueError(f"--tp-size must be >= 1, got {options.tp_size}")
    if options.gpus and options.device == "cpu":
        raise ValueError(f"--gpus {options.gpus} places the engine on GPUs: it cannot run with --device cpu")
    if options.lora and options.tp_size > 1:
        raise ValueError(f"--lora with --tp-size {options.tp_size}: the transformers engine applies adapters on "
                         f"one GPU's weights only (--tp-size 1)")
    if options.gpus % options.tp_size:
        raise ValueError(f"--gpus {options.gpus} must be a multiple of --tp-size {options.tp_size}: each engine "
                         f"instance takes {options.tp_size} GPUs")


def check_parallelism(options: BuildOptions, checkpoint_config: dict, progress: Progress) -> None:
    """What only the checkpoint and the machine tell: heads that split over --tp-size, a model transformers has
    a tensor-parallel plan for, and enough GPUs (where this machine has any; else said and planned anyway)."""
    tp = options.tp_size
    if tp > 1:
        heads = checkpoint_config.get("num_attention_heads")
        kv_heads = checkpoint_config.get("num_key_value_heads") or heads
        for name, count in (("attention heads", heads), ("key-value heads", kv_heads)):
            if count and count % tp:
                raise ValueError(f"--tp-size {tp} must divide the model's {count} {name}: each rank holds an equal "
                                 f"share of them")
        if _tensor_parallel_plan(options) is None:
            raise ValueError(f"--tp-size {tp}: transformers has no tensor-parallel plan for "
                             f"{checkpoint_config.get('model_type', 'this model')} (its config's base_model_tp_plan)")
    needed = options.gpus or (tp if tp > 1 and options.device != "cpu" else 0)
    if not needed:
        return
    visible = trtllm.visible_gpus()
    if visible is None:
        progress(f"no GPU visible here: planned for {needed} GPUs without checking that the server's machine has "
                 f"them")
    elif needed > visible:
        what = f"--gpus {options.gpus}" if options.gpus else f"--tp-size {tp}"
        raise ValueError(f"{what} needs {needed} GPUs; this machine shows {visible}")


def _tensor_parallel_plan(options: BuildOptions) -> dict | None:
    from transformers import AutoConfig  # its configuration classes need no torch

    return AutoConfig.from_pretrained(options.model, trust_remote_code=False).base_model_tp_plan


def plan(options: BuildOptions, checkpoint_config: dict, progress: Progress) -> EnginePlan:
    check_parallelism(options, checkpoint_config, progress)
    serving = options.serving
    if options.gpus:
        # Each instance's first GPU; its tensor-parallel ranks take the GPUs after it.
        first_gpus = tuple(range(0, options.gpus, options.tp_size))
        serving = dataclasses.replace(serving, engine_gpus=first_gpus)
        concurrency = len(first_gpus) * options.max_batch_size  # the batch is each instance's own
        if options.planned_instances:
            serving = dataclasses.replace(serving, **frontend_instances(concurrency),
                                          bls_max_concurrency=2 * concurrency)
        progress(f"{len(first_gpus)} engine instances of {options.tp_size} GPU(s), {options.max_batch_size} sequences "
                 f"each ({concurrency} in all); preprocessing / postprocessing / BLS instances "
                 f"{serving.preprocessing_instances} / {serving.postprocessing_instances} / {serving.bls_instances}")
    adapters = plan_adapters(options.lora, options.model)
    if adapters:
        progress(f"LoRA adapters: {', '.join(f'{b.record.name} (task id {b.record.task_id})' for b in adapters)}")
    return EnginePlan(parameters=parameters(options, adapters), serving=serving, manifest=manifest_record(adapters))


def write_engine(options: BuildOptions, checkpoint_config: dict, version_dir: Path, progress: Progress) -> None:
    copy_adapters(plan_adapters(options.lora, options.model), version_dir)


KIND = EngineKind(
    name="transformers", summary="Hugging Face transformers with in-flight batching (the embedded default: CPUs, CI, "
    "demos)", model_source="tensorrt_llm_transformers", runtime_room="transformers", plan=plan, check=check,
    write_engine=write_engine, weight_patterns=("*.safetensors",), serves_checkpoint=True,
    own_options=("gpus", "tp_size", "lora"))
