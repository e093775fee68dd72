"""`--engine tensorrtllm`: NVIDIA's TensorRT-LLM C++ backend serving an engine this build converts and builds
(TensorRT-LLM up to 1.2.x; the commands in `builder/trtllm.py`). The build plans the GPU's memory, prints the
exact commands, and runs them unless --dry-run; the backend reads every key of NVIDIA's template."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ...facts.contract import PREPROCESSING_MODEL
from ...facts.model_parameters import CANCELLATION_CHECK_PERIOD_MS
from ...runtime.engine.lora import checkpoint_shapes
from .. import trtllm, trtllm_lora
from ..lora import LORA_SUBDIR, BuiltAdapter, manifest_record, plan_adapters
from ..model_configs import ENGINE_MODEL
from ..planner import ModelShape, plan_memory
from ..repository import ENGINE_SUBDIR, TOKENIZER_SUBDIR
from . import TENSORRT_LLM_OPTIONS, EngineKind, EnginePlan, Progress

if TYPE_CHECKING:
    from ..options import BuildOptions

BACKEND = "tensorrtllm"


def check(options: BuildOptions) -> None:
    def one_of(flag: str, value, allowed) -> None:
        if value not in allowed:
            raise ValueError(f"{flag} must be one of {allowed}, got {value!r}")

    if options.stream_interval > 1:
        raise ValueError("--stream-interval: the tensorrtllm backend streams one response per token and has no "
                         "such setting; it is for the transformers and replay engines")
    one_of("--quantization", options.quantization, trtllm.QUANTIZATIONS)
    one_of("--kv-cache-dtype", options.kv_cache_dtype, trtllm.KV_CACHE_DTYPES)
    one_of("--batch-scheduler-policy", options.batch_scheduler_policy, trtllm.BATCH_SCHEDULER_POLICIES)
    one_of("--dtype", options.dtype, ("auto", "float16", "bfloat16"))
    if options.quantization in trtllm.CALIBRATED and not options.calib_dataset:
        raise ValueError(f"--quantization {options.quantization} calibrates on a dataset: pass --calib-dataset DIR, "
                         f"a local folder that datasets.load_dataset reads with a 'train' split and a 'text' "
                         f"column (e.g. one train.jsonl of {{\"text\": ...}} lines); the scripts' default "
                         f"downloads cnn_dailymail from the hub")
    if options.tp_size < 1 or options.pp_size < 1:
        raise ValueError("--tp-size and --pp-size must be >= 1")
    if options.max_num_tokens < options.max_input_len and not options.enable_chunked_context:
        raise ValueError(f"--max-num-tokens ({options.max_num_tokens}) must be >= --max-input-len "
                         f"({options.max_input_len}) unless --chunked-context splits prompts")


def parameters(options: BuildOptions, guided_decoding: bool = True,
               lora: dict[str, str] | None = None) -> dict[str, str]:
    """Every key of NVIDIA's `tensorrt_llm/config.pbtxt` template (`trtllm.BACKEND_PARAMETER_KEYS`), explicit.

    "" is what the backend treats as unset: it then takes its own default. The KV cache is sized by
    `kv_cache_free_gpu_mem_fraction` alone (`max_tokens_in_paged_kv_cache` unset), so the engine gets all
    the memory the fraction gives; the build's memory plan only checks that one max-length sequence fits.
    `guided_decoding`: xgrammar guides requests, from the tokenizer file `write_engine` writes (the C++ backend
    ignores `tokenizer_dir`, logging so; NVIDIA's Python engine model reads it instead). `lora`: the `lora_*` keys
    of a build with adapters (`lora_parameters`).
    """
    def flag(value: bool) -> str:
        return "true" if value else "false"

    ours = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": f"{options.repository_mount}/{ENGINE_MODEL}/1/{ENGINE_SUBDIR}",
        "max_beam_width": "1",
        "batch_scheduler_policy": options.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": str(options.kv_cache_free_gpu_mem_fraction),
        "max_attention_window_size": str(options.max_seq_len),
        "enable_kv_cache_reuse": flag(options.enable_kv_cache_reuse),
        "enable_chunked_context": flag(options.enable_chunked_context),
        "exclude_input_in_output": flag(options.serving.exclude_input_in_output),
        "cancellation_check_period_ms": str(CANCELLATION_CHECK_PERIOD_MS),
        "stats_check_period_ms": "100",
        "normalize_log_probs": "true",
        "decoding_mode": "top_k_top_p",
        "cuda_graph_mode": flag(options.cuda_graphs),
        "cuda_graph_cache_size": "8" if options.cuda_graphs else "0",
        "multi_block_mode": "true",
        "enable_context_fmha_fp32_acc": "false",
        "kv_cache_host_memory_bytes": "0",
        "executor_worker_path": trtllm.EXECUTOR_WORKER_PATH,
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
    }
    if guided_decoding:
        ours.update({
            "guided_decoding_backend": trtllm.GUIDED_DECODING_BACKEND,
            "xgrammar_tokenizer_info_path": f"{options.repository_mount}/{ENGINE_MODEL}/1/"
                                            f"{trtllm.XGRAMMAR_TOKENIZER_INFO}",
            "tokenizer_dir": f"{options.repository_mount}/{PREPROCESSING_MODEL}/{TOKENIZER_SUBDIR}",
        })
    ours.update(lora or {})
    unknown = set(ours) - set(trtllm.BACKEND_PARAMETER_KEYS)
    if unknown:
        raise ValueError(f"not parameters of the tensorrtllm backend {trtllm.TRTLLM_VERSION}: {sorted(unknown)}")
    return {key: ours.get(key, "") for key in trtllm.BACKEND_PARAMETER_KEYS}


def target_triton_note(target: tuple[int, int]) -> str:
    """What the configs are for, and, for a container of another TensorRT-LLM than the pin, where to build the
    engine: an engine loads only under the TensorRT-LLM that built it (the serve-time check says so)."""
    version = f"{target[0]}.{target[1]}"
    container = trtllm.container_of(target)
    if container is None:
        return f"configs for Triton {version}"
    tag, release = container
    note = f"configs for Triton {version} (container {tag}, TensorRT-LLM {release})"
    if release != trtllm.TRTLLM_VERSION:
        note += (f": build the engine inside that container, not this image's TensorRT-LLM "
                 f"{trtllm.TRTLLM_VERSION}, whose engine it cannot load")
    return note


def _gpu_memory_gib(options: BuildOptions) -> float:
    if options.gpu_memory_gib:
        return options.gpu_memory_gib
    memory = trtllm.gpu_memory_gib()
    if memory is None:
        raise ValueError("no GPU visible to plan the KV cache: pass --gpu-memory-gib (e.g. 79.6 for an H100 80GB, "
                         "140 for an H200)")
    return memory


def build_spec(options: BuildOptions, checkpoint_config: dict,
               adapters: list[BuiltAdapter] | None = None) -> trtllm.TrtBuildSpec:
    """The engine build of these options: paths beside the output, dtype resolved from the checkpoint, the LoRA
    plugin's modules and rank from the adapters (`options.lora`'s, read here unless given)."""
    dtype = options.dtype if options.dtype != "auto" else (
        "bfloat16" if checkpoint_config.get("torch_dtype", checkpoint_config.get("dtype")) == "bfloat16"
        else "float16")
    lora = trtllm_lora.engine_lora(plan_adapters(options.lora, options.model) if adapters is None else adapters)
    if lora is not None:
        trtllm_lora.check_dtype(dtype)
    return trtllm.TrtBuildSpec(
        checkpoint=options.model.resolve(), work_dir=(options.output.parent / f"{options.output.name}.build").resolve(),
        engine_dir=(options.output / ENGINE_MODEL / "1" / ENGINE_SUBDIR).resolve(),
        architecture=(checkpoint_config.get("architectures") or ["LlamaForCausalLM"])[0], dtype=dtype,
        tp_size=options.tp_size, pp_size=options.pp_size, quantization=options.quantization,
        kv_cache_dtype=options.kv_cache_dtype, max_batch_size=options.max_batch_size,
        max_input_len=options.max_input_len, max_seq_len=options.max_seq_len, max_num_tokens=options.max_num_tokens,
        examples_dir=options.examples_dir, calib_dataset=options.calib_dataset,
        lora_target_modules=lora.target_modules if lora else (), max_lora_rank=lora.max_rank if lora else 0)


def lora_parameters(options: BuildOptions, checkpoint_config: dict, spec: trtllm.TrtBuildSpec,
                    adapters: list[BuiltAdapter]) -> dict[str, str]:
    """The backend's `lora_*` keys: the prefetch folder `write_engine` fills, and the cache sized for the adapters."""
    if not adapters:
        return {}
    lora = trtllm_lora.EngineLora(target_modules=spec.lora_target_modules, max_rank=spec.max_lora_rank)
    return trtllm_lora.cache_parameters(
        adapters, lora, prefetch_dir=f"{options.repository_mount}/{ENGINE_MODEL}/1/{LORA_SUBDIR}",
        base_shapes=checkpoint_shapes(options.model), num_layers=int(checkpoint_config["num_hidden_layers"]),
        tp_size=options.tp_size, pp_size=options.pp_size, dtype=spec.dtype)


def _tokenizer_info(options: BuildOptions) -> dict | None:
    from ...runtime.text.tokenization import load_tokenizer

    return trtllm.xgrammar_tokenizer_info(load_tokenizer(options.model))


def plan(options: BuildOptions, checkpoint_config: dict, progress: Progress) -> EnginePlan:
    """The memory plan and the exact commands, printed; TensorRT-LLM required unless --dry-run (checked first: a
    build that cannot run asks for nothing else)."""
    if not options.dry_run:
        trtllm.require_trtllm()
    adapters = plan_adapters(options.lora, options.model)
    spec = build_spec(options, checkpoint_config, adapters)
    lora = lora_parameters(options, checkpoint_config, spec, adapters)
    guided_decoding = _tokenizer_info(options) is not None
    if not guided_decoding:
        progress("guided decoding off: the checkpoint's tokenizer has no fast (tokenizer.json) form, which the "
                 "backend's xgrammar reads")
    gpu_memory_gib = _gpu_memory_gib(options)
    memory = plan_memory(ModelShape.from_hf_config(checkpoint_config), gpu_memory_gib=gpu_memory_gib,
                         dtype=spec.dtype, quantization=options.quantization, kv_cache_dtype=options.kv_cache_dtype,
                         tp_size=options.tp_size, pp_size=options.pp_size, max_seq_len=options.max_seq_len,
                         max_batch_size=options.max_batch_size,
                         kv_cache_free_gpu_mem_fraction=options.kv_cache_free_gpu_mem_fraction)
    progress(f"memory plan (tp={options.tp_size}, pp={options.pp_size}, {spec.dtype}, quantization "
             f"{options.quantization}, KV {options.kv_cache_dtype}):")
    progress(memory.table(gpu_memory_gib=gpu_memory_gib, fraction=options.kv_cache_free_gpu_mem_fraction,
                          max_seq_len=options.max_seq_len, max_batch_size=options.max_batch_size))
    commands = [trtllm.convert_command(spec), trtllm.build_command(spec)]
    progress("commands:")
    for command in commands:
        progress("  " + " ".join(command))
    serving = dataclasses.replace(options.serving, target_triton=options.target_triton or trtllm.TRITON_VERSION)
    progress(target_triton_note(serving.target_triton))
    if adapters:
        progress(f"LoRA adapters (rank <= {spec.max_lora_rank}, modules {' '.join(spec.lora_target_modules)}): "
                 + ", ".join(f"{b.record.name} (task id {b.record.task_id})" for b in adapters))
    if options.planned_instances:
        serving = dataclasses.replace(serving, preprocessing_instances=memory.preprocessing_instances,
                                      postprocessing_instances=memory.postprocessing_instances,
                                      bls_instances=memory.bls_instances,
                                      bls_max_concurrency=memory.bls_max_concurrency,
                                      max_queue_size=options.serving.max_queue_size or memory.max_queue_size)
    record = {"memory_plan": dataclasses.asdict(memory), "commands": commands,
              "tensorrt_llm": trtllm.TRTLLM_VERSION, "image": trtllm.TRITON_IMAGE, "dry_run": options.dry_run,
              **(manifest_record(adapters) if adapters else {})}
    return EnginePlan(parameters=parameters(options, guided_decoding, lora), serving=serving, backend=BACKEND,
                      manifest=record)


def write_engine(options: BuildOptions, checkpoint_config: dict, version_dir: Path, progress: Progress) -> None:
    """The tokenizer file of guided decoding and the adapters' LoRA tensors (a dry run's configs name them too);
    then convert (or quantize) and build the engine into tensorrt_llm/1/engine, unless --dry-run."""
    info = _tokenizer_info(options)
    if info is not None:
        (version_dir / trtllm.XGRAMMAR_TOKENIZER_INFO).write_text(json.dumps(info))
    adapters = plan_adapters(options.lora, options.model)
    if adapters:
        folder = trtllm_lora.write_prefetch(adapters, version_dir,
                                            build_spec(options, checkpoint_config, adapters).dtype)
        progress(f"LoRA tensors of {len(adapters)} adapter(s) in {folder}")
    if options.dry_run:
        return
    spec = build_spec(options, checkpoint_config)
    commands = [trtllm.convert_command(spec), trtllm.build_command(spec)]
    spec.work_dir.mkdir(parents=True, exist_ok=True)
    spec.engine_dir.mkdir(parents=True, exist_ok=True)
    progress(f"building the engine (minutes to an hour; log: {spec.work_dir / 'build.log'})")
    trtllm.run_build(spec, spec.work_dir / "build.log", progress)
    trtllm.write_engine_info(spec, commands, trtllm.runtime_facts())


def serving_ranks(repository: Path, build: dict) -> int:
    """The engine must have been built for this GPU and release; one tritonserver per MPI rank."""
    world_size = int(build.get("tp_size", 1)) * int(build.get("pp_size", 1))
    trtllm.check_engine(repository / ENGINE_MODEL / "1" / ENGINE_SUBDIR, trtllm.runtime_facts(), world_size)
    return world_size


KIND = EngineKind(
    name="tensorrtllm", summary="NVIDIA's TensorRT-LLM backend serving an engine this build makes (TensorRT-LLM up "
    "to 1.2.x)", model_source=None, runtime_room=None, plan=plan, check=check, write_engine=write_engine,
    serving_ranks=serving_ranks, check_installed=trtllm.require_trtllm, machine_facts=trtllm.runtime_facts,
    weight_patterns=("*.safetensors", "*.bin"),
    own_options=(*TENSORRT_LLM_OPTIONS, "quantization", "batch_scheduler_policy", "cuda_graphs", "gpu_memory_gib",
                 "examples_dir", "calib_dataset", "dry_run", "lora"))
