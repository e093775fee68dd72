"""Every model's `config.pbtxt`, built as `model_config_pb2.ModelConfig` objects and written as text format.

No templates: a value is either set on a typed field or the build fails, so no `${...}` can be left behind.
The tensor tables follow NVIDIA's `inflight_batcher_llm` models (INTERFACE.md); ours adds the optional
`messages` input (chat) to the client-facing models.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ENGINE_MODEL = "tensorrt_llm"
# "replay" is for benchmarking only: it streams pre-set tokens (tritonforge/replay_engine.py).
ENGINES = ("transformers", "tensorrtllm", "replay")
FRONTENDS = ("ensemble", "bls")
# The Triton release our tests run (pytriton 0.7.0); configs for another target may use newer fields.
TESTED_TRITON = (2, 51)
MAX_INFLIGHT_SINCE = (2, 63)  # ModelEnsembling.max_inflight_requests; 2.51's parser rejects the field
ENSEMBLE_MAX_INFLIGHT = 64

S = mc.TYPE_STRING
I32 = mc.TYPE_INT32
F32 = mc.TYPE_FP32
U64 = mc.TYPE_UINT64
BOOL = mc.TYPE_BOOL


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: int
    dims: tuple[int, ...]
    optional: bool = False
    scalar: bool = False  # reshape [1] → [] (the tensorrtllm backend's per-request scalars)
    ragged: bool = False


# --- the client contract (ensemble and BLS) -----------------------------------------------------------------
CLIENT_INPUTS = [
    Tensor("text_input", S, (1,), optional=True),  # optional only because `messages` may replace it
    Tensor("messages", S, (1,), optional=True),
    Tensor("max_tokens", I32, (1,)),
    Tensor("bad_words", S, (-1,), optional=True),
    Tensor("stop_words", S, (-1,), optional=True),
    Tensor("end_id", I32, (1,), optional=True),
    Tensor("pad_id", I32, (1,), optional=True),
    Tensor("top_k", I32, (1,), optional=True),
    Tensor("top_p", F32, (1,), optional=True),
    Tensor("temperature", F32, (1,), optional=True),
    Tensor("length_penalty", F32, (1,), optional=True),
    Tensor("repetition_penalty", F32, (1,), optional=True),
    Tensor("presence_penalty", F32, (1,), optional=True),
    Tensor("frequency_penalty", F32, (1,), optional=True),
    Tensor("min_tokens", I32, (1,), optional=True),
    Tensor("beam_width", I32, (1,), optional=True),
    Tensor("num_return_sequences", I32, (1,), optional=True),
    Tensor("seed", U64, (1,), optional=True),
    Tensor("stream", BOOL, (1,), optional=True),
    Tensor("exclude_input_in_output", BOOL, (1,), optional=True),
    Tensor("return_log_probs", BOOL, (1,), optional=True),
]
CLIENT_OUTPUTS = [
    Tensor("text_output", S, (-1,)),
    Tensor("cum_log_probs", F32, (-1,)),
    Tensor("output_log_probs", F32, (-1, -1)),
    Tensor("batch_index", I32, (1,)),
    Tensor("sequence_index", I32, (1,)),
]

PREPROCESSING_INPUTS = [
    Tensor("QUERY", S, (1,), optional=True),
    Tensor("MESSAGES", S, (1,), optional=True),
    Tensor("REQUEST_OUTPUT_LEN", I32, (1,)),
    Tensor("BAD_WORDS_DICT", S, (-1,), optional=True),
    Tensor("STOP_WORDS_DICT", S, (-1,), optional=True),
    Tensor("END_ID", I32, (1,), optional=True),
    Tensor("PAD_ID", I32, (1,), optional=True),
]
PREPROCESSING_OUTPUTS = [
    Tensor("INPUT_ID", I32, (-1,)),
    Tensor("REQUEST_INPUT_LEN", I32, (1,)),
    Tensor("REQUEST_OUTPUT_LEN", I32, (-1,)),
    Tensor("BAD_WORDS_IDS", I32, (2, -1)),
    Tensor("STOP_WORDS_IDS", I32, (2, -1)),
    Tensor("OUT_END_ID", I32, (1,)),
    Tensor("OUT_PAD_ID", I32, (1,)),
]

ENGINE_INPUTS = [
    Tensor("input_ids", I32, (-1,), optional=True, ragged=True),
    Tensor("input_lengths", I32, (1,), scalar=True),
    Tensor("request_output_len", I32, (1,), scalar=True),
    Tensor("end_id", I32, (1,), optional=True, scalar=True),
    Tensor("pad_id", I32, (1,), optional=True, scalar=True),
    Tensor("streaming", BOOL, (1,), optional=True, scalar=True),
    Tensor("stop", BOOL, (1,), optional=True, scalar=True),
    Tensor("exclude_input_in_output", BOOL, (1,), optional=True, scalar=True),
    Tensor("stop_words_list", I32, (2, -1), optional=True, ragged=True),
    Tensor("bad_words_list", I32, (2, -1), optional=True, ragged=True),
    Tensor("beam_width", I32, (1,), optional=True, scalar=True),
    Tensor("num_return_sequences", I32, (1,), optional=True, scalar=True),
    Tensor("runtime_top_k", I32, (1,), optional=True, scalar=True),
    Tensor("runtime_top_p", F32, (1,), optional=True, scalar=True),
    Tensor("min_tokens", I32, (1,), optional=True, scalar=True),
    Tensor("temperature", F32, (1,), optional=True, scalar=True),
    Tensor("len_penalty", F32, (1,), optional=True, scalar=True),
    Tensor("repetition_penalty", F32, (1,), optional=True, scalar=True),
    Tensor("presence_penalty", F32, (1,), optional=True, scalar=True),
    Tensor("frequency_penalty", F32, (1,), optional=True, scalar=True),
    Tensor("seed", U64, (1,), optional=True, scalar=True),
    Tensor("return_log_probs", BOOL, (1,), optional=True, scalar=True),
]
ENGINE_OUTPUTS = [
    Tensor("output_ids", I32, (-1, -1)),
    Tensor("sequence_length", I32, (-1,)),
    Tensor("cum_log_probs", F32, (-1,)),
    Tensor("output_log_probs", F32, (-1, -1)),
    Tensor("batch_index", I32, (1,)),
    Tensor("sequence_index", I32, (1,)),
]

POSTPROCESSING_INPUTS = [Tensor("TOKENS_BATCH", I32, (-1, -1)), Tensor("SEQUENCE_LENGTH", I32, (-1,))]
POSTPROCESSING_OUTPUTS = [Tensor("OUTPUT", S, (-1,))]

# Ensemble wiring: client input → (model, model input); engine client-facing sampling inputs.
PREPROCESSING_MAP = {"QUERY": "text_input", "MESSAGES": "messages", "REQUEST_OUTPUT_LEN": "max_tokens",
                     "BAD_WORDS_DICT": "bad_words", "STOP_WORDS_DICT": "stop_words", "END_ID": "end_id",
                     "PAD_ID": "pad_id"}
ENGINE_FROM_PREPROCESSING = {"input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN",
                             "request_output_len": "_REQUEST_OUTPUT_LEN", "stop_words_list": "_STOP_WORDS_IDS",
                             "bad_words_list": "_BAD_WORDS_IDS", "end_id": "_PREPROCESSOR_END_ID",
                             "pad_id": "_PREPROCESSOR_PAD_ID"}
ENGINE_FROM_CLIENT = {"runtime_top_k": "top_k", "runtime_top_p": "top_p", "temperature": "temperature",
                      "len_penalty": "length_penalty", "repetition_penalty": "repetition_penalty",
                      "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                      "min_tokens": "min_tokens", "beam_width": "beam_width",
                      "num_return_sequences": "num_return_sequences", "seed": "seed", "streaming": "stream",
                      "exclude_input_in_output": "exclude_input_in_output", "return_log_probs": "return_log_probs"}
PREPROCESSING_OUTPUT_NAMES = {"INPUT_ID": "_INPUT_ID", "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
                              "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN", "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
                              "STOP_WORDS_IDS": "_STOP_WORDS_IDS", "OUT_END_ID": "_PREPROCESSOR_END_ID",
                              "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID"}


@dataclass(frozen=True, kw_only=True)
class ServingConfig:
    """What Triton decides at serve time: batching, instances, queues, streaming. Validated on construction."""

    max_batch_size: int = 64  # Triton's batch limit per model; the engine batches on its own
    decoupled: bool = True  # streaming needs a decoupled engine (and then ensemble / BLS)
    preprocessing_instances: int = 2
    postprocessing_instances: int = 2
    bls_instances: int = 1
    bls_max_concurrency: int = 256  # requests one BLS instance runs at once
    max_queue_delay_microseconds: int = 0
    max_queue_size: int = 0  # engine queue limit; 0 = unbounded
    exclude_input_in_output: bool = True
    add_special_tokens: bool = True
    target_triton: tuple[int, int] = TESTED_TRITON

    def __post_init__(self):
        for name in ("max_batch_size", "preprocessing_instances", "postprocessing_instances", "bls_instances",
                     "bls_max_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue_delay_microseconds < 0 or self.max_queue_size < 0:
            raise ValueError("queue delay and queue size must be >= 0")


@dataclass(frozen=True, kw_only=True)
class EngineLimitsSpec:
    """The engine's request limits, shared by the tokenizer's checks and the engine."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int

    @property
    def max_output_len(self) -> int:
        return self.max_seq_len - 1


def _add_tensors(container, tensors: list[Tensor], *, is_input: bool) -> None:
    for tensor in tensors:
        entry = container.add()
        entry.name = tensor.name
        entry.data_type = tensor.dtype
        entry.dims.extend(tensor.dims)
        if tensor.scalar:
            entry.reshape.SetInParent()  # shape [] : the message present with no dims
        if is_input:
            entry.optional = tensor.optional
            entry.allow_ragged_batch = tensor.ragged


def _set_parameters(config: mc.ModelConfig, parameters: dict[str, str]) -> None:
    for key, value in parameters.items():
        if not isinstance(value, str):
            raise TypeError(f"parameter {key} must be a string, got {type(value).__name__}")
        config.parameters[key].string_value = value


def _python_model(name: str, max_batch_size: int) -> mc.ModelConfig:
    return mc.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)


def _cpu_instances(config: mc.ModelConfig, count: int) -> None:
    group = config.instance_group.add()
    group.kind = mc.ModelInstanceGroup.KIND_CPU
    group.count = count


def preprocessing_config(serving: ServingConfig, limits: EngineLimitsSpec, tokenizer_dir: str) -> mc.ModelConfig:
    config = _python_model("preprocessing", serving.max_batch_size)
    _add_tensors(config.input, PREPROCESSING_INPUTS, is_input=True)
    _add_tensors(config.output, PREPROCESSING_OUTPUTS, is_input=False)
    config.dynamic_batching.max_queue_delay_microseconds = serving.max_queue_delay_microseconds
    _cpu_instances(config, serving.preprocessing_instances)
    _set_parameters(config, {
        "tokenizer_dir": tokenizer_dir,
        "max_input_len": str(limits.max_input_len),
        "max_output_len": str(limits.max_output_len),
        "add_special_tokens": str(serving.add_special_tokens).lower(),
    })
    return config


def postprocessing_config(serving: ServingConfig, tokenizer_dir: str) -> mc.ModelConfig:
    config = _python_model("postprocessing", serving.max_batch_size)
    _add_tensors(config.input, POSTPROCESSING_INPUTS, is_input=True)
    _add_tensors(config.output, POSTPROCESSING_OUTPUTS, is_input=False)
    # Several instances decode the chunks of one stream; the scheduler returns them in arrival order.
    # No max_queue_size here: downstream of a decoupled step it hangs requests in Triton < 2.66.
    config.dynamic_batching.preserve_ordering = True
    _cpu_instances(config, serving.postprocessing_instances)
    _set_parameters(config, {"tokenizer_dir": tokenizer_dir})
    return config


def engine_config(serving: ServingConfig, *, backend: str, parameters: dict[str, str]) -> mc.ModelConfig:
    """The engine step: `tensorrtllm` (the real backend) or `python` (our transformers engine)."""
    config = mc.ModelConfig(name=ENGINE_MODEL, backend=backend, max_batch_size=serving.max_batch_size)
    config.model_transaction_policy.decoupled = serving.decoupled
    _add_tensors(config.input, ENGINE_INPUTS, is_input=True)
    _add_tensors(config.output, ENGINE_OUTPUTS, is_input=False)
    config.dynamic_batching.max_queue_delay_microseconds = serving.max_queue_delay_microseconds
    if serving.max_queue_size:
        config.dynamic_batching.default_queue_policy.max_queue_size = serving.max_queue_size
    # Both engines place themselves on GPUs: Triton sees one CPU instance.
    _cpu_instances(config, 1)
    _set_parameters(config, parameters)
    return config


def ensemble_config(serving: ServingConfig) -> mc.ModelConfig:
    config = mc.ModelConfig(name="ensemble", platform="ensemble", max_batch_size=serving.max_batch_size)
    if serving.target_triton >= MAX_INFLIGHT_SINCE:
        # Backpressure between steps (2.63+): without it a slow detokenizer lets responses pile up unbounded.
        config.ensemble_scheduling.max_inflight_requests = ENSEMBLE_MAX_INFLIGHT
    _add_tensors(config.input, CLIENT_INPUTS, is_input=True)
    _add_tensors(config.output, CLIENT_OUTPUTS, is_input=False)

    pre = config.ensemble_scheduling.step.add(model_name="preprocessing", model_version=-1)
    for model_input, client_input in PREPROCESSING_MAP.items():
        pre.input_map[model_input] = client_input
    for model_output, tensor in PREPROCESSING_OUTPUT_NAMES.items():
        pre.output_map[model_output] = tensor

    engine = config.ensemble_scheduling.step.add(model_name=ENGINE_MODEL, model_version=-1)
    for model_input, tensor in {**ENGINE_FROM_PREPROCESSING, **ENGINE_FROM_CLIENT}.items():
        engine.input_map[model_input] = tensor
    engine.output_map.update({"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH",
                              "cum_log_probs": "cum_log_probs", "output_log_probs": "output_log_probs",
                              "batch_index": "batch_index", "sequence_index": "sequence_index"})

    post = config.ensemble_scheduling.step.add(model_name="postprocessing", model_version=-1)
    post.input_map.update({"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"})
    post.output_map["OUTPUT"] = "text_output"
    return config


def bls_config(serving: ServingConfig, limits: EngineLimitsSpec, tokenizer_dir: str) -> mc.ModelConfig:
    config = _python_model("tensorrt_llm_bls", serving.max_batch_size)
    config.model_transaction_policy.decoupled = True
    _add_tensors(config.input, CLIENT_INPUTS, is_input=True)
    _add_tensors(config.output, CLIENT_OUTPUTS, is_input=False)
    _cpu_instances(config, serving.bls_instances)
    _set_parameters(config, {"tokenizer_dir": tokenizer_dir, "engine_model": ENGINE_MODEL,
                             "max_concurrency": str(serving.bls_max_concurrency),
                             "max_input_len": str(limits.max_input_len),
                             "max_output_len": str(limits.max_output_len),
                             "add_special_tokens": str(serving.add_special_tokens).lower()})
    return config


def to_text(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


def parse_text(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())

