"""Every model's `config.pbtxt`, built as `model_config_pb2.ModelConfig` objects and written as text format.

No templates: a value is either set on a typed field or the build fails, so no `${...}` can be left behind.
The tensor tables follow NVIDIA's `inflight_batcher_llm` models (docs/reference/tensors.md); ours adds the
optional `messages` input (chat) to the client-facing models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..facts import contract
from ..facts.contract import (
    BLS_MODEL,
    COALESCER_MODEL,
    ENGINE_MODEL,
    ENSEMBLE_MODEL,
    POSTPROCESSING_MODEL,
    PREPROCESSING_MODEL,
    Tensor,
)
from ..facts.limits import EngineLimits
from ..facts.model_parameters import (
    BLS_MAX_CONCURRENCY,
    COALESCER_MAX_RESPONSES_PER_SECOND,
    BlsParameters,
    CoalescerParameters,
    PostprocessingParameters,
    PreprocessingParameters,
)
from ..facts.settings import setting

FRONTENDS = ("ensemble", "bls")
# The Triton release our tests run (pytriton 0.7.0); configs for another target may use newer fields.
TESTED_TRITON = (2, 51)
MAX_INFLIGHT_SINCE = (2, 63)  # ModelEnsembling.max_inflight_requests; 2.51's parser rejects the field
ENSEMBLE_MAX_INFLIGHT = 64

@dataclass(frozen=True, kw_only=True)
class ServingConfig:
    """What Triton decides at serve time: batching, instances, queues, streaming. Validated on construction;
    each field that `tritonforge build` exposes declares its flag here (tritonforge/facts/settings.py)."""

    max_batch_size: int = setting(64, "Triton's batch limit per model (at least the engine's --max-batch-size); "
                                  "the engine batches on its own", flag="--triton-max-batch-size")
    decoupled: bool = setting(True, "deploy the engine non-decoupled (no streaming; allows unary gRPC/HTTP infer)",
                              flag="--no-streaming")
    # Instance counts: a TensorRT-LLM build plans all three from the GPU's batch unless one is given.
    preprocessing_instances: int = setting(2, "preprocessing model instances; TensorRT-LLM: planned unless given")
    postprocessing_instances: int = setting(2, "postprocessing model instances; TensorRT-LLM: planned unless given")
    bls_instances: int = setting(1, "BLS model instances; TensorRT-LLM: planned unless given")
    # Python engine-step instances (the replay engine only: it stands in for an engine that answers from C++,
    # and one Python stub cannot send a real engine's ~15k responses/s). The real engines run as one.
    engine_instances: int = setting(1, "--engine replay only: Python stubs sharing --max-batch-size, to send a real "
                                    "engine's response rate")
    # The transformers engine on several GPUs (build --gpus): one instance on each of these GPUs, Triton handing
    # each its device. Empty: `engine_instances` CPU-kind instances, the engine placing itself (--device).
    engine_gpus: tuple[int, ...] = ()
    bls_max_concurrency: int = setting(BLS_MAX_CONCURRENCY, "requests one BLS instance runs at once")
    max_queue_delay_microseconds: int = setting(0, "preprocessing and engine queue delay",
                                                flag="--max-queue-delay-us")
    # Postprocessing's own: a short delay gathers more streamed chunks into one execution. With ordering kept,
    # fewer executions also mean fewer turns at Triton's ordered-send lock, but a stream's first and last
    # chunks wait it too, and the last one holds back the stream's next request: 1 ms kept as much as 3 ms at
    # one response a token, and 3 ms lost 0.08 of the engine at three tokens a response
    # (bench/results/gpu-postprocessing-variants/, bench/results/gpu-ensemble-defaults/).
    postprocessing_delay_microseconds: int = setting(
        1000, "postprocessing queue delay: gathers streamed chunks into fewer executions",
        flag="--postprocessing-delay-us")
    # Responses in arrival order across postprocessing instances, so a stream's chunks can never swap.
    # Triton sends such responses one at a time under one lock for the whole model (the ensemble's ceiling at
    # a real engine's rate: docs/performance.md#at-a-real-engines-rate-the-h200-machine); NVIDIA's config leaves it off.
    postprocessing_preserve_ordering: bool = setting(
        True, "let postprocessing instances answer out of arrival order (NVIDIA's setting): faster, but a stream's "
        "chunks may swap under overload (docs/performance.md)", flag="--postprocessing-unordered")
    max_queue_size: int = setting(0, "engine queue limit (0 = unbounded)")
    # The ensemble's engine step through the coalescer (a C++ backend calling the engine in-process): Triton's
    # ensemble carries a limited number of responses a second, fewer than a real engine sends at one token a
    # response; the coalescer folds the tokens that wait into one response under load (docs/performance.md).
    coalescer: bool = setting(True, "wire the ensemble's engine step straight to the engine, without the coalescer "
                              "that folds streamed tokens into fewer responses under load (needs a C++ compiler)",
                              flag="--no-coalescer")
    coalescer_max_responses_per_second: int = setting(
        COALESCER_MAX_RESPONSES_PER_SECOND, "the coalescer's budget of responses a second to the ensemble, past "
        "which a request's waiting tokens go out together (0 = every response at once)")
    exclude_input_in_output: bool = setting(True, "echo the prompt in non-streamed output by default",
                                            flag="--include-input-in-output")
    add_special_tokens: bool = True
    # Our `messages` input on the ensemble, the BLS and preprocessing. False: the wiring is exactly NVIDIA's,
    # so NVIDIA's preprocessing, postprocessing, BLS and ensemble config can each replace ours.
    messages_input: bool = setting(True, "wire the ensemble exactly as NVIDIA's (no `messages` input), so that "
                                   "NVIDIA's preprocessing, postprocessing, BLS and ensemble config can each replace "
                                   "ours", flag="--nvidia-wiring")
    target_triton: tuple[int, int] = TESTED_TRITON

    def __post_init__(self):
        for name in ("max_batch_size", "preprocessing_instances", "postprocessing_instances", "bls_instances",
                     "engine_instances", "bls_max_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_queue_delay_microseconds", "postprocessing_delay_microseconds", "max_queue_size",
                     "coalescer_max_responses_per_second"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        object.__setattr__(self, "engine_gpus", tuple(self.engine_gpus))  # a manifest's JSON list reads back
        if any(gpu < 0 for gpu in self.engine_gpus) or len(set(self.engine_gpus)) < len(self.engine_gpus):
            raise ValueError(f"engine_gpus must be distinct GPU ids >= 0, got {list(self.engine_gpus)}")
        if self.engine_gpus and self.engine_instances > 1:
            raise ValueError("engine_gpus places one engine instance on each GPU: engine_instances must stay 1")


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


def preprocessing_config(serving: ServingConfig, limits: EngineLimits, tokenizer_dir: str) -> mc.ModelConfig:
    config = _python_model(PREPROCESSING_MODEL, serving.max_batch_size)
    _add_tensors(config.input, contract.preprocessing_inputs(messages=serving.messages_input), is_input=True)
    _add_tensors(config.output, contract.PREPROCESSING_OUTPUTS, is_input=False)
    config.dynamic_batching.max_queue_delay_microseconds = serving.max_queue_delay_microseconds
    _cpu_instances(config, serving.preprocessing_instances)
    _set_parameters(config, PreprocessingParameters(
        tokenizer_dir=tokenizer_dir, max_input_len=limits.max_input_len, max_seq_len=limits.max_seq_len,
        add_special_tokens=serving.add_special_tokens).to_config())
    return config


def postprocessing_config(serving: ServingConfig, tokenizer_dir: str, backend: str = "python") -> mc.ModelConfig:
    """The detokenizer: the Python model or its C++ twin (`backend`), one config for both."""
    config = mc.ModelConfig(name=POSTPROCESSING_MODEL, backend=backend, max_batch_size=serving.max_batch_size)
    _add_tensors(config.input, contract.postprocessing_inputs(messages=serving.messages_input), is_input=True)
    _add_tensors(config.output, contract.postprocessing_outputs(messages=serving.messages_input), is_input=False)
    # No max_queue_size here: downstream of a decoupled step it hangs requests in Triton < 2.66.
    config.dynamic_batching.preserve_ordering = serving.postprocessing_preserve_ordering
    config.dynamic_batching.max_queue_delay_microseconds = serving.postprocessing_delay_microseconds
    _cpu_instances(config, serving.postprocessing_instances)
    _set_parameters(config, PostprocessingParameters(tokenizer_dir=tokenizer_dir).to_config())
    return config


def engine_config(serving: ServingConfig, *, backend: str, parameters: dict[str, str]) -> mc.ModelConfig:
    """The engine step: `tensorrtllm` (the real backend) or `python` (our transformers engine)."""
    config = mc.ModelConfig(name=ENGINE_MODEL, backend=backend, max_batch_size=serving.max_batch_size)
    config.model_transaction_policy.decoupled = serving.decoupled
    _add_tensors(config.input, contract.engine_inputs(messages=serving.messages_input), is_input=True)
    _add_tensors(config.output, contract.engine_outputs(messages=serving.messages_input), is_input=False)
    config.dynamic_batching.max_queue_delay_microseconds = serving.max_queue_delay_microseconds
    if serving.max_queue_size:
        config.dynamic_batching.default_queue_policy.max_queue_size = serving.max_queue_size
    if serving.engine_gpus:
        # One instance on each GPU, count 1 a GPU: Triton passes each its device (`model_instance_device_id`).
        group = config.instance_group.add()
        group.kind = mc.ModelInstanceGroup.KIND_GPU
        group.count = 1
        group.gpus.extend(serving.engine_gpus)
    else:
        # The engines place themselves on GPUs: Triton sees CPU instances (one, but for the replay engine).
        _cpu_instances(config, serving.engine_instances)
    _set_parameters(config, parameters)
    return config


def coalesces(serving: ServingConfig) -> bool:
    """Whether the ensemble's engine step is the coalescer: asked for, and the engine streams."""
    return serving.coalescer and serving.decoupled


def engine_step_model(serving: ServingConfig) -> str:
    return COALESCER_MODEL if coalesces(serving) else ENGINE_MODEL


def coalescer_config(serving: ServingConfig, backend: str) -> mc.ModelConfig:
    """The ensemble's engine step in front of the engine: the engine's tensors, decoupled, one instance (its
    Execute only starts engine requests; its one sender thread keeps each stream's order)."""
    config = mc.ModelConfig(name=COALESCER_MODEL, backend=backend, max_batch_size=serving.max_batch_size)
    config.model_transaction_policy.decoupled = True
    # Without the engine's `reshape`: the coalescer passes each input on with the shape it sees, which must be
    # the one the engine's config expects before its own reshape ([batch, 1] for a scalar).
    unreshaped = [dataclasses.replace(tensor, scalar=False)
                  for tensor in contract.engine_inputs(messages=serving.messages_input)]
    _add_tensors(config.input, unreshaped, is_input=True)
    _add_tensors(config.output, contract.engine_outputs(messages=serving.messages_input), is_input=False)
    _cpu_instances(config, 1)
    _set_parameters(config, CoalescerParameters(
        tensorrt_llm_model_name=ENGINE_MODEL,
        max_responses_per_second=serving.coalescer_max_responses_per_second).to_config())
    return config


def ensemble_config(serving: ServingConfig) -> mc.ModelConfig:
    config = mc.ModelConfig(name=ENSEMBLE_MODEL, platform="ensemble", max_batch_size=serving.max_batch_size)
    if serving.target_triton >= MAX_INFLIGHT_SINCE:
        # Backpressure between steps (2.63+): without it a slow detokenizer lets responses pile up unbounded.
        config.ensemble_scheduling.max_inflight_requests = ENSEMBLE_MAX_INFLIGHT
    _add_tensors(config.input, contract.ensemble_inputs(messages=serving.messages_input), is_input=True)
    _add_tensors(config.output, contract.ensemble_outputs(messages=serving.messages_input), is_input=False)

    pre = config.ensemble_scheduling.step.add(model_name=PREPROCESSING_MODEL, model_version=-1)
    wiring = {**contract.PREPROCESSING_FROM_CLIENT, **(contract.MESSAGES_WIRING if serving.messages_input else {})}
    pre.input_map.update(wiring)
    pre.output_map.update(contract.PREPROCESSING_TO_ENSEMBLE)

    engine = config.ensemble_scheduling.step.add(model_name=engine_step_model(serving), model_version=-1)
    engine.input_map.update({**contract.ENGINE_FROM_PREPROCESSING, **contract.ENGINE_FROM_CLIENT})
    engine.output_map.update(contract.ENGINE_TOKEN_OUTPUTS)
    engine.output_map.update({tensor.name: tensor.name for tensor in contract.ENGINE_PASSTHROUGH_OUTPUTS})

    post = config.ensemble_scheduling.step.add(model_name=POSTPROCESSING_MODEL, model_version=-1)
    post.input_map.update(contract.POSTPROCESSING_FROM_ENSEMBLE)
    post.output_map.update(contract.POSTPROCESSING_TO_CLIENT)
    if serving.messages_input:  # our wiring: log probabilities with their alternatives
        engine.input_map.update(contract.ENGINE_LOG_PROBS_FROM_CLIENT)
        engine.output_map.update(contract.ENGINE_LOG_PROB_OUTPUTS_TO_ENSEMBLE)
        post.input_map.update(contract.POSTPROCESSING_LOG_PROBS_FROM_ENSEMBLE)
        post.output_map.update(contract.POSTPROCESSING_LOG_PROBS_TO_CLIENT)
    return config


def bls_config(serving: ServingConfig, limits: EngineLimits, tokenizer_dir: str, backend: str = "python"
               ) -> mc.ModelConfig:
    """The BLS: the Python model or its C++ twin (`backend`), one config for both."""
    config = mc.ModelConfig(name=BLS_MODEL, backend=backend, max_batch_size=serving.max_batch_size)
    # Non-decoupled, it answers one response per request through its response sender (Triton >= 23.10).
    config.model_transaction_policy.decoupled = serving.decoupled
    _add_tensors(config.input, contract.bls_inputs(messages=serving.messages_input), is_input=True)
    _add_tensors(config.output, contract.bls_outputs(messages=serving.messages_input), is_input=False)
    _cpu_instances(config, serving.bls_instances)
    _set_parameters(config, BlsParameters(
        tokenizer_dir=tokenizer_dir, tensorrt_llm_model_name=ENGINE_MODEL, max_concurrency=serving.bls_max_concurrency,
        max_input_len=limits.max_input_len, max_seq_len=limits.max_seq_len,
        add_special_tokens=serving.add_special_tokens).to_config())
    return config


def to_text(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


def parse_text(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())

