"""Each Python model's `config.pbtxt` parameters as one typed dataclass, written by the build and read by
the model with the same code: one place for every key, its type and its default.

Triton keeps parameters as strings. `to_config` writes every field (booleans as "true"/"false");
`from_config` converts each back by the field's type, takes the field's default when the key is absent
or empty, and refuses a value it cannot read, naming the key. Paths stay as written (relative to the
model's directory); the model resolves them (`triton_adapter.resolve_path`).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass

from .contract import ENGINE_MODEL
from .ports import GRPC_PORT

# How often a request's cancellation is checked: each check is an IPC round trip (the tensorrtllm backend's
# `cancellation_check_period_ms`, which the build sets to the same value).
CANCELLATION_CHECK_PERIOD_MS = 100
BLS_MAX_CONCURRENCY = 256  # requests one BLS instance runs at once (each in a worker thread)


class ParameterError(ValueError):
    pass


_WRITTEN_WHEN_SET = "written_when_set"


def written_when_set(default):
    """A parameter that `to_config` writes only when it differs from its default: a key added after configs were
    compared byte for byte (tests/unit/builder/test_source_configs.py) leaves the default build's config as it
    was, and reads back as its default where absent."""
    return dataclasses.field(default=default, metadata={_WRITTEN_WHEN_SET: True})


@dataclass(frozen=True, kw_only=True)
class ModelParameters:
    def to_config(self) -> dict[str, str]:
        return {field.name: _to_text(getattr(self, field.name)) for field in dataclasses.fields(self)
                if not (field.metadata.get(_WRITTEN_WHEN_SET) and getattr(self, field.name) == field.default)}

    @classmethod
    def from_config(cls, parameters: dict[str, str]):
        types = typing.get_type_hints(cls)
        values = {}
        for field in dataclasses.fields(cls):
            text = parameters.get(field.name, "")
            if text == "":
                if field.default is dataclasses.MISSING:
                    raise ParameterError(f"config parameter {field.name!r} is required by {cls.__name__}")
                continue
            values[field.name] = _from_text(field.name, text, types[field.name])
        return cls(**values)

    @classmethod
    def from_model_args(cls, args: dict):
        return cls.from_config(model_parameters(args))


def model_parameters(args: dict) -> dict[str, str]:
    """The config's `parameters` (from the `args` Triton passes to `initialize`) as plain strings."""
    parameters = json.loads(args["model_config"]).get("parameters", {})
    return {key: value.get("string_value", "") for key, value in parameters.items()}


def _to_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _from_text(key: str, text: str, kind):
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ParameterError(f"config parameter {key!r} must be true or false, got {text!r}")
        return text.lower() in ("true", "1")
    try:
        return kind(text)
    except ValueError:
        raise ParameterError(f"config parameter {key!r} must be {kind.__name__}, got {text!r}") from None


@dataclass(frozen=True, kw_only=True)
class PreprocessingParameters(ModelParameters):
    tokenizer_dir: str
    max_input_len: int
    max_seq_len: int
    add_special_tokens: bool = True


@dataclass(frozen=True, kw_only=True)
class PostprocessingParameters(ModelParameters):
    tokenizer_dir: str


@dataclass(frozen=True, kw_only=True)
class BlsParameters(ModelParameters):
    tokenizer_dir: str
    max_input_len: int
    max_seq_len: int
    tensorrt_llm_model_name: str = ENGINE_MODEL  # NVIDIA's BLS names its engine model with this key
    # Where the BLS reaches the engine: this server's gRPC endpoint (engine_stream.py says why). Triton's
    # default port; a launcher that picks another one overrides it for the stubs (ENGINE_GRPC_URL_ENV).
    engine_grpc_url: str = f"localhost:{GRPC_PORT}"
    max_concurrency: int = BLS_MAX_CONCURRENCY
    add_special_tokens: bool = True


# The responses a second the coalescer sends the ensemble at most, before it folds tokens into fewer responses:
# Triton 2.51's ensemble carried 15-22k engine responses a second on 16 cores (docs/performance.md), and at
# three tokens a response (about 10k responses a second) it kept the engine's 29.5k tokens/s.
COALESCER_MAX_RESPONSES_PER_SECOND = 8000


@dataclass(frozen=True, kw_only=True)
class CoalescerParameters(ModelParameters):
    """The coalescer's (a C++ backend reads these keys: coalescer_backend.cc)."""

    tensorrt_llm_model_name: str = ENGINE_MODEL
    max_responses_per_second: int = COALESCER_MAX_RESPONSES_PER_SECOND  # an instance's; 0: never paced


@dataclass(frozen=True, kw_only=True)
class EngineParameters(ModelParameters):
    """What both Python engine steps read (the tensorrtllm backend has its own keys, trtllm.py)."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    exclude_input_in_output: bool = True
    cancellation_check_period_ms: int = CANCELLATION_CHECK_PERIOD_MS
    # Streamed tokens per response after the first, as trtllm-serve's and vLLM's `stream_interval`: fewer
    # responses for the pipeline to carry, at the price of chunks that arrive that many steps apart.
    stream_interval: int = 1
    # Threads that build and send responses off the engine's thread (0: the engine's thread sends them);
    # tritonforge/runtime/sending.py says why.
    response_lanes: int = 2


@dataclass(frozen=True, kw_only=True)
class TransformersEngineParameters(EngineParameters):
    model_path: str
    # The tokenizer guided decoding compiles grammars for (preprocessing's); "": a repository built before it.
    tokenizer_dir: str = ""
    dtype: str = "auto"  # auto | float32 | float16 | bfloat16
    device: str = "auto"  # auto | cpu | cuda; an instance Triton placed on a GPU runs there instead
    # Devices one engine's weights are split over (torch.distributed ranks: the instance's device and the next ones).
    tensor_parallel_size: int = written_when_set(1)
    # LoRA adapters (build --lora NAME=PATH), JSON: [{"name", "task_id", "path" (relative to the model's folder)}]
    lora_adapters: str = written_when_set("")


@dataclass(frozen=True, kw_only=True)
class ReplayEngineParameters(EngineParameters):
    replay_tokens: str
    replay_step_ms: float
    vocab_size: int
    shared_batch: bool = False  # several instances share one batch (runtime/engine/replay/engine.SharedBatch)


@dataclass(frozen=True, kw_only=True)
class NativeReplayEngineParameters(ModelParameters):
    """What the C++ replay backend reads (tritonforge/runtime/engine/replay/replay_backend.cc, by these names)."""

    replay_tokens: str
    replay_step_ms: float
    max_batch_size: int
    exclude_input_in_output: bool = EngineParameters.exclude_input_in_output
    replay_sender_threads: int = 1  # threads sending responses, each running its share of the batch
    stream_interval: int = EngineParameters.stream_interval
    # False: the engine reads no stop of the launcher's, as NVIDIA's engine (tests of what the models around it do)
    replay_reads_stop: bool = written_when_set(True)


@dataclass(frozen=True, kw_only=True)
class PyTorchEngineParameters(EngineParameters):
    """The engine step on TensorRT-LLM's PyTorch workflow (`tensorrt_llm.LLM`,
    tritonforge/runtime/engine/llmapi/engine.py)."""

    model_path: str  # the Hugging Face checkpoint, relative to the model's directory
    vocab_size: int
    tokenizer_dir: str = ""  # the LLM's tokenizer, which its guided decoding needs; "": none (no guided decoding)
    dtype: str = "auto"  # auto | float16 | bfloat16 | float32; quantization comes with the checkpoint
    kv_cache_dtype: str = "auto"  # auto | fp8
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_cache_free_gpu_memory_fraction: float = 0.9
    max_num_tokens: int = 8192
    enable_block_reuse: bool = True
    enable_chunked_prefill: bool = False
    # LoRA adapters (build --lora NAME=PATH), JSON: [{"name", "task_id", "path" (relative to the model's folder)}]
    lora_adapters: str = written_when_set("")
