"""TEST DOUBLE of `tensorrt_llm.llmapi` at TensorRT-LLM 1.2: the calls tritonforge makes, with their signatures.

Mirrored from the 1.2-era sources: `LLM.__init__` and `LLM.generate_async` (tensorrt_llm/llmapi/llm.py: the
inputs may be a dict with `prompt_token_ids`; without a tokenizer `end_id` must be given, else ValueError; a
prompt over `max_num_tokens` without chunked prefill is refused), `SamplingParams` (keyword-only; the fields
used), `GuidedDecodingParams` (tensorrt_llm/sampling_params.py: one guide of json, regex, grammar, json_object,
structural_tag), `KvCacheConfig` (free_gpu_memory_fraction in [0, 1]), the result (`RequestOutput`: async iteration in
the loop that created it, `finished`, `outputs[i].token_ids` growing, `logprobs` as one dict per token of
token id → object with `.logprob` as the PyTorch backend gives them, the top `SamplingParams.logprobs` candidates
(here the sampled token, then the ids after it), `finish_reason`, `abort()`).

What it generates: `double_tokens(prompt, n, ...)`, one token every STEP_S, `stream_interval` tokens per
streamed output; a guide constrains nothing here. As the real LLM: `guided_decoding_backend` without a tokenizer
fails (`get_guided_decoding_config` asserts one); a `lora_config` with other than one `lora_dir` must name its
`lora_target_modules` (`_torch/pyexecutor/_util.py` asserts it). Unknown here, so chosen and stated: an end id that
ends the generation is included in `token_ids`; a guided request to an LLM made without `guided_decoding_backend`,
and a request with a `lora_request` to an LLM made without `lora_config`, are refused with ValueError. A LoRA
adapter changes nothing the double generates; `lora_requests` records each request's.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field

STEP_S = 0.004  # one "decoding step" of the double

# The keyword arguments of LLM(...) beyond its named parameters that tritonforge passes: each a field of the
# LLM API's TorchLlmArgs. The real LLM refuses a key that is no field with "LLM got invalid argument: <key>";
# the double, stricter, refuses any key tritonforge is not known to pass.
_LLM_FIELDS = {"pipeline_parallel_size", "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
               "enable_chunked_prefill", "stream_interval", "kv_cache_config", "guided_decoding_backend",
               "lora_config"}
GUIDED_DECODING_BACKENDS = ("xgrammar", "llguidance")  # TorchLlmArgs.guided_decoding_backend's values


@dataclass(kw_only=True)
class KvCacheConfig:
    free_gpu_memory_fraction: float | None = 0.9
    enable_block_reuse: bool = True
    dtype: str = "auto"

    def __post_init__(self):
        if self.free_gpu_memory_fraction is not None and not 0 <= self.free_gpu_memory_fraction <= 1:
            raise ValueError("kv_cache_config.free_gpu_memory_fraction must be a float between 0 and 1")


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    json: str | dict | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self):
        guides = sum(bool(getattr(self, name)) for name in self.__slots__)
        if guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {guides}.")


@dataclass(kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad_token_ids: list[int] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    embedding_bias: object = None  # a torch.Tensor [vocab]
    logprobs: int | None = None
    detokenize: bool = True
    guided_decoding: GuidedDecodingParams | None = None


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None


def double_tokens(prompt: list[int], count: int, *, vocab_size: int, seed: int | None = None,
                  bad_token_ids: list[int] | None = None) -> list[int]:
    """The tokens the double generates for `prompt`: a fixed walk through the vocabulary."""
    start = (sum(prompt) * 31 + len(prompt) + (seed or 0)) % vocab_size
    tokens = []
    for step in range(count):
        token = (start + 7 * step) % vocab_size
        while bad_token_ids and token in bad_token_ids:
            token = (token + 1) % vocab_size
        tokens.append(token)
    return tokens


class RequestOutput:
    def __init__(self, llm: LLM, prompt_token_ids: list[int], params: SamplingParams, streaming: bool):
        asyncio.get_running_loop()  # the real result binds its queue to the running loop
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput(0)]
        self.finished = False
        self.aborted = False
        self._llm, self._params, self._streaming = llm, params, streaming

    def abort(self) -> None:
        self.aborted = True

    async def __aiter__(self):
        params, completion = self._params, self.outputs[0]
        sampled = params.top_k != 1 and (params.temperature or params.top_p)
        planned = double_tokens(self.prompt_token_ids, params.max_tokens, vocab_size=self._llm.vocab_size,
                                seed=params.seed if sampled else None, bad_token_ids=params.bad_token_ids)
        interval = self._llm.kwargs.get("stream_interval", 1)
        since_last = 0
        for step, token in enumerate(planned):
            await asyncio.sleep(STEP_S)
            if self.aborted:
                completion.finish_reason = "cancelled"
                break
            completion.token_ids.append(token)
            if params.logprobs:  # the top `logprobs` candidates: here the sampled token, then the ids after it
                chosen = -0.1 * (step + 1)
                completion.logprobs.append({(token + rank) % self._llm.vocab_size: Logprob(chosen - rank, rank + 1)
                                            for rank in range(params.logprobs)})
            since_last += 1
            if token == params.end_id and step + 1 >= (params.min_tokens or 0):
                completion.finish_reason = "stop"
                break
            if step + 1 == params.max_tokens:
                completion.finish_reason = "length"
                break
            if self._streaming and since_last >= interval:
                since_last = 0
                yield self
        self.finished = True
        if params.logprobs:
            completion.cumulative_logprob = sum(entry[t].logprob for t, entry in zip(completion.token_ids,
                                                                                     completion.logprobs))
        yield self


class LLM:
    instances: list[LLM] = []  # every LLM the double made, for tests to inspect

    def __init__(self, model: str, tokenizer=None, tokenizer_mode: str = "auto", skip_tokenizer_init: bool = False,
                 trust_remote_code: bool = False, tensor_parallel_size: int = 1, dtype: str = "auto",
                 revision: str | None = None, tokenizer_revision: str | None = None, **kwargs):
        unknown = set(kwargs) - _LLM_FIELDS
        if unknown:
            raise ValueError(f"LLM got invalid argument: {sorted(unknown)[0]}")
        backend = kwargs.get("guided_decoding_backend")
        if backend is not None:
            if backend not in GUIDED_DECODING_BACKENDS:
                raise ValueError(f"Unsupported guided decoding backend {backend}")
            assert tokenizer is not None and not skip_tokenizer_init  # get_guided_decoding_config's assertion
        lora_config = kwargs.get("lora_config")
        if lora_config is not None and len(lora_config.lora_dir) != 1:
            assert len(lora_config.lora_target_modules) >= 1, "Expecting at least one lora target module"
        self.tokenizer = tokenizer
        with open(os.path.join(model, "config.json")) as file:
            self.vocab_size = json.load(file)["vocab_size"]
        self.model, self.skip_tokenizer_init, self.dtype = model, skip_tokenizer_init, dtype
        self.tensor_parallel_size, self.trust_remote_code = tensor_parallel_size, trust_remote_code
        self.kwargs = kwargs
        self.requests: list[tuple[dict, SamplingParams, bool]] = []
        self.lora_requests: list = []  # each request's lora_request, None for the base model
        self.shut_down = False
        LLM.instances.append(self)

    def generate_async(self, inputs, sampling_params: SamplingParams | None = None, lora_request=None,
                       prompt_adapter_request=None, streaming: bool = False, kv_cache_retention_config=None,
                       disaggregated_params=None, _postproc_params=None, scheduling_params=None,
                       cache_salt: str | None = None) -> RequestOutput:
        if self.shut_down:
            raise RuntimeError("LLM is shutting down")
        params = sampling_params or SamplingParams()
        if params.end_id is None and self.skip_tokenizer_init:
            raise ValueError("tokenizer is required to reset end_id if it is None, or you can explicitly specify "
                             "the end_id for sampling_params")
        if params.guided_decoding is not None:
            params.guided_decoding._validate()
            if self.kwargs.get("guided_decoding_backend") is None:
                raise ValueError("guided decoding needs the LLM's guided_decoding_backend")
        if lora_request is not None and self.kwargs.get("lora_config") is None:
            raise ValueError("a lora_request needs an LLM made with lora_config")
        prompt = inputs["prompt_token_ids"] if isinstance(inputs, dict) else list(inputs)
        if not self.kwargs.get("enable_chunked_prefill") and len(prompt) > self.kwargs.get("max_num_tokens", 8192):
            raise ValueError(f"The sum of prompt length ({len(prompt)}) should not exceed max_num_tokens")
        self.requests.append((inputs, params, streaming))
        self.lora_requests.append(lora_request)
        return RequestOutput(self, list(prompt), params, streaming)

    def shutdown(self) -> None:
        self.shut_down = True
