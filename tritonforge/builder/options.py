"""Every build setting, declared once (`BuildOptions`): its default, its help and its `tritonforge build` flag.
What applies to one engine kind alone is checked by that kind (`builder/engines/`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..facts.model_parameters import EngineParameters
from ..facts.settings import comma_list, option_flag, setting
from . import model_configs as configs
from . import trtllm
from .engines import DEFAULT_ENGINE, ENGINE_KINDS, ENGINE_NAMES, engine_kind
from .lora import check_specs
from .native import TEXT_BACKENDS

TRT = "TensorRT-LLM (--engine tensorrtllm)"


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Every build setting, declared once: its default, its help and its `tritonforge build` flag (the CLI is
    generated from these fields and from `ServingConfig`'s, tritonforge/facts/settings.py), validated here."""

    model: Path = setting(help="Hugging Face checkpoint directory", parse=Path)
    output: Path = setting(Path("model_repository"), "repository to write")
    engine: str = setting(DEFAULT_ENGINE, "the engine step: " + "; ".join(f"{kind.name}: {kind.summary}"
                                                                     for kind in ENGINE_KINDS.values()),
                          choices=ENGINE_NAMES)
    frontends: tuple[str, ...] = setting(("ensemble", "bls"), "client-facing models, comma-separated: ensemble, bls",
                                         parse=comma_list)
    max_batch_size: int = setting(8, "sequences the engine runs at once")
    max_input_len: int = setting(1024, "tokens of a prompt")
    max_seq_len: int = setting(2048, "prompt + generated tokens")
    dtype: str = setting("auto", "auto | float32 | float16 | bfloat16")
    device: str = setting("auto", "transformers engine: auto | cpu | cuda")
    gpus: int = setting(0, "transformers engine: one engine instance on each of GPUs 0..N-1, each with its own "
                        "--max-batch-size (with --tp-size T: N/T instances of T GPUs each); 0: one instance, placed "
                        "by --device")
    serving: configs.ServingConfig = configs.ServingConfig()
    force: bool = setting(False, "replace the files an earlier build recorded writing in the output folder")
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
    text_backend: str = setting("auto", "postprocessing (the detokenizer) as its C++ backend, compiled at build time "
                                "(no Python per token; needs a C++ compiler), or as the Python model it is the "
                                "twin of; auto: C++ where a compiler exists, else Python, said in one line",
                                choices=TEXT_BACKENDS)
    lora: tuple[str, ...] = setting((), "a PEFT LoRA adapter served beside the base model, as NAME=PATH (repeat for "
                                    "more): requests select it by lora_task_id (1, 2, ... in the order given), "
                                    "the OpenAI gateway by `model` NAME (default: none)", repeat=True,
                                    metavar="NAME=PATH")
    tp_size: int = setting(1, "tensor parallel size: the GPUs one engine's weights are split over (TensorRT-LLM's "
                           "ranks; the transformers engine's torch.distributed ranks, which its model starts)")
    pp_size: int = setting(1, "pipeline parallel size", group=TRT)
    quantization: str = setting("none", "weights (and activations) in fewer bits: fp8, int8_sq (SmoothQuant) and "
                                "int4_awq calibrate on --calib-dataset; int8_wo, int4_wo quantize weights only",
                                choices=trtllm.QUANTIZATIONS, group=TRT)
    kv_cache_dtype: str = setting("auto", "KV cache precision (auto: the model's dtype); fp8 or int8 hold twice the "
                                  "tokens of a 16-bit cache", choices=trtllm.KV_CACHE_DTYPES, group=TRT)
    max_num_tokens: int = setting(8192, "tokens per engine step (prefill budget)", group=TRT)
    kv_cache_free_gpu_mem_fraction: float = setting(0.9, "share of the GPU memory left after the weights that the KV "
                                                    "cache takes", group=TRT)
    batch_scheduler_policy: str = setting("guaranteed_no_evict", "guaranteed_no_evict: admit a request only when "
                                          "the KV cache holds its whole generation; max_utilization: admit more, "
                                          "pausing some when the cache runs out",
                                          choices=trtllm.BATCH_SCHEDULER_POLICIES, group=TRT)
    enable_kv_cache_reuse: bool = setting(True, "disable KV-cache (prefix) reuse", flag="--no-kv-cache-reuse",
                                          group=TRT)
    enable_chunked_context: bool = setting(False, "enable chunked prefill", flag="--chunked-context", group=TRT)
    cuda_graphs: bool = setting(False, "run decoding steps as CUDA graphs", group=TRT)
    gpu_memory_gib: float | None = setting(None, "plan for this GPU size without a GPU (default: none: the "
                                           "visible GPU's memory)", parse=float, group=TRT)
    examples_dir: str = setting(trtllm.EXAMPLES_DIR, "TensorRT-LLM's examples/ folder (convert_checkpoint.py, "
                                "quantize.py) at the pinned release", group=TRT)
    calib_dataset: str | None = setting(None, "fp8 / int8_sq / int4_awq: local calibration dataset folder (a "
                                        "'train' split with a 'text' column, e.g. train.jsonl); nothing is "
                                        "downloaded (default: none)", parse=str, group=TRT)
    repository_mount: str = setting("/models", "repository path inside the server container", group=TRT)
    target_triton: tuple[int, int] | None = setting(None, "Triton version the configs are for (default: the pinned "
                                                    "image's), e.g. 2.51, or a container, e.g. 25.12",
                                                    parse=trtllm.parse_target_triton, group=TRT)
    dry_run: bool = setting(False, "print the plan and commands, write configs, build nothing", group=TRT)
    planned_instances: bool = True  # TensorRT-LLM: pre/post/BLS instance counts from the plan unless set

    def __post_init__(self):
        kind = engine_kind(self.engine)
        if self.max_input_len < 1 or self.max_seq_len <= self.max_input_len:
            raise ValueError(f"--max-seq-len ({self.max_seq_len}) must exceed --max-input-len ({self.max_input_len})")
        if self.max_batch_size < 1:
            raise ValueError(f"--max-batch-size must be >= 1, got {self.max_batch_size}")
        if self.serving.max_batch_size < self.max_batch_size:
            # Triton's batch limit never below the engine's: a batched request of every slot must fit through.
            object.__setattr__(self, "serving", dataclasses.replace(self.serving, max_batch_size=self.max_batch_size))
        if self.response_lanes < 0:
            raise ValueError(f"--response-lanes must be >= 0, got {self.response_lanes}")
        if self.stream_interval < 1:
            raise ValueError(f"--stream-interval must be >= 1, got {self.stream_interval}")
        if self.serving.engine_instances > 1 and not kind.several_instances:
            several = ", ".join(k.name for k in ENGINE_KINDS.values() if k.several_instances)
            raise ValueError(f"--engine-instances > 1 is for the {several} engine only; the {self.engine} engine runs "
                             f"as one instance that batches in flight")
        check_specs(self.lora)
        kind.check(self)  # first: a kind's own word on an option it refuses says more than the rule below
        for name, owners in _OWNED_OPTIONS.items():
            if kind.name not in owners and getattr(self, name) != _DEFAULTS[name]:
                raise ValueError(f"{option_flag(BuildOptions, name)} is for --engine {' or '.join(owners)} only: "
                                 f"the {self.engine} engine would ignore it")


_DEFAULTS = {field.name: field.default for field in dataclasses.fields(BuildOptions)}
# Each option some kinds read and others ignore: the kinds that read it.
_OWNED_OPTIONS = {name: tuple(kind.name for kind in ENGINE_KINDS.values() if name in kind.own_options)
                  for name in dict.fromkeys(name for kind in ENGINE_KINDS.values() for name in kind.own_options)}
