"""`--engine tensorrtllm-pytorch`: TensorRT-LLM's PyTorch workflow (`tensorrt_llm.LLM`) serving the checkpoint
itself, no engine to build, in a Python model (`tensorrt_llm_pytorch/`, `runtime/engine/llmapi/`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from ...facts.contract import ENGINE_MODEL, PREPROCESSING_MODEL
from ...facts.model_parameters import PyTorchEngineParameters
from ...facts.trtllm_lora import trtllm_module
from ...runtime.engine.lora import ADAPTER_CONFIG, AdapterError, records_to_parameter
from .. import trtllm
from ..lora import BuiltAdapter, copy_adapters, manifest_record, plan_adapters
from ..repository import CHECKPOINT_SUBDIR, TOKENIZER_SUBDIR
from . import TENSORRT_LLM_OPTIONS, EngineKind, EnginePlan, Progress

if TYPE_CHECKING:
    from ..options import BuildOptions


def check(options: BuildOptions) -> None:
    for flag, value, allowed in (("--dtype", options.dtype, trtllm.LLMAPI_DTYPES),
                                 ("--kv-cache-dtype", options.kv_cache_dtype, trtllm.LLMAPI_KV_CACHE_DTYPES)):
        if value not in allowed:
            raise ValueError(f"{flag} must be one of {allowed}, got {value!r}")
    if options.quantization != "none":
        raise ValueError(f"--quantization {options.quantization} is for engine builds: the LLM API reads the "
                         f"quantization from the checkpoint (quantize it with ModelOpt first, which writes "
                         f"hf_quant_config.json beside the weights)")
    if options.tp_size < 1 or options.pp_size < 1:
        raise ValueError("--tp-size and --pp-size must be >= 1")
    if not 0 < options.kv_cache_free_gpu_mem_fraction < 1:
        raise ValueError(f"--kv-cache-free-gpu-mem-fraction must be in (0, 1), got "
                         f"{options.kv_cache_free_gpu_mem_fraction}")
    if options.max_num_tokens < options.max_input_len and not options.enable_chunked_context:
        raise ValueError(f"--max-num-tokens ({options.max_num_tokens}) must be >= --max-input-len "
                         f"({options.max_input_len}) unless --chunked-context splits prompts")


def parameters(options: BuildOptions, vocab_size: int,
               adapters: list[BuiltAdapter] | None = None) -> dict[str, str]:
    """The checkpoint, its tokenizer (preprocessing's: the LLM's guided decoding reads it), the `LLM(...)`
    settings and the LoRA adapters the engine hands the LLM."""
    return PyTorchEngineParameters(
        model_path=f"1/{CHECKPOINT_SUBDIR}", tokenizer_dir=f"../{PREPROCESSING_MODEL}/{TOKENIZER_SUBDIR}",
        vocab_size=vocab_size, max_batch_size=options.max_batch_size,
        max_input_len=options.max_input_len, max_seq_len=options.max_seq_len, dtype=options.dtype,
        kv_cache_dtype=options.kv_cache_dtype, tensor_parallel_size=options.tp_size,
        pipeline_parallel_size=options.pp_size,
        kv_cache_free_gpu_memory_fraction=options.kv_cache_free_gpu_mem_fraction,
        max_num_tokens=options.max_num_tokens, enable_block_reuse=options.enable_kv_cache_reuse,
        enable_chunked_prefill=options.enable_chunked_context, stream_interval=options.stream_interval,
        response_lanes=options.response_lanes,
        exclude_input_in_output=options.serving.exclude_input_in_output,
        lora_adapters=records_to_parameter([built.record for built in adapters]) if adapters else "").to_config()


def check_adapters(adapters: list[BuiltAdapter]) -> None:
    """What TensorRT-LLM's loader of PEFT folders (lora_manager.py `load_from_hf`) serves as PEFT does: layers it
    has a LoRA module for, each scaled by lora_alpha over its rank (or its square root with rsLoRA); it reads no
    alpha_pattern, so an adapter whose pattern changes a layer's scale is refused rather than served wrong."""
    for built in adapters:
        name = built.record.name
        for module in built.adapter.target_modules:
            trtllm_module(name, module)
        config = json.loads((built.adapter.folder / ADAPTER_CONFIG).read_text())
        for path, module in built.adapter.modules.items():
            nvidia = config.get("lora_alpha", 8) / (math.sqrt(module.rank) if config.get("use_rslora") else module.rank)
            if not math.isclose(module.scaling, nvidia, rel_tol=1e-6):
                raise AdapterError(f"LoRA adapter {name}: alpha_pattern scales {path} by {module.scaling:g}, and "
                                   f"TensorRT-LLM's LLM API scales every layer by lora_alpha / rank ({nvidia:g}); "
                                   f"serve it with --engine tensorrtllm or transformers")


def plan(options: BuildOptions, checkpoint_config: dict, progress: Progress) -> EnginePlan:
    serving = dataclasses.replace(options.serving, target_triton=options.target_triton or trtllm.TRITON_VERSION)
    adapters = plan_adapters(options.lora, options.model)
    check_adapters(adapters)
    if adapters:
        progress(f"LoRA adapters: {', '.join(f'{b.record.name} (task id {b.record.task_id})' for b in adapters)}")
    return EnginePlan(parameters=parameters(options, checkpoint_config["vocab_size"], adapters), serving=serving,
                      manifest={"tensorrt_llm": trtllm.TRTLLM_VERSION, "image": trtllm.TRITON_IMAGE,
                                **(manifest_record(adapters) if adapters else {})})


def write_engine(options: BuildOptions, checkpoint_config: dict, version_dir: Path, progress: Progress) -> None:
    """The adapters' PEFT folders under tensorrt_llm/1/lora/NAME/, which the LLM loads by path per request."""
    copy_adapters(plan_adapters(options.lora, options.model), version_dir)


def _installed() -> bool:
    spec = importlib.util.find_spec("tensorrt_llm")
    return spec is not None and spec.origin is not None  # None origin: a bare folder of that name


def serving_ranks(repository: Path, build: dict) -> int:
    """TensorRT-LLM must be importable by the engine's stub, which runs this interpreter with the model's version
    folder first on its path; the LLM API starts its own ranks, so the server is one process."""
    if not _installed() and not (repository / ENGINE_MODEL / "1" / "tensorrt_llm" / "__init__.py").is_file():
        raise trtllm.TensorRTLLMMissing(
            f"{repository} runs the tensorrtllm-pytorch engine, and TensorRT-LLM is not installed here: serve it in "
            f"{trtllm.TRITON_IMAGE} (TensorRT-LLM {trtllm.TRTLLM_VERSION}), or build with --engine transformers")
    return 1


def check_installed() -> None:
    if not _installed():
        raise trtllm.TensorRTLLMMissing(
            f"--engine tensorrtllm-pytorch serves through TensorRT-LLM, which is not installed here: serve the "
            f"checkpoint in {trtllm.TRITON_IMAGE} (TensorRT-LLM {trtllm.TRTLLM_VERSION}), or here with --engine "
            f"transformers")


KIND = EngineKind(
    name="tensorrtllm-pytorch", summary="TensorRT-LLM's PyTorch workflow (the LLM API): the checkpoint served with "
    "no engine build", model_source="tensorrt_llm_pytorch", runtime_room="llmapi", plan=plan, check=check,
    write_engine=write_engine, serving_ranks=serving_ranks, check_installed=check_installed,
    weight_patterns=("*.safetensors",), needs_vocab_size=True, serves_checkpoint=True,
    own_options=(*TENSORRT_LLM_OPTIONS, "lora"))
