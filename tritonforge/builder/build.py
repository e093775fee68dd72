"""`tritonforge build` / `build_engine.py`: a checkpoint in, a ready-to-mount model repository out.

One code path for both engines: read the checkpoint, check the limits against it, produce the engine step
(copy the checkpoint for transformers; convert and build for TensorRT-LLM), then write every model's config.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ..facts.limits import EngineLimits
from ..facts.model_parameters import (
    CANCELLATION_CHECK_PERIOD_MS,
    EngineParameters,
    NativeReplayEngineParameters,
    PyTorchEngineParameters,
    ReplayEngineParameters,
    TransformersEngineParameters,
)
from ..facts.ports import GRPC_PORT
from ..facts.settings import comma_list, setting
from . import model_configs as configs
from . import trtllm
from .planner import ModelShape, plan_memory
from .repository import (
    CHECKPOINT_SUBDIR,
    ENGINE_SUBDIR,
    REPLAY_TOKENS,
    RepositoryPlan,
    prepare_output,
    removed_on_failure,
    write_repository,
)

logger = logging.getLogger(__name__)


TRT = "TensorRT-LLM (--engine tensorrtllm)"


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Every build setting, declared once: its default, its help and its `tritonforge build` flag (the CLI is
    generated from these fields and from `ServingConfig`'s, tritonforge/facts/settings.py), validated here."""

    model: Path = setting(help="Hugging Face checkpoint directory", parse=Path)
    output: Path = setting(Path("model_repository"), "repository to write")
    engine: str = setting("transformers", choices=configs.ENGINES)
    frontends: tuple[str, ...] = setting(("ensemble", "bls"), "client-facing models, comma-separated: ensemble, bls",
                                         parse=comma_list)
    max_batch_size: int = setting(8, "sequences the engine runs at once")
    max_input_len: int = setting(1024, "tokens of a prompt")
    max_seq_len: int = setting(2048, "prompt + generated tokens")
    dtype: str = setting("auto", "auto | float32 | float16 | bfloat16")
    device: str = setting("auto", "transformers engine: auto | cpu | cuda")
    serving: configs.ServingConfig = configs.ServingConfig()
    force: bool = setting(False, "replace the files an earlier build recorded writing in the output folder")
    accuracy_gate: Path | None = setting(None, "after the build, serve the repository and compare it with the "
                                         "checkpoint (tritonforge eval); a failing engine leaves the repository "
                                         "marked not ready", parse=Path, metavar="PROMPTS.jsonl")
    accuracy_reference: Path | None = setting(None, "the checkpoint the gate compares with (default: --model), "
                                              "e.g. the original of a pre-quantized checkpoint", parse=Path)
    replay_step_ms: float = setting(8.5, "--engine replay (benchmarking only): ms per step, one token per running "
                                    "request")
    replay_native: bool = setting(False, "--engine replay: the engine as a C++ backend compiled at build time "
                                  "(costs the pipeline no Python, as NVIDIA's C++ backend; needs g++)")
    replay_sender_threads: int = setting(1, "--replay-native: threads sending the engine's responses, each running "
                                         "its share of the batch")
    stream_interval: int = setting(1, "transformers, replay and tensorrtllm-pytorch engines (the LLM API's "
                                   "stream_interval): streamed tokens per response after the first (fewer "
                                   "responses through the pipeline, chunks that many steps apart); 1 streams "
                                   "every token, as the tensorrtllm backend always does")
    response_lanes: int = setting(EngineParameters.response_lanes, "transformers, replay and tensorrtllm-pytorch "
                                  "engines: threads that build and send responses off the engine's thread, "
                                  "each row's in order (0: the engine's thread sends them)")
    tp_size: int = setting(1, "tensor parallel size", group=TRT)
    pp_size: int = setting(1, "pipeline parallel size", group=TRT)
    quantization: str = setting("none", choices=trtllm.QUANTIZATIONS, group=TRT)
    kv_cache_dtype: str = setting("auto", choices=trtllm.KV_CACHE_DTYPES, group=TRT)
    max_num_tokens: int = setting(8192, "tokens per engine step (prefill budget)", group=TRT)
    kv_cache_free_gpu_mem_fraction: float = setting(0.9, "share of the GPU memory left after the weights that the KV "
                                                    "cache takes", group=TRT)
    batch_scheduler_policy: str = setting("guaranteed_no_evict", choices=trtllm.BATCH_SCHEDULER_POLICIES, group=TRT)
    enable_kv_cache_reuse: bool = setting(True, "disable KV-cache (prefix) reuse", flag="--no-kv-cache-reuse",
                                          group=TRT)
    enable_chunked_context: bool = setting(False, "enable chunked prefill", flag="--chunked-context", group=TRT)
    cuda_graphs: bool = setting(False, "run decoding steps as CUDA graphs", group=TRT)
    gpu_memory_gib: float | None = setting(None, "plan for this GPU size without a GPU", parse=float, group=TRT)
    examples_dir: str = setting(trtllm.EXAMPLES_DIR, "TensorRT-LLM's examples/ folder (convert_checkpoint.py, "
                                "quantize.py) at the pinned release", group=TRT)
    calib_dataset: str | None = setting(None, "fp8 / int8_sq / int4_awq: local calibration dataset folder (a "
                                        "'train' split with a 'text' column, e.g. train.jsonl); nothing is "
                                        "downloaded", parse=str, group=TRT)
    repository_mount: str = setting("/models", "repository path inside the server container", group=TRT)
    target_triton: tuple[int, int] | None = setting(None, "Triton version the configs are for (default: the pinned "
                                                    "image's), e.g. 2.51, or a container, e.g. 25.12",
                                                    parse=trtllm.parse_target_triton, group=TRT)
    dry_run: bool = setting(False, "print the plan and commands, write configs, build nothing", group=TRT)
    planned_instances: bool = True  # TensorRT-LLM: pre/post/BLS instance counts from the plan unless set

    def __post_init__(self):
        if self.engine not in configs.ENGINES:
            raise ValueError(f"--engine must be one of {configs.ENGINES}, got {self.engine!r}")
        if self.max_input_len < 1 or self.max_seq_len <= self.max_input_len:
            raise ValueError(f"--max-seq-len ({self.max_seq_len}) must exceed --max-input-len ({self.max_input_len})")
        if self.max_batch_size < 1:
            raise ValueError(f"--max-batch-size must be >= 1, got {self.max_batch_size}")
        if self.serving.max_batch_size < self.max_batch_size:
            # Triton's batch limit never below the engine's: a batched request of every slot must fit through.
            object.__setattr__(self, "serving", dataclasses.replace(self.serving, max_batch_size=self.max_batch_size))
        if self.replay_step_ms <= 0:
            raise ValueError(f"--replay-step-ms must be > 0, got {self.replay_step_ms}")
        if self.replay_native and self.engine != "replay":
            raise ValueError("--replay-native is for --engine replay only")
        if self.replay_native and self.serving.engine_instances > 1:
            raise ValueError("--replay-native runs as one instance: set --replay-sender-threads instead of "
                             "--engine-instances")
        if self.response_lanes < 0:
            raise ValueError(f"--response-lanes must be >= 0, got {self.response_lanes}")
        if self.stream_interval < 1:
            raise ValueError(f"--stream-interval must be >= 1, got {self.stream_interval}")
        if self.stream_interval > 1 and self.engine == "tensorrtllm":
            raise ValueError("--stream-interval: the tensorrtllm backend streams one response per token and has no "
                             "such setting; it is for the transformers and replay engines")
        if self.replay_sender_threads < 1:
            raise ValueError(f"--replay-sender-threads must be >= 1, got {self.replay_sender_threads}")
        if self.replay_native and self.replay_sender_threads > self.max_batch_size:
            raise ValueError(f"--replay-sender-threads ({self.replay_sender_threads}) must be at most --max-batch-size "
                             f"({self.max_batch_size}): each thread runs a share of the batch")
        if self.replay_native and not self.serving.decoupled:
            raise ValueError("--replay-native streams: it needs the streaming (decoupled) build, not --no-streaming")
        if self.replay_native and self.serving.max_queue_size:
            raise ValueError("--replay-native queues without bound: --max-queue-size is for the Python engines")
        if self.serving.engine_instances > 1 and self.engine != "replay":
            raise ValueError(f"--engine-instances > 1 is for the replay engine only; the {self.engine} engine runs "
                             f"as one instance that batches in flight")
        if self.engine == "tensorrtllm":
            self._check_tensorrtllm()
        if self.engine == "tensorrtllm-pytorch":
            self._check_pytorch_workflow()

    def _check_pytorch_workflow(self) -> None:
        for flag, value, allowed in (("--dtype", self.dtype, trtllm.LLMAPI_DTYPES),
                                     ("--kv-cache-dtype", self.kv_cache_dtype, trtllm.LLMAPI_KV_CACHE_DTYPES)):
            if value not in allowed:
                raise ValueError(f"{flag} must be one of {allowed}, got {value!r}")
        if self.quantization != "none":
            raise ValueError(f"--quantization {self.quantization} is for engine builds: the LLM API reads the "
                             f"quantization from the checkpoint (quantize it with ModelOpt first, which writes "
                             f"hf_quant_config.json beside the weights)")
        if self.tp_size < 1 or self.pp_size < 1:
            raise ValueError("--tp-size and --pp-size must be >= 1")
        if not 0 < self.kv_cache_free_gpu_mem_fraction < 1:
            raise ValueError(f"--kv-cache-free-gpu-mem-fraction must be in (0, 1), got "
                             f"{self.kv_cache_free_gpu_mem_fraction}")
        if self.max_num_tokens < self.max_input_len and not self.enable_chunked_context:
            raise ValueError(f"--max-num-tokens ({self.max_num_tokens}) must be >= --max-input-len "
                             f"({self.max_input_len}) unless --chunked-context splits prompts")

    def _check_tensorrtllm(self) -> None:
        def one_of(flag: str, value, allowed) -> None:
            if value not in allowed:
                raise ValueError(f"{flag} must be one of {allowed}, got {value!r}")

        one_of("--quantization", self.quantization, trtllm.QUANTIZATIONS)
        one_of("--kv-cache-dtype", self.kv_cache_dtype, trtllm.KV_CACHE_DTYPES)
        one_of("--batch-scheduler-policy", self.batch_scheduler_policy, trtllm.BATCH_SCHEDULER_POLICIES)
        one_of("--dtype", self.dtype, ("auto", "float16", "bfloat16"))
        if self.quantization in trtllm.CALIBRATED and not self.calib_dataset:
            raise ValueError(f"--quantization {self.quantization} calibrates on a dataset: pass --calib-dataset DIR, "
                             f"a local folder that datasets.load_dataset reads with a 'train' split and a 'text' "
                             f"column (e.g. one train.jsonl of {{\"text\": ...}} lines); the scripts' default "
                             f"downloads cnn_dailymail from the hub")
        if self.tp_size < 1 or self.pp_size < 1:
            raise ValueError("--tp-size and --pp-size must be >= 1")
        if self.max_num_tokens < self.max_input_len and not self.enable_chunked_context:
            raise ValueError(f"--max-num-tokens ({self.max_num_tokens}) must be >= --max-input-len "
                             f"({self.max_input_len}) unless --chunked-context splits prompts")


def read_checkpoint_config(model: Path) -> dict:
    if not model.is_dir():
        raise FileNotFoundError(f"--model {model}: no such folder (a Hugging Face checkpoint folder, or make one "
                                f"with `tritonforge make-tiny-model {model}`)")
    config = model / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"--model {model} is not a Hugging Face checkpoint folder (no config.json)")
    try:
        return json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"--model {model}: config.json is not valid JSON ({error})") from None


def check_checkpoint(options: BuildOptions) -> dict:
    """Everything the build reads from the checkpoint, checked before anything is written: its config, its
    tokenizer, and the weights the engine needs. Returns the config."""
    from ..runtime.text.tokenization import load_tokenizer

    checkpoint_config = read_checkpoint_config(options.model)
    # transformers copies *.safetensors; TensorRT-LLM's converters also read PyTorch's *.bin
    patterns = {"transformers": ("*.safetensors",), "tensorrtllm-pytorch": ("*.safetensors",),
                "tensorrtllm": ("*.safetensors", "*.bin")}.get(options.engine, ())
    weights = [path for pattern in patterns for path in options.model.glob(pattern)]
    if patterns and not any(path.is_file() for path in weights):
        found = sorted(path.name for path in options.model.glob("*.bin"))
        hint = (f"; it has {', '.join(found[:3])}: convert them to safetensors first" if found else
                "; a broken link or a folder by that name is no weights file" if weights else
                ": is the download complete?")
        raise FileNotFoundError(f"--model {options.model} has no weights ({' or '.join(patterns)}){hint}")
    if options.engine in ("replay", "tensorrtllm-pytorch") and "vocab_size" not in checkpoint_config:
        raise ValueError(f"--model {options.model}: config.json has no vocab_size, which the {options.engine} engine "
                         f"needs")
    try:
        load_tokenizer(options.model)
    except Exception as error:  # noqa: BLE001 - transformers raises many kinds for a missing or broken file
        raise FileNotFoundError(f"--model {options.model} has no tokenizer transformers can load "
                                f"({type(error).__name__}: {str(error).strip().splitlines()[0][:200]}): copy the "
                                f"tokenizer's files (tokenizer.json, tokenizer_config.json, ...) beside "
                                f"config.json") from None
    return checkpoint_config


def transformers_engine_parameters(options: BuildOptions) -> dict[str, str]:
    return TransformersEngineParameters(
        model_path=f"1/{CHECKPOINT_SUBDIR}", max_batch_size=options.max_batch_size,
        max_input_len=options.max_input_len, max_seq_len=options.max_seq_len, dtype=options.dtype,
        device=options.device, exclude_input_in_output=options.serving.exclude_input_in_output,
        stream_interval=options.stream_interval, response_lanes=options.response_lanes).to_config()


def replay_engine_parameters(options: BuildOptions, vocab_size: int) -> dict[str, str]:
    # --max-batch-size is the whole engine's: several instances share it (replay_engine.SharedBatch), so
    # the engine streams max_batch_size tokens a step however many stubs send them.
    return ReplayEngineParameters(
        replay_tokens=f"1/{REPLAY_TOKENS}", replay_step_ms=options.replay_step_ms, vocab_size=vocab_size,
        shared_batch=options.serving.engine_instances > 1, max_batch_size=options.max_batch_size,
        max_input_len=options.max_input_len, max_seq_len=options.max_seq_len,
        exclude_input_in_output=options.serving.exclude_input_in_output,
        stream_interval=options.stream_interval, response_lanes=options.response_lanes).to_config()


def native_replay_engine_parameters(options: BuildOptions) -> dict[str, str]:
    return NativeReplayEngineParameters(
        replay_tokens=f"1/{REPLAY_TOKENS}", replay_step_ms=options.replay_step_ms,
        max_batch_size=options.max_batch_size, exclude_input_in_output=options.serving.exclude_input_in_output,
        replay_sender_threads=options.replay_sender_threads, stream_interval=options.stream_interval).to_config()


def pytorch_engine_parameters(options: BuildOptions, vocab_size: int) -> dict[str, str]:
    """The `tensorrt_llm` model on TensorRT-LLM's PyTorch workflow: the checkpoint and the `LLM(...)` settings."""
    return PyTorchEngineParameters(
        model_path=f"1/{CHECKPOINT_SUBDIR}", vocab_size=vocab_size, max_batch_size=options.max_batch_size,
        max_input_len=options.max_input_len, max_seq_len=options.max_seq_len, dtype=options.dtype,
        kv_cache_dtype=options.kv_cache_dtype, tensor_parallel_size=options.tp_size,
        pipeline_parallel_size=options.pp_size,
        kv_cache_free_gpu_memory_fraction=options.kv_cache_free_gpu_mem_fraction,
        max_num_tokens=options.max_num_tokens, enable_block_reuse=options.enable_kv_cache_reuse,
        enable_chunked_prefill=options.enable_chunked_context, stream_interval=options.stream_interval,
        response_lanes=options.response_lanes,
        exclude_input_in_output=options.serving.exclude_input_in_output).to_config()


def tensorrtllm_engine_parameters(options: BuildOptions) -> dict[str, str]:
    """Every key of NVIDIA's `tensorrt_llm/config.pbtxt` template (`trtllm.BACKEND_PARAMETER_KEYS`), explicit.

    "" is what the backend treats as unset: it then takes its own default. The KV cache is sized by
    `kv_cache_free_gpu_mem_fraction` alone (`max_tokens_in_paged_kv_cache` unset), so the engine gets all
    the memory the fraction gives; the build's memory plan only checks that one max-length sequence fits.
    """
    def flag(value: bool) -> str:
        return "true" if value else "false"

    ours = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": f"{options.repository_mount}/{configs.ENGINE_MODEL}/1/{ENGINE_SUBDIR}",
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


def trt_build_spec(options: BuildOptions, checkpoint_config: dict) -> trtllm.TrtBuildSpec:
    """The engine build of these options: paths beside the output, dtype resolved from the checkpoint."""
    dtype = options.dtype if options.dtype != "auto" else (
        "bfloat16" if checkpoint_config.get("torch_dtype", checkpoint_config.get("dtype")) == "bfloat16"
        else "float16")
    return trtllm.TrtBuildSpec(
        checkpoint=options.model.resolve(), work_dir=(options.output.parent / f"{options.output.name}.build").resolve(),
        engine_dir=(options.output / configs.ENGINE_MODEL / "1" / ENGINE_SUBDIR).resolve(),
        architecture=(checkpoint_config.get("architectures") or ["LlamaForCausalLM"])[0], dtype=dtype,
        tp_size=options.tp_size, pp_size=options.pp_size, quantization=options.quantization,
        kv_cache_dtype=options.kv_cache_dtype, max_batch_size=options.max_batch_size,
        max_input_len=options.max_input_len, max_seq_len=options.max_seq_len, max_num_tokens=options.max_num_tokens,
        examples_dir=options.examples_dir, calib_dataset=options.calib_dataset)


def build_tensorrtllm(options: BuildOptions, checkpoint_config: dict, limits, progress=print) -> Path:
    """Plan, print the exact commands, and (unless --dry-run) convert and build the engine; then write configs."""
    spec = trt_build_spec(options, checkpoint_config)
    gpu_memory_gib = _gpu_memory_gib(options)
    plan = plan_memory(ModelShape.from_hf_config(checkpoint_config), gpu_memory_gib=gpu_memory_gib, dtype=spec.dtype,
                       quantization=options.quantization, kv_cache_dtype=options.kv_cache_dtype,
                       tp_size=options.tp_size, pp_size=options.pp_size, max_seq_len=options.max_seq_len,
                       max_batch_size=options.max_batch_size,
                       kv_cache_free_gpu_mem_fraction=options.kv_cache_free_gpu_mem_fraction)
    progress(f"memory plan (tp={options.tp_size}, pp={options.pp_size}, {spec.dtype}, quantization "
             f"{options.quantization}, KV {options.kv_cache_dtype}):")
    progress(plan.table(gpu_memory_gib=gpu_memory_gib, fraction=options.kv_cache_free_gpu_mem_fraction,
                        max_seq_len=options.max_seq_len, max_batch_size=options.max_batch_size))
    commands = [trtllm.convert_command(spec), trtllm.build_command(spec)]
    progress("commands:")
    for command in commands:
        progress("  " + " ".join(command))
    if not options.dry_run:
        trtllm.require_trtllm()
    serving = dataclasses.replace(options.serving, target_triton=options.target_triton or trtllm.TRITON_VERSION)
    progress(target_triton_note(serving.target_triton))
    if options.planned_instances:
        serving = dataclasses.replace(serving, preprocessing_instances=plan.preprocessing_instances,
                                      postprocessing_instances=plan.postprocessing_instances,
                                      bls_instances=plan.bls_instances,
                                      bls_max_concurrency=plan.bls_max_concurrency,
                                      max_queue_size=options.serving.max_queue_size or plan.max_queue_size)
    plan_record = {"memory_plan": dataclasses.asdict(plan), "commands": commands,
                   "tensorrt_llm": trtllm.TRTLLM_VERSION, "image": trtllm.TRITON_IMAGE}
    repository = RepositoryPlan(output=options.output, engine="tensorrtllm", frontends=options.frontends,
                                serving=serving, limits=limits,
                                engine_parameters=tensorrtllm_engine_parameters(options))
    existing = prepare_output(options.output, force=options.force, checkpoint=options.model)
    with removed_on_failure(options.output, existing):
        if not options.dry_run:
            spec.work_dir.mkdir(parents=True, exist_ok=True)
            spec.engine_dir.mkdir(parents=True, exist_ok=True)
            progress(f"building the engine (minutes to an hour; log: {spec.work_dir / 'build.log'})")
            trtllm.run_build(spec, spec.work_dir / "build.log", progress)
            trtllm.write_engine_info(spec, commands, trtllm.runtime_facts())
        write_repository(repository, tokenizer_source=options.model, checkpoint=None, existing=existing,
                         manifest={"tritonforge_build": _options_record(options), **plan_record,
                                   "dry_run": options.dry_run})
    return options.output


def _options_record(options: BuildOptions) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(options).items()}


def build(options: BuildOptions, progress=print) -> Path:
    """Check the checkpoint, then write the repository; a build that fails removes what it wrote."""
    checkpoint_config = check_checkpoint(options)
    max_positions = checkpoint_config.get("max_position_embeddings")
    if max_positions and options.max_seq_len > max_positions:
        raise ValueError(f"--max-seq-len {options.max_seq_len} exceeds the model's max_position_embeddings "
                         f"{max_positions}")
    limits = EngineLimits(max_batch_size=options.max_batch_size, max_input_len=options.max_input_len,
                                      max_seq_len=options.max_seq_len)
    if options.engine == "tensorrtllm":
        build_tensorrtllm(options, checkpoint_config, limits, progress)
        return run_accuracy_gate(options, progress)
    serving, manifest = options.serving, {"tritonforge_build": _options_record(options)}
    if options.engine == "replay" and options.replay_native:
        parameters = native_replay_engine_parameters(options)
    elif options.engine == "replay":
        parameters = replay_engine_parameters(options, vocab_size=checkpoint_config["vocab_size"])
    elif options.engine == "tensorrtllm-pytorch":
        parameters = pytorch_engine_parameters(options, vocab_size=checkpoint_config["vocab_size"])
        serving = dataclasses.replace(serving, target_triton=options.target_triton or trtllm.TRITON_VERSION)
        manifest.update(tensorrt_llm=trtllm.TRTLLM_VERSION, image=trtllm.TRITON_IMAGE)
    else:
        parameters = transformers_engine_parameters(options)
    plan = RepositoryPlan(output=options.output, engine=options.engine, frontends=options.frontends,
                          serving=serving, limits=limits, engine_parameters=parameters,
                          native_replay=options.replay_native)
    existing = prepare_output(options.output, force=options.force, checkpoint=options.model)
    progress(f"writing {options.output} ({options.engine} engine; copying the checkpoint's weights)")
    with removed_on_failure(options.output, existing):
        write_repository(plan, tokenizer_source=options.model, checkpoint=options.model, existing=existing,
                         manifest=manifest)
    return run_accuracy_gate(options, progress)


class AccuracyGateFailed(RuntimeError):
    pass


def run_accuracy_gate(options: BuildOptions, progress=print) -> Path:
    """With --accuracy-gate: serve the new repository, compare its engine with the checkpoint, record the
    figures (tritonforge.json, and engine_info.json beside a TensorRT-LLM engine) and mark the repository
    ready only if the gate passes (`tritonforge serve` refuses one marked not ready)."""
    if options.accuracy_gate is None:
        return options.output
    from .repository import MANIFEST, tokenizer_dir

    tokenizer = tokenizer_dir(options.output)
    reference = options.accuracy_reference or options.model
    if options.dry_run:
        progress("accuracy gate (after the build):")
        progress(f"  tritonforge serve {options.output} --grpc-port {GRPC_PORT}")
        progress(f"  tritonforge eval --url localhost:{GRPC_PORT} --reference {reference} --tokenizer {tokenizer} "
                 f"--prompts {options.accuracy_gate}")
        return options.output
    from ..serve.server import TritonServer, only_models
    from ..tools.accuracy import run_eval

    progress(f"accuracy gate: serving {options.output} and comparing it with {reference}")
    # The gate reads the engine model alone (its tokens and log-probs): the other models are not loaded.
    with TritonServer(options.output, extra_args=only_models(configs.ENGINE_MODEL)) as server:
        report = run_eval(server.grpc_url, reference, tokenizer, prompts_path=options.accuracy_gate)
    progress(report.table())
    manifest_path = options.output / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest.update(accuracy_gate=report.record(), ready=report.passed)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    engine_info = options.output / configs.ENGINE_MODEL / "1" / ENGINE_SUBDIR / trtllm.ENGINE_INFO
    if engine_info.is_file():
        engine_info.write_text(json.dumps({**json.loads(engine_info.read_text()),
                                           "accuracy_gate": report.record()}, indent=2) + "\n")
    if not report.passed:
        raise AccuracyGateFailed(f"the engine failed the accuracy gate ({'; '.join(report.failures)}); the "
                                 f"repository is marked not ready in {manifest_path}")
    return options.output
