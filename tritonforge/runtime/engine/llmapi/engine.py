"""The engine step on TensorRT-LLM's PyTorch workflow: `tensorrt_llm.LLM` runs the Hugging Face checkpoint
itself (no engine build), and this engine feeds it the requests of the `tensorrt_llm` model.

It answers through `EngineService` like the transformers and replay engines, so the tensors, response flags,
`stop` input and cancellation are the tensorrtllm backend's; what it does is turn one `GenerationRequest`
into one `LLM.generate_async` call and the call's results back into the request's sink.

The calls, as the LLM API of the 1.x line defines them, read in NVIDIA/TensorRT-LLM as stored (the v1.2.1 tag
itself could not be resolved): `tensorrt_llm/llmapi/llm.py` @4c05a748 (`LLM.__init__`: named `model`,
`skip_tokenizer_init`, `trust_remote_code`, `tensor_parallel_size`, `dtype`, the rest checked against the
`TorchLlmArgs` fields; `generate_async`), `tensorrt_llm/sampling_params.py` @a98a9061 (every field used below,
`top_k=1` greedy), `tensorrt_llm/executor/result.py` (`CompletionOutput`), `tensorrt_llm/llmapi/__init__.py`
(`LLM`, `SamplingParams`, `KvCacheConfig`), and NVIDIA's own `triton_backend/all_models/llmapi` model
(`1/model.py` @b35ac1b6, version 1.2.0rc2), which makes the same calls:
- `LLM(model=..., skip_tokenizer_init=True, ...)`: preprocessing tokenizes, so the LLM needs no tokenizer but
  for guided decoding (below); every `SamplingParams` names its `end_id` (without a tokenizer the LLM cannot
  fill it in), -1 when the request has none, which is the backend's default: EOS does not end the generation;
- guided decoding: `LLM(..., tokenizer=<folder>, guided_decoding_backend="xgrammar")` where the build names the
  tokenizer (the LLM builds xgrammar's tokenizer info from it: `get_guided_decoding_config` in
  `_torch/pyexecutor/py_executor_creator.py`, as stored, asserts a tokenizer), and per request
  `SamplingParams(guided_decoding=GuidedDecodingParams(json_object= | json= | regex= | grammar= |
  structural_tag=))` (`tensorrt_llm/sampling_params.py` @a98a9061, exported by `tensorrt_llm.llmapi`); the
  prompt still arrives as token ids and `detokenize=False`, so the tokenizer changes nothing else;
- `generate_async({"prompt_token_ids": ids}, sampling_params=..., streaming=...)`, called on the event loop
  that iterates the result (the result binds its queue to the loop it is created on);
- `async for output in result`: `output.finished`, `output.outputs[0].token_ids` (all tokens generated so
  far), `.logprobs` (per token: a float, or a dict of token id to an object with `.logprob`),
  `.finish_reason` (`length`, `stop`, `cancelled`, `timeout`);
- `result.abort()` stops a request (cancellation and the `stop` input); `LLM.shutdown()` at unload;
- LoRA (build --lora): `LLM(..., lora_config=LoraConfig(lora_dir=[...], max_lora_rank=, max_loras=, max_cpu_loras=,
  lora_target_modules=[...]))` and per request `generate_async(..., lora_request=LoRARequest(name, task_id, path))`,
  the LLM loading the PEFT folder on first use (`tensorrt_llm/lora_helper.py` @037d4ba1 `LoraConfig`,
  `tensorrt_llm/executor/request.py` `LoRARequest`, imported from `tensorrt_llm.lora_manager` and
  `tensorrt_llm.executor.request` as NVIDIA's LoRA guide, features/lora.md @050db34b, does). With one folder the LLM
  reads the modules from it, with several it needs them named (`_torch/pyexecutor/_util.py` as stored): they are
  named always, q/k/v completed, so that it fills no k or v of its own (it would with the hidden size, wrong for a
  model with fewer key-value heads).

Stop sequences are matched here, on the generated token ids (the LLM API takes multi-token stop words only
as strings, which need its tokenizer); a match aborts the request and keeps the matched tokens, as the
tensorrtllm backend does. Bad words are single tokens (`bad_token_ids`); a multi-token bad word is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ....facts.contract import BAD_WORDS_LIST, GUIDED_DECODING_GUIDE_TYPE, LORA_TASK_ID, RETURN_PROMPT_LOG_PROBS
from ....facts.errors import EngineShuttingDown, RequestError, UnsupportedError
from ....facts.limits import EngineLimits
from ....facts.model_parameters import PyTorchEngineParameters
from ....facts.trtllm_lora import target_modules, trtllm_module
from ..generation import EngineStats, GenerationRequest, GenerationResult, TopTokens, check_limits
from ..guided import EBNF_GRAMMAR, JSON, JSON_SCHEMA, REGEX, STRUCTURAL_TAG, GuidedDecoding
from ..lora import AdapterRecord, read_adapter

logger = logging.getLogger(__name__)

NO_END_ID = -1  # the tensorrtllm backend's default end id: EOS does not end the generation
GUIDED_DECODING_BACKEND = "xgrammar"  # what the tensorrtllm backend's guided decoding runs on too
# A guide type → the field of the LLM API's GuidedDecodingParams that carries it (`json` sets json_object).
GUIDE_FIELDS = {JSON_SCHEMA: "json", REGEX: "regex", EBNF_GRAMMAR: "grammar", STRUCTURAL_TAG: "structural_tag"}


class LlmApiMissing(RuntimeError):
    pass


def load_llm_api():
    """`tensorrt_llm.llmapi`, or one clear line saying where it runs."""
    from ....facts.release import TRITON_IMAGE, TRTLLM_VERSION

    try:
        api = importlib.import_module("tensorrt_llm.llmapi")
    except ImportError as error:
        raise LlmApiMissing(
            f"TensorRT-LLM is not installed here ({error.name or 'tensorrt_llm'} cannot be imported): the "
            f"tensorrtllm-pytorch engine runs in {TRITON_IMAGE} (TensorRT-LLM {TRTLLM_VERSION})") from None
    if getattr(importlib.import_module("tensorrt_llm"), "IS_TEST_DOUBLE", False):
        logger.warning("tensorrt_llm is the project's TEST DOUBLE, not TensorRT-LLM: it computes nothing")
    return api


def load_lora_api():
    """TensorRT-LLM's (LoraConfig, LoRARequest)."""
    return (importlib.import_module("tensorrt_llm.lora_manager").LoraConfig,
            importlib.import_module("tensorrt_llm.executor.request").LoRARequest)


_BUILT = PyTorchEngineParameters  # the model parameters a build writes: their defaults are these settings'


@dataclass(frozen=True, kw_only=True)
class LlmApiSettings:
    """The `LLM(...)` arguments a build chooses (`model_parameters.PyTorchEngineParameters` carries them)."""

    model_path: str  # the Hugging Face checkpoint, absolute
    tokenizer_dir: str = ""  # the model's tokenizer, absolute: guided decoding needs it; "": none, and no guides
    dtype: str = _BUILT.dtype  # auto | float16 | bfloat16 | float32; quantization is read from the checkpoint
    kv_cache_dtype: str = _BUILT.kv_cache_dtype  # auto | fp8
    tensor_parallel_size: int = _BUILT.tensor_parallel_size
    pipeline_parallel_size: int = _BUILT.pipeline_parallel_size
    kv_cache_free_gpu_memory_fraction: float = _BUILT.kv_cache_free_gpu_memory_fraction
    max_num_tokens: int = _BUILT.max_num_tokens
    enable_block_reuse: bool = _BUILT.enable_block_reuse
    enable_chunked_prefill: bool = _BUILT.enable_chunked_prefill
    stream_interval: int = _BUILT.stream_interval
    lora_adapters: tuple[AdapterRecord, ...] = ()  # paths absolute


def lora_arguments(adapters: tuple[AdapterRecord, ...]) -> dict:
    """The keyword arguments of `LoraConfig(...)`: every adapter's folder, the largest rank, TensorRT-LLM's modules
    any adapter adapts (q/k/v completed), and room for every adapter on the GPU and in the host cache."""
    read = [read_adapter(record.name, Path(record.path)) for record in adapters]
    modules = {trtllm_module(adapter.name, name) for adapter in read for name in adapter.target_modules}
    return {"lora_dir": [record.path for record in adapters], "max_lora_rank": max(a.max_rank for a in read),
            "max_loras": len(adapters), "max_cpu_loras": len(adapters), "lora_target_modules": target_modules(modules)}


def llm_arguments(api, settings: LlmApiSettings, limits: EngineLimits, lora_config=None) -> dict:
    """The keyword arguments of `LLM(...)`: every one a field of the LLM API's `TorchLlmArgs` at 1.2."""
    if settings.tokenizer_dir:
        tokenizer = {"tokenizer": settings.tokenizer_dir, "skip_tokenizer_init": False,
                     "guided_decoding_backend": GUIDED_DECODING_BACKEND}
    else:
        tokenizer = {"skip_tokenizer_init": True}
    return {
        "model": settings.model_path,
        **tokenizer,
        "trust_remote_code": False,
        "dtype": settings.dtype,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "pipeline_parallel_size": settings.pipeline_parallel_size,
        "max_batch_size": limits.max_batch_size,
        "max_input_len": limits.max_input_len,
        "max_seq_len": limits.max_seq_len,
        "max_num_tokens": settings.max_num_tokens,
        "enable_chunked_prefill": settings.enable_chunked_prefill,
        "stream_interval": settings.stream_interval,
        "kv_cache_config": api.KvCacheConfig(
            free_gpu_memory_fraction=settings.kv_cache_free_gpu_memory_fraction,
            enable_block_reuse=settings.enable_block_reuse, dtype=settings.kv_cache_dtype),
        **({"lora_config": lora_config} if lora_config is not None else {}),
    }


def sampling_arguments(request: GenerationRequest) -> dict:
    """The keyword arguments of `SamplingParams(...)` for one request, with the tensorrtllm backend's meaning:
    greedy unless the request samples (`sampling.greedy`), penalties only when set."""
    sampling = request.sampling
    end_id = NO_END_ID if request.end_id is None else request.end_id
    arguments = {"max_tokens": request.max_new_tokens, "end_id": end_id, "pad_id": end_id, "detokenize": False}
    if sampling.greedy:
        arguments["top_k"] = 1
    else:
        arguments.update(temperature=sampling.temperature, top_p=sampling.top_p)
        if sampling.top_k > 0:
            arguments["top_k"] = sampling.top_k
    if sampling.seed is not None:
        arguments["seed"] = sampling.seed
    if sampling.min_tokens:
        arguments["min_tokens"] = sampling.min_tokens
    for name, unset in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
        if getattr(sampling, name) != unset:
            arguments[name] = getattr(sampling, name)
    if request.bad_sequences:
        arguments["bad_token_ids"] = [sequence[0] for sequence in request.bad_sequences]
    if request.embedding_bias is not None:
        import torch

        arguments["embedding_bias"] = torch.from_numpy(request.embedding_bias)
    if request.return_log_probs or request.num_top_log_probs:
        # The LLM API's `logprobs`: per token, the top N candidates and the sampled one (at least 1: the latter).
        arguments["logprobs"] = max(1, request.num_top_log_probs)
    return arguments


def guided_decoding_params(api, guided: GuidedDecoding):
    """The LLM API's `GuidedDecodingParams` of a request's guide."""
    if guided.guide_type == JSON:
        return api.GuidedDecodingParams(json_object=True)
    return api.GuidedDecodingParams(**{GUIDE_FIELDS[guided.guide_type]: guided.guide})


def _log_probs(tokens: list[int], logprobs) -> list[float]:
    """One log probability per token: the LLM API gives floats, or per token a dict of candidates."""
    if not logprobs:
        return [0.0] * len(tokens)
    values = []
    for token, entry in zip(tokens, logprobs):
        if isinstance(entry, dict):
            chosen = entry.get(token)
            values.append(float(chosen.logprob) if chosen is not None else 0.0)
        else:
            values.append(float(entry))
    return values + [0.0] * (len(tokens) - len(values))


def _top_tokens(tokens: list[int], logprobs, count: int) -> list[TopTokens]:
    """The `count` likeliest candidates at each token's step, from the LLM API's per-token dicts of
    {token id: Logprob}, which hold the top N and the sampled token."""
    top = []
    for index in range(len(tokens)):
        entry = logprobs[index] if index < len(logprobs) else None
        candidates = sorted(entry.items(), key=lambda item: -float(item[1].logprob))[:count] \
            if isinstance(entry, dict) else []
        top.append(TopTokens([int(token) for token, _ in candidates],
                             [float(value.logprob) for _, value in candidates]))
    return top


def _stop_match(tokens: list[int], sequences: list[list[int]]) -> int | None:
    """Where the earliest stop sequence found in `tokens` ends (its tokens kept), or None."""
    ends = [end for sequence in sequences if sequence
            for end in range(len(sequence), len(tokens) + 1) if tokens[end - len(sequence):end] == sequence]
    return min(ends) if ends else None


@dataclass(eq=False)
class _Running:
    request: GenerationRequest
    on_end: Callable[[], None]  # the engine counts it out
    result: object = None  # the LLM API's RequestOutput, once generate_async returned
    seen: int = 0  # tokens of the LLM's output taken so far (an end id among them)
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    top: list[TopTokens] = field(default_factory=list)  # with num_top_log_probs
    done: bool = False

    def end(self, reason: str | None, error: Exception | None = None) -> None:
        """Finish the request once: with its tokens and `reason`, or with `error`."""
        if self.done:
            return
        self.done = True
        self.on_end()
        if error is not None:
            self.request.sink.finish(None, error)
        else:
            top = self.top if self.request.num_top_log_probs else None
            self.request.sink.finish(GenerationResult(self.tokens, self.log_probs, reason, top), None)

    def abort(self) -> None:
        if self.result is not None:
            try:
                self.result.abort()
            except Exception:  # noqa: BLE001 - the request ends here either way
                logger.exception("aborting a request of the LLM API failed")


_FINISH_REASONS = {"length": "length", "stop": "end_id", "cancelled": "cancelled", "timeout": "cancelled"}


class LlmApiEngine:
    """Same interface as `InflightBatchingEngine`: validate, submit, cancel, pending, stats, shutdown.

    The LLM batches in flight on its own; this class only keeps one asyncio loop (its own thread) where
    every request's `generate_async` is called and iterated, and checks cancellations every
    `check_period_s` (a client's `is_cancelled()`, which the sink rate-limits)."""

    def __init__(self, api, settings: LlmApiSettings, limits: EngineLimits, *, vocab_size: int,
                 check_period_s: float = 0.1):
        self.api = api
        self.guided = bool(settings.tokenizer_dir)  # the LLM was made with a tokenizer and xgrammar
        self.limits = limits
        self.vocab_size = vocab_size
        self.check_period_s = check_period_s
        self.adapters = {record.task_id: record for record in settings.lora_adapters}
        lora_config = None
        if self.adapters:
            lora_config_class, self._lora_request = load_lora_api()
            lora_config = lora_config_class(**lora_arguments(settings.lora_adapters))
        self.llm = api.LLM(**llm_arguments(api, settings, limits, lora_config))
        self.stats = EngineStats()
        self._running: dict[str, list[_Running]] = {}  # by Triton request id ("" for anonymous): loop only
        # Requests submitted and not yet ended. The LLM queues those beyond its max_batch_size itself; they are
        # this engine's "waiting", which `max_queue_size` bounds as for the other engines.
        self._in_flight = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llmapi-engine", daemon=True)
        self._thread.start()
        self._watcher = asyncio.run_coroutine_threadsafe(self._watch_cancellations(), self._loop)

    @classmethod
    def for_model(cls, parameters, settings, api=None) -> LlmApiEngine:
        """The engine of a `tensorrt_llm` model: its typed parameters (`PyTorchEngineParameters`) and the
        `EngineSettings` made from them (limits, the checkpoint's absolute path, the cancellation period)."""
        own = ("model_path", "tokenizer_dir", "lora_adapters")  # what the settings resolved (absolute paths)
        llm = LlmApiSettings(**{name: getattr(settings, name) for name in own},
                             **{item.name: getattr(parameters, item.name) for item in dataclasses.fields(LlmApiSettings)
                                if item.name not in own})
        return cls(api or load_llm_api(), llm, settings.limits, vocab_size=parameters.vocab_size,
                   check_period_s=settings.cancellation_check_period_ms / 1000)

    # ---- client side (any thread) -------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        check_limits(request, self.limits, vocab_size=self.vocab_size, pending=self.pending())
        if any(len(sequence) > 1 for sequence in request.bad_sequences):
            raise UnsupportedError(BAD_WORDS_LIST, "the tensorrtllm-pytorch engine bans single tokens only "
                                                     "(the LLM API's bad_token_ids); a bad word here has several")
        if request.return_prompt_log_probs:
            raise UnsupportedError(RETURN_PROMPT_LOG_PROBS, "the prompt's log probabilities are not served by the "
                                                            "tensorrtllm-pytorch engine yet; use the transformers "
                                                            "engine")
        if request.guided_decoding is not None and not self.guided:
            raise UnsupportedError(GUIDED_DECODING_GUIDE_TYPE, "guided decoding needs the LLM's tokenizer, which "
                                                               "this repository's build did not name: rebuild it")
        if request.lora_task_id is not None and request.lora_task_id not in self.adapters:
            known = ", ".join(f"{task} ({record.name})" for task, record in sorted(self.adapters.items()))
            raise RequestError(LORA_TASK_ID, f"no LoRA adapter has task id {request.lora_task_id} in this engine; its "
                                             f"adapters: {known or 'none (tritonforge build --lora NAME=PATH)'}")

    def submit(self, request: GenerationRequest) -> None:
        with self._lock:
            self._in_flight += 1
        # Registered by a callback, not inside the request's task: callbacks run in the order they were made,
        # so a `stop` sent after this submit always finds the request.
        self._loop.call_soon_threadsafe(self._start, _Running(request, self._ended))

    def cancel(self, request_id: str, taken=None) -> None:
        self._loop.call_soon_threadsafe(self._cancel, request_id, taken)

    def pending(self) -> int:
        with self._lock:
            return max(0, self._in_flight - self.limits.max_batch_size)

    def shutdown(self) -> None:
        async def stop():
            for running in [r for group in self._running.values() for r in group]:
                running.abort()
                running.end(None, EngineShuttingDown())
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:  # the cancellation watcher, and requests still iterating their results
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=30)
        try:
            self.llm.shutdown()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    # ---- the engine's loop ----------------------------------------------------------------------------------

    def _publish(self) -> None:
        running = [r for group in self._running.values() for r in group]
        with self._lock:
            in_flight = self._in_flight
        self.stats = EngineStats(waiting=self.pending(), scheduled=min(in_flight, self.limits.max_batch_size),
                                 kv_tokens=sum(len(r.request.prompt_ids) + len(r.tokens) for r in running))

    def _cancel(self, request_id: str, taken) -> None:
        for running in list(self._running.get(request_id, [])):
            running.abort()
            running.end("cancelled")
        if taken is not None:
            taken()

    async def _watch_cancellations(self) -> None:
        while True:
            await asyncio.sleep(self.check_period_s)
            for running in [r for group in self._running.values() for r in group]:
                if not running.done and running.request.sink.cancelled():
                    running.abort()
                    running.end("cancelled")

    def _ended(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _start(self, running: _Running) -> None:
        self._running.setdefault(running.request.request_id, []).append(running)
        self._loop.create_task(self._generate(running))

    async def _generate(self, running: _Running) -> None:
        request = running.request
        try:
            if running.done:  # stopped before it started
                return
            if request.sink.cancelled():
                running.end("cancelled")
                return
            arguments = sampling_arguments(request)
            if request.guided_decoding is not None:
                arguments["guided_decoding"] = guided_decoding_params(self.api, request.guided_decoding)
            params = self.api.SamplingParams(**arguments)
            adapter = self.adapters.get(request.lora_task_id)
            lora = None if adapter is None else self._lora_request(adapter.name, adapter.task_id, adapter.path)
            running.result = self.llm.generate_async({"prompt_token_ids": list(request.prompt_ids)},
                                                     sampling_params=params, lora_request=lora,
                                                     streaming=request.stream)
            request.sink.scheduled()
            self._publish()
            reason = None
            async for output in running.result:
                if running.done:  # cancelled or stopped meanwhile: the rest of the LLM's answer is dropped
                    break
                self._take(running, output)
                reason = output.outputs[0].finish_reason
                if running.done or output.finished:
                    break
            running.end(_FINISH_REASONS.get(reason, "length"))
        except Exception as error:  # noqa: BLE001 - a failed request ends with its error, the loop goes on
            logger.exception("the LLM API failed a request")
            running.end(None, error)
        finally:
            group = self._running.get(request.request_id, [])
            if running in group:
                group.remove(running)
            if not group:
                self._running.pop(request.request_id, None)
            self._publish()

    def _take(self, running: _Running, output) -> None:
        """One output of the LLM: record its new tokens; stream them unless they end the request."""
        completion = output.outputs[0]
        new = list(completion.token_ids[running.seen:])
        candidates = list(completion.logprobs or [])[running.seen:]
        new_log_probs = _log_probs(new, candidates)
        request = running.request
        new_top = _top_tokens(new, candidates, request.num_top_log_probs) if request.num_top_log_probs else None
        running.seen += len(new)
        if request.end_id is not None and new and new[-1] == request.end_id:
            new, new_log_probs = new[:-1], new_log_probs[:-1]  # the end id is not an output token
            new_top = None if new_top is None else new_top[:-1]
        running.tokens += new
        running.log_probs += new_log_probs
        running.top += new_top or []
        stop_end = _stop_match(running.tokens, request.stop_sequences)
        if stop_end is not None:  # the first match: an earlier one would have ended the request already
            del running.tokens[stop_end:], running.log_probs[stop_end:], running.top[stop_end:]
            running.abort()
            running.end("stop_words")
            return
        if request.stream and not output.finished and new:
            request.sink.tokens(new, new_log_probs, new_top)
