"""The engine step on TensorRT-LLM's PyTorch workflow, against the LLM API's test double (TensorRT-LLM cannot be
installed here): the LLM's arguments, what reaches `generate_async`, streaming, end id, stop words, cancellation,
errors, and the one line said where TensorRT-LLM is absent."""

import importlib
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tritonforge.facts.errors import ErrorKind, QueueFullError, RequestError, UnsupportedError
from tritonforge.facts.limits import EngineLimits
from tritonforge.facts.release import TRITON_IMAGE
from tritonforge.runtime.engine.generation import GenerationRequest
from tritonforge.runtime.engine.guided import GuidedDecoding
from tritonforge.runtime.engine.llmapi.engine import (
    NO_END_ID,
    LlmApiEngine,
    LlmApiMissing,
    LlmApiSettings,
    load_llm_api,
)
from tritonforge.runtime.engine.lora import AdapterRecord
from tritonforge.runtime.engine.sampling import SamplingParams

DOUBLE = Path(__file__).resolve().parents[4] / "llmapi_test_double"
VOCAB = 1000
WAIT_S = 30
LIMITS = EngineLimits(max_batch_size=4, max_input_len=16, max_seq_len=600)


@pytest.fixture()
def api(monkeypatch):
    """The test double's `tensorrt_llm.llmapi`, importable only during the test (the real one is absent)."""
    monkeypatch.syspath_prepend(str(DOUBLE))
    module = importlib.import_module("tensorrt_llm.llmapi")
    module.LLM.instances.clear()
    yield module
    for name in [name for name in sys.modules if name == "tensorrt_llm" or name.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture()
def checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(f'{{"vocab_size": {VOCAB}}}')
    return tmp_path


def make_engine(api, checkpoint, **settings):
    return LlmApiEngine(api, LlmApiSettings(model_path=str(checkpoint), **settings), LIMITS, vocab_size=VOCAB,
                        check_period_s=0.01)


@pytest.fixture()
def engine(api, checkpoint):
    engine = make_engine(api, checkpoint)
    yield engine
    engine.shutdown()


class Sink:
    def __init__(self, cancel_after_tokens: int | None = None):
        self.done = threading.Event()
        self.chunks, self.result, self.error, self.was_scheduled = [], None, None, False
        self.cancel_after_tokens = cancel_after_tokens

    def scheduled(self):
        self.was_scheduled = True

    def tokens(self, ids, log_probs, top=None):
        self.chunks.append(list(ids))

    def finish(self, result, error):
        assert not self.done.is_set(), "finish called twice"
        self.result, self.error = result, error
        self.done.set()

    def cancelled(self):
        return self.cancel_after_tokens is not None and sum(map(len, self.chunks)) >= self.cancel_after_tokens


PROMPT = [5, 6, 7]


def run(engine, *, request_id="r", wait=True, sink=None, **fields):
    sink = sink or Sink()
    request = GenerationRequest(request_id=request_id, prompt_ids=fields.pop("prompt", PROMPT),
                                max_new_tokens=fields.pop("max_new_tokens", 12), sink=sink, **fields)
    engine.validate(request)
    engine.submit(request)
    if wait:
        assert sink.done.wait(WAIT_S)
    return sink


def planned(api, count, prompt=PROMPT, **kwargs):
    return api.double_tokens(prompt, count, vocab_size=VOCAB, **kwargs)


def test_the_build_settings_reach_the_llm_constructor(api, checkpoint):
    engine = make_engine(api, checkpoint, dtype="bfloat16", kv_cache_dtype="fp8", tensor_parallel_size=2,
                         pipeline_parallel_size=2, kv_cache_free_gpu_memory_fraction=0.7, max_num_tokens=4096,
                         enable_block_reuse=False, enable_chunked_prefill=True, stream_interval=4)
    engine.shutdown()
    llm = api.LLM.instances[-1]
    assert llm.model == str(checkpoint) and llm.skip_tokenizer_init and not llm.trust_remote_code
    assert (llm.dtype, llm.tensor_parallel_size) == ("bfloat16", 2)
    assert llm.kwargs["pipeline_parallel_size"] == 2 and llm.kwargs["stream_interval"] == 4
    assert (llm.kwargs["max_batch_size"], llm.kwargs["max_input_len"], llm.kwargs["max_seq_len"]) == (4, 16, 600)
    assert llm.kwargs["max_num_tokens"] == 4096 and llm.kwargs["enable_chunked_prefill"]
    assert llm.kwargs["kv_cache_config"] == api.KvCacheConfig(free_gpu_memory_fraction=0.7, enable_block_reuse=False,
                                                              dtype="fp8")
    assert llm.shut_down


def test_non_streaming_request_gets_every_token_at_finish(api, engine):
    sink = run(engine, max_new_tokens=12)
    assert sink.error is None and sink.chunks == [] and sink.was_scheduled
    assert sink.result.token_ids == planned(api, 12) and sink.result.finish_reason == "length"
    inputs, params, streaming = api.LLM.instances[-1].requests[-1]
    assert inputs == {"prompt_token_ids": PROMPT} and not streaming
    assert params.max_tokens == 12 and params.detokenize is False


def test_without_an_end_id_eos_does_not_end_the_generation(api, engine):
    run(engine)
    params = api.LLM.instances[-1].requests[-1][1]
    assert params.end_id == NO_END_ID  # the backend's default; the LLM has no tokenizer to pick one


def test_streaming_sends_stream_interval_tokens_per_response_and_the_last_with_finish(api, checkpoint):
    engine = make_engine(api, checkpoint, stream_interval=3)
    try:
        sink = run(engine, stream=True, max_new_tokens=10)
    finally:
        engine.shutdown()
    assert sink.chunks == [planned(api, 10)[i:i + 3] for i in (0, 3, 6)]
    assert sink.result.token_ids == planned(api, 10)  # the sink sends the 10th with the final flag
    assert api.LLM.instances[-1].requests[-1][2] is True


def test_the_end_id_ends_the_generation_and_is_not_an_output_token(api, engine):
    tokens = planned(api, 12)
    sink = run(engine, stream=True, end_id=tokens[4])
    assert sink.result.token_ids == tokens[:4] and sink.result.finish_reason == "end_id"
    assert sum(sink.chunks, []) == tokens[:4]
    assert api.LLM.instances[-1].requests[-1][1].end_id == tokens[4]


def test_a_multi_token_stop_word_ends_the_request_keeping_its_tokens(api, engine):
    tokens = planned(api, 12)
    sink = run(engine, stop_sequences=[[999_999], tokens[2:4]])
    assert sink.result.token_ids == tokens[:4] and sink.result.finish_reason == "stop_words"


def test_the_stop_input_cancels_the_running_request_with_its_id(api, engine):
    sink = run(engine, request_id="long", wait=False, stream=True, max_new_tokens=500)
    while not sink.chunks:
        sink.done.wait(0.01)
    taken = threading.Event()
    engine.cancel("long", taken.set)
    assert sink.done.wait(WAIT_S) and taken.wait(WAIT_S)
    assert sink.result.finish_reason == "cancelled" and len(sink.result.token_ids) < 500


def test_a_client_that_went_away_stops_its_request(api, engine):
    sink = run(engine, stream=True, max_new_tokens=500, sink=Sink(cancel_after_tokens=3))
    assert sink.result.finish_reason == "cancelled" and 3 <= len(sink.result.token_ids) < 500


def test_sampling_maps_to_the_llm_api_with_the_backend_meaning(api, engine):
    run(engine)
    greedy = api.LLM.instances[-1].requests[-1][1]
    assert greedy.top_k == 1 and greedy.temperature is None and greedy.repetition_penalty is None
    run(engine, sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=3, min_tokens=2,
                                        repetition_penalty=1.1, presence_penalty=0.5))
    sampled = api.LLM.instances[-1].requests[-1][1]
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.seed) == (0.7, 0.9, 40, 3)
    assert (sampled.min_tokens, sampled.repetition_penalty, sampled.presence_penalty) == (2, 1.1, 0.5)
    assert sampled.frequency_penalty is None


def test_single_token_bad_words_are_banned_and_longer_ones_refused(api, engine):
    banned = planned(api, 3)[1]
    sink = run(engine, bad_sequences=[[banned]], max_new_tokens=3)
    assert banned not in sink.result.token_ids
    with pytest.raises(UnsupportedError, match="bad_words_list"):
        run(engine, bad_sequences=[[1, 2]])


def test_log_probs_are_one_per_token(api, engine):
    sink = run(engine, return_log_probs=True, max_new_tokens=3)
    assert sink.result.log_probs == pytest.approx([-0.1, -0.2, -0.3])
    assert api.LLM.instances[-1].requests[-1][1].logprobs == 1


def test_the_likeliest_tokens_come_from_the_llms_candidates_likeliest_first(api, engine):
    sink = run(engine, return_log_probs=True, num_top_log_probs=3, max_new_tokens=3)
    assert api.LLM.instances[-1].requests[-1][1].logprobs == 3
    assert [top.ids[0] for top in sink.result.top] == sink.result.token_ids
    for top, chosen in zip(sink.result.top, sink.result.log_probs):
        assert len(top.ids) == 3 and top.log_probs == pytest.approx([chosen, chosen - 1, chosen - 2])
    assert run(engine, return_log_probs=True, max_new_tokens=2).result.top is None


def test_embedding_bias_goes_to_the_llm_as_a_tensor(api, engine):
    run(engine, embedding_bias=np.ones(VOCAB, dtype=np.float32), max_new_tokens=2)
    bias = api.LLM.instances[-1].requests[-1][1].embedding_bias
    assert tuple(bias.shape) == (VOCAB,)


def test_an_error_of_the_llm_ends_that_request_and_the_engine_goes_on(api, checkpoint):
    engine = make_engine(api, checkpoint, max_num_tokens=2)  # the double refuses prompts over max_num_tokens
    try:
        failed = run(engine)
        assert failed.result is None and "max_num_tokens" in str(failed.error)
        ok = run(engine, prompt=[1, 2], max_new_tokens=2)
        assert ok.error is None and len(ok.result.token_ids) == 2
    finally:
        engine.shutdown()


def test_shutdown_ends_running_requests_and_the_llm(api, checkpoint):
    engine = make_engine(api, checkpoint)
    sink = run(engine, wait=False, stream=True, max_new_tokens=500)
    while not sink.chunks:
        sink.done.wait(0.01)
    engine.shutdown()
    assert sink.done.is_set() and "shutting down" in str(sink.error)
    assert sink.error.kind is ErrorKind.UNAVAILABLE  # another server may serve it: 503, not 500
    assert api.LLM.instances[-1].shut_down


def test_without_tensorrt_llm_loading_fails_with_one_line_naming_the_image():
    assert "tensorrt_llm" not in sys.modules
    with pytest.raises(LlmApiMissing) as error:
        load_llm_api()
    message = str(error.value)
    assert "\n" not in message and TRITON_IMAGE in message and "not installed" in message


def test_the_double_refuses_an_argument_tritonforge_does_not_pass(api, checkpoint):
    with pytest.raises(ValueError, match="LLM got invalid argument: build_config"):
        api.LLM(str(checkpoint), build_config=None)  # a TensorRT-engine argument: not for the PyTorch LLM


def test_a_stop_sent_right_after_the_request_finds_it(api, engine):
    sink = run(engine, request_id="quick", wait=False, stream=True, max_new_tokens=500)
    engine.cancel("quick")  # before the request's task has run a step
    assert sink.done.wait(WAIT_S)
    assert sink.result.finish_reason == "cancelled" and sink.result.token_ids == []


def test_requests_beyond_the_batch_wait_in_the_llm_and_the_queue_limit_bounds_them(api, checkpoint):
    limits = EngineLimits(max_batch_size=1, max_input_len=16, max_seq_len=600, max_queue_size=1)
    engine = LlmApiEngine(api, LlmApiSettings(model_path=str(checkpoint)), limits, vocab_size=VOCAB)
    try:
        first = run(engine, request_id="a", wait=False, max_new_tokens=500)
        second = run(engine, request_id="b", wait=False, max_new_tokens=500)
        assert engine.pending() == 1
        with pytest.raises(QueueFullError):
            run(engine, request_id="c", wait=False)
        engine.cancel("a")
        assert first.done.wait(WAIT_S)
        assert engine.pending() == 0  # the one left runs: nothing waits
        engine.cancel("b")
        assert second.done.wait(WAIT_S)
    finally:
        engine.shutdown()


GUIDES = [
    (GuidedDecoding("json"), {"json_object": True}),
    (GuidedDecoding("json_schema", '{"type": "object"}'), {"json": '{"type": "object"}'}),
    (GuidedDecoding("regex", "[ab]+"), {"regex": "[ab]+"}),
    (GuidedDecoding("ebnf_grammar", 'root ::= "yes"'), {"grammar": 'root ::= "yes"'}),
    (GuidedDecoding("structural_tag", '{"type": "structural_tag"}'), {"structural_tag": '{"type": "structural_tag"}'}),
]


@pytest.mark.parametrize(("guided", "fields"), GUIDES, ids=[guided.guide_type for guided, _ in GUIDES])
def test_each_guide_type_reaches_the_llm_as_guided_decoding_params(api, checkpoint, tmp_path, guided, fields):
    engine = make_engine(api, checkpoint, tokenizer_dir=str(tmp_path))
    try:
        sink = run(engine, guided_decoding=guided)
        assert sink.error is None
        (_, params, _), = api.LLM.instances[-1].requests
        expected = api.GuidedDecodingParams(**fields)
        assert params.guided_decoding == expected
    finally:
        engine.shutdown()


def test_with_a_tokenizer_the_llm_loads_it_and_runs_xgrammar(api, checkpoint, tmp_path):
    engine = make_engine(api, checkpoint, tokenizer_dir=str(tmp_path))
    engine.shutdown()
    llm = api.LLM.instances[-1]
    assert llm.tokenizer == str(tmp_path) and not llm.skip_tokenizer_init
    assert llm.kwargs["guided_decoding_backend"] == "xgrammar"


def test_an_unguided_request_sends_no_guide(api, checkpoint, tmp_path):
    engine = make_engine(api, checkpoint, tokenizer_dir=str(tmp_path))
    try:
        run(engine)
        (_, params, _), = api.LLM.instances[-1].requests
        assert params.guided_decoding is None
    finally:
        engine.shutdown()


def test_without_a_tokenizer_a_guided_request_is_unsupported_and_the_llm_gets_no_backend(api, engine):
    with pytest.raises(UnsupportedError, match="^guided_decoding_guide_type: guided decoding needs the LLM's"):
        run(engine, guided_decoding=GuidedDecoding("json"))
    assert "guided_decoding_backend" not in api.LLM.instances[-1].kwargs and not api.LLM.instances[-1].requests


def test_the_model_reads_the_tokenizer_its_build_named(api, tmp_path):
    """The build names preprocessing's tokenizer relative to the model; the engine hands the LLM its absolute path."""
    from tritonforge.facts.model_parameters import PyTorchEngineParameters
    from tritonforge.runtime.engine.service import EngineSettings

    model_dir = tmp_path / "tensorrt_llm"
    (model_dir / "1" / "checkpoint").mkdir(parents=True)
    (model_dir / "1" / "checkpoint" / "config.json").write_text(f'{{"vocab_size": {VOCAB}}}')
    parameters = PyTorchEngineParameters(model_path="1/checkpoint", tokenizer_dir="../preprocessing/tokenizer",
                                         vocab_size=VOCAB, max_batch_size=4, max_input_len=16, max_seq_len=600)
    args = {"model_config": "{}", "model_repository": str(model_dir)}
    settings = EngineSettings.from_model_args(args, parameters)
    LlmApiEngine.for_model(parameters, settings, api=api).shutdown()
    assert api.LLM.instances[-1].tokenizer == str(tmp_path / "preprocessing" / "tokenizer")


@pytest.fixture(scope="module")
def peft_adapters(tiny_models, tmp_path_factory):
    """Two PEFT adapters of the tiny checkpoint (the double reads only their folders' files, as the LLM would)."""
    from tritonforge.tools.tiny_model import make_lora_adapter

    folder = tmp_path_factory.mktemp("adapters")
    return (AdapterRecord("sql", 1, str(make_lora_adapter(tiny_models["bpe"], folder / "sql", rank=2,
                                                          target_modules=("q_proj", "v_proj")))),
            AdapterRecord("chat", 2, str(make_lora_adapter(tiny_models["bpe"], folder / "chat", rank=8,
                                                           target_modules=("o_proj", "up_proj")))))


def test_the_adapters_reach_the_llm_as_one_lora_config(api, checkpoint, peft_adapters):
    make_engine(api, checkpoint, lora_adapters=peft_adapters).shutdown()
    lora_config = importlib.import_module("tensorrt_llm.lora_manager").LoraConfig
    # TensorRT-LLM's names, q/k/v completed: up_proj is its mlp_gate.
    assert api.LLM.instances[-1].kwargs["lora_config"] == lora_config(
        lora_dir=[record.path for record in peft_adapters], max_lora_rank=8, max_loras=2, max_cpu_loras=2,
        lora_target_modules=["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_gate"])


def test_without_adapters_the_llm_gets_no_lora_config(api, engine):
    assert "lora_config" not in api.LLM.instances[-1].kwargs


def test_a_request_runs_with_the_adapter_its_task_id_names(api, checkpoint, peft_adapters):
    engine = make_engine(api, checkpoint, lora_adapters=peft_adapters)
    try:
        chat = run(engine, lora_task_id=2)
        base = run(engine)
    finally:
        engine.shutdown()
    assert chat.error is None and base.error is None
    lora_request = importlib.import_module("tensorrt_llm.executor.request").LoRARequest
    assert api.LLM.instances[-1].lora_requests == [lora_request("chat", 2, peft_adapters[1].path), None]


@pytest.mark.parametrize("with_adapters, known", [(True, r"1 \(sql\), 2 \(chat\)"),
                                                  (False, r"none \(tritonforge build --lora NAME=PATH\)")])
def test_an_unknown_task_id_is_the_clients_mistake_naming_lora_task_id(api, checkpoint, peft_adapters, with_adapters,
                                                                       known):
    engine = make_engine(api, checkpoint, lora_adapters=peft_adapters if with_adapters else ())
    try:
        with pytest.raises(RequestError, match=rf"^lora_task_id: no LoRA adapter has task id 7 in this engine; its "
                                               rf"adapters: {known}$") as caught:
            run(engine, lora_task_id=7)
    finally:
        engine.shutdown()
    assert caught.value.kind is ErrorKind.CLIENT and not api.LLM.instances[-1].requests


def test_the_model_hands_the_llm_the_adapters_its_build_copied(api, tmp_path, peft_adapters):
    """The build names each adapter's folder relative to the model; the LLM gets it absolute."""
    import json
    import shutil

    from tritonforge.facts.model_parameters import PyTorchEngineParameters
    from tritonforge.runtime.engine.lora import records_to_parameter
    from tritonforge.runtime.engine.service import EngineSettings

    model_dir = tmp_path / "tensorrt_llm"
    (model_dir / "1" / "checkpoint").mkdir(parents=True)
    (model_dir / "1" / "checkpoint" / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    shutil.copytree(peft_adapters[0].path, model_dir / "1" / "lora" / "sql")
    parameters = PyTorchEngineParameters(model_path="1/checkpoint", vocab_size=VOCAB, max_batch_size=4,
                                         max_input_len=16, max_seq_len=600,
                                         lora_adapters=records_to_parameter([AdapterRecord("sql", 1, "1/lora/sql")]))
    settings = EngineSettings.from_model_args({"model_config": "{}", "model_repository": str(model_dir)}, parameters)
    LlmApiEngine.for_model(parameters, settings, api=api).shutdown()
    assert api.LLM.instances[-1].kwargs["lora_config"].lora_dir == [str(model_dir / "1" / "lora" / "sql")]
