"""The BLS model (tensorrt_llm_bls) on a real tritonserver: streaming text, concurrency, stop phrases, chat."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

from tritonforge.build import model_configs as configs
from tritonforge.build.builder import BuildOptions, build
from tritonforge.clients.client import AsyncGrpcClient, GenerateRequest, GenerationError, GrpcClient, HttpClient
from tritonforge.runtime.tokenization import load_tokenizer
from tritonforge.spec.contract import MAX_TOKENS as MAX_TOKENS_INPUT
from tritonforge.spec.contract import SEED, TEMPERATURE, TEXT_INPUT, TEXT_OUTPUT, TOP_K
from tritonforge.spec.errors import ErrorKind

from .conftest import ascii_only, batch_column, batched_texts, running, stream_concurrently

MULTILINGUAL = ["The server reads a request", "你好，世界。模型正在生成文本。", "café naïve 🚀 👍🏽",
                "Привет, мир!", "こんにちは"]
MAX_TOKENS = 24
STREAMS_ON_ONE_INSTANCE = 64


@pytest.fixture(scope="module")
def clients(served):
    bls, ensemble = GrpcClient(served[0].grpc_url, "tensorrt_llm_bls"), GrpcClient(served[0].grpc_url)
    yield bls, ensemble
    bls.close()
    ensemble.close()


@pytest.mark.parametrize("prompt", MULTILINGUAL)
def test_bls_stream_equals_its_text_and_ensemble_chunks_keep_every_whole_character(clients, prompt):
    bls, ensemble = clients
    full = ensemble.generate(prompt, max_tokens=MAX_TOKENS)
    assert bls.generate(prompt, max_tokens=MAX_TOKENS) == full
    assert "".join(bls.stream(prompt, max_tokens=MAX_TOKENS)) == full
    # An ensemble chunk is decoded alone: a character whose bytes straddle two chunks becomes U+FFFD in each,
    # every other character (word spaces included) is the whole text's.
    streamed = "".join(ensemble.stream(prompt, max_tokens=MAX_TOKENS))
    assert ascii_only(streamed) == ascii_only(full)


@pytest.mark.parametrize("model", ["tensorrt_llm_bls", "ensemble"])
def test_every_streamed_chunk_and_every_text_is_valid_utf8_alone(served, model):
    client = GrpcClient(served[0].grpc_url, model)
    for prompt in MULTILINGUAL:
        request = GenerateRequest(text_input=prompt, max_tokens=MAX_TOKENS)
        for chunk in client.stream_bytes(request):
            chunk.decode("utf-8")  # strict, as NVIDIA's clients decode each chunk: raises on a split character
        b"".join(client.stream_bytes(request, stream=False)).decode("utf-8")
    client.close()


@pytest.fixture(scope="module")
def replay_served(tiny_models, tmp_path_factory):
    """The replay engine: its tokens do not depend on how requests are batched (the transformers engine's
    greedy tokens can flip between batch compositions on a random tiny model, which is not the BLS's doing)."""
    repository = build(BuildOptions(model=tiny_models["sentencepiece"], engine="replay", replay_step_ms=2,
                                    output=tmp_path_factory.mktemp("replay") / "repo", max_input_len=64,
                                    max_seq_len=256, max_batch_size=STREAMS_ON_ONE_INSTANCE,
                                    serving=configs.ServingConfig(bls_instances=1)), progress=lambda _: None)
    with running(repository) as server:
        yield server


def test_many_concurrent_streams_through_one_bls_instance_keep_their_exact_text(replay_served):
    """64 streams on one BLS instance: under load it coalesces a stream's pending text into fewer chunks;
    every stream's text must still be exactly what it is alone."""
    bls = GrpcClient(replay_served.grpc_url, "tensorrt_llm_bls")
    prompts = [f"{MULTILINGUAL[i % len(MULTILINGUAL)]} {i}" for i in range(STREAMS_ON_ONE_INSTANCE)]
    expected = [bls.generate(p, max_tokens=MAX_TOKENS) for p in prompts]  # one at a time
    bls.close()
    assert stream_concurrently(replay_served.grpc_url, "tensorrt_llm_bls", prompts, MAX_TOKENS) == expected


QUEUED_STREAMS = 44  # more than the 32 backend threads of a BLS instance
QUEUE_TOKENS = 40  # 0.8 s a request at 20 ms a step
LONGEST_GAP_S = 2.0  # between two chunks of a stream; 0.02 s is normal, 4-7 s was the stall


@pytest.fixture(scope="module")
def queue_served(tiny_models, tmp_path_factory):
    """An engine with 2 slots behind one BLS instance: most streams wait in the engine's queue."""
    repository = build(BuildOptions(model=tiny_models["bpe"], engine="replay", replay_step_ms=20,
                                    output=tmp_path_factory.mktemp("queue") / "repo", max_input_len=64,
                                    max_seq_len=256, max_batch_size=2,
                                    serving=configs.ServingConfig(bls_instances=1)), progress=lambda _: None)
    with running(repository) as server:
        yield server


def test_streams_waiting_for_the_engine_do_not_stall_the_running_ones(queue_served):
    """A BLS engine call made through the Python backend held one of the instance's 32 backend threads until
    its first token, and those threads also send the instance's responses: with more streams than that
    queued, the running streams got no chunk for seconds. Engine calls over the gRPC stream hold none."""

    async def longest_gaps():
        client = AsyncGrpcClient(queue_served.grpc_url, "tensorrt_llm_bls")

        async def one(index):
            arrivals = []
            request = GenerateRequest(text_input=f"The server {index}", max_tokens=QUEUE_TOKENS)
            async for _ in client.stream_bytes(request):
                arrivals.append(time.monotonic())
            return max((later - earlier for earlier, later in zip(arrivals, arrivals[1:])), default=0.0)

        try:
            return await asyncio.gather(*(one(index) for index in range(QUEUED_STREAMS)))
        finally:
            await client.close()

    assert max(asyncio.run(longest_gaps())) < LONGEST_GAP_S


def test_a_streamed_request_is_answered_in_chunks_as_it_generates_and_a_whole_one_in_one_response(queue_served):
    """At 20 ms a token the engine gives the BLS each token apart: a streamed request gets them in several
    chunks, and the same request unstreamed gets one response with all of it."""
    bls = GrpcClient(queue_served.grpc_url, "tensorrt_llm_bls")
    request = GenerateRequest(text_input="The server reads a request", max_tokens=10)
    try:
        chunks = list(bls.stream_bytes(request))
        whole = list(bls.stream_bytes(request, stream=False))
    finally:
        bls.close()
    assert len(chunks) >= 2, chunks
    assert len(whole) == 1 and whole[0] == b"".join(chunks)


def test_stop_phrase_split_across_tokens_is_never_emitted(clients):
    bls, ensemble = clients
    prompt = MULTILINGUAL[0]
    full = ensemble.generate(prompt, max_tokens=MAX_TOKENS)
    # Three characters from the middle of the text: with tokens of one to a few characters, the phrase
    # spans a token boundary, so it arrives in pieces.
    for start in range(4, len(full) - 4):
        phrase = full[start:start + 3]
        if phrase.strip() and full.find(phrase) == start:
            break
    streamed = "".join(bls.stream(prompt, max_tokens=MAX_TOKENS, stop_words=[phrase]))
    assert streamed == full[:start] and phrase not in streamed
    assert bls.generate(prompt, max_tokens=MAX_TOKENS, stop_words=[phrase]) == full[:start]


def test_text_held_back_as_a_stop_phrases_start_is_sent_when_the_answer_ends(clients):
    """The answer's last character starts a stop phrase that never completes: the BLS holds it back while a
    phrase could follow, and must send it when the engine ends."""
    bls, ensemble = clients
    prompt = MULTILINGUAL[0]
    full = ensemble.generate(prompt, max_tokens=MAX_TOKENS)
    phrase = full[-1] + "\x01never"
    assert "".join(bls.stream(prompt, max_tokens=MAX_TOKENS, stop_words=[phrase])) == full
    assert bls.generate(prompt, max_tokens=MAX_TOKENS, stop_words=[phrase]) == full


def test_a_whole_answer_echoes_the_prompt_when_asked_as_the_ensemble_does(clients):
    bls, ensemble = clients
    prompt = MULTILINGUAL[0]
    answer = ensemble.generate(prompt, max_tokens=MAX_TOKENS)
    echoed = bls.generate(prompt, max_tokens=MAX_TOKENS, exclude_input_in_output=False)
    assert echoed == ensemble.generate(prompt, max_tokens=MAX_TOKENS, exclude_input_in_output=False)
    assert echoed.startswith(prompt) and echoed.endswith(answer) and len(echoed) > len(answer)


def test_a_batched_request_answers_each_row_with_its_own_inputs_and_batch_index(clients, served):
    """Two rows with their own max_tokens and sampling seed: each row's text is what that row asks for,
    marked with its row."""
    _, ensemble = clients
    rows = [(MULTILINGUAL[0], 4, 1), (MULTILINGUAL[3], MAX_TOKENS, 2)]  # prompt, max_tokens, seed
    sampling = {TEMPERATURE: 1.0, TOP_K: 50}
    texts = batched_texts(served[0].grpc_url, "tensorrt_llm_bls", [
        batch_column(TEXT_INPUT, [prompt.encode() for prompt, _, _ in rows], object, "BYTES"),
        batch_column(MAX_TOKENS_INPUT, [n for _, n, _ in rows], np.int32, "INT32"),
        batch_column(SEED, [seed for _, _, seed in rows], np.uint64, "UINT64"),
        batch_column(TEMPERATURE, [sampling[TEMPERATURE]] * len(rows), np.float32, "FP32"),
        batch_column(TOP_K, [sampling[TOP_K]] * len(rows), np.int32, "INT32")])
    assert texts == {row: ensemble.generate(prompt, max_tokens=n, seed=seed, **sampling)
                     for row, (prompt, n, seed) in enumerate(rows)}


def test_a_whole_bls_answer_carries_the_engines_last_perf_metrics(served):
    """The BLS forwards the statistics of the engine's last response: the last token came after the first."""
    from tritonforge.spec.contract import FIRST_TOKEN_TIME_NS, LAST_TOKEN_TIME_NS, RETURN_PERF_METRICS

    async def whole():
        client = AsyncGrpcClient(served[0].grpc_url, "tensorrt_llm_bls")
        request = GenerateRequest(text_input=MULTILINGUAL[0], max_tokens=MAX_TOKENS,
                                  parameters={RETURN_PERF_METRICS: True, "min_tokens": MAX_TOKENS})
        try:
            return [result async for result in client.responses(request, stream=False)]
        finally:
            await client.close()

    answered = [result for result in asyncio.run(whole()) if result.as_numpy(TEXT_OUTPUT) is not None]
    assert len(answered) == 1
    first, last = (int(answered[0].as_numpy(name).reshape(-1)[0]) for name in (FIRST_TOKEN_TIME_NS,
                                                                                  LAST_TOKEN_TIME_NS))
    assert 0 < first < last


def test_chat_messages_are_rendered_once_with_one_bos(clients, served):
    bls, ensemble = clients
    tokenizer = load_tokenizer(served[1])
    messages = [{"role": "user", "content": "hi"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    request = GenerateRequest(messages=messages, max_tokens=MAX_TOKENS)
    via_text = GenerateRequest(text_input=rendered, max_tokens=MAX_TOKENS)
    # The rendered prompt starts with the BOS text: it must not get a second BOS either.
    assert bls.generate(request) == ensemble.generate(request) == ensemble.generate(via_text)


def test_bls_errors_name_the_field_and_the_next_request_is_served(clients):
    bls, ensemble = clients
    with pytest.raises(GenerationError, match="temperature") as bad_value:
        bls.generate("hi", max_tokens=4, temperature=-1.0)
    with pytest.raises(GenerationError, match="messages") as bad_messages:
        bls.generate(GenerateRequest(messages=json.loads('[{"role": 1}]'), max_tokens=4))
    assert bad_value.value.kind is bad_messages.value.kind is ErrorKind.CLIENT  # read from the message alone
    assert bls.generate("A", max_tokens=4) == ensemble.generate("A", max_tokens=4)


def test_a_repository_built_without_streaming_answers_through_the_bls_as_through_the_ensemble(tiny_models, tmp_path):
    """NVIDIA's `decoupled_mode` false: the engine answers each request once, and the BLS asks it over the gRPC
    stream for that one answer, which must end its call (a non-decoupled response carries the final flag)."""
    repository = build(BuildOptions(model=tiny_models["sentencepiece"], engine="replay", replay_step_ms=2,
                                    output=tmp_path / "repo", max_input_len=64, max_seq_len=128, max_batch_size=4,
                                    serving=configs.ServingConfig(bls_instances=1, decoupled=False)),
                       progress=lambda _: None)
    with running(repository) as server:
        # A call the final flag does not end would hang: a minute is far beyond the answer.
        bls = HttpClient(server.http_url, "tensorrt_llm_bls", timeout_s=60)
        ensemble = HttpClient(server.http_url, timeout_s=60)
        text = ensemble.generate("The server reads", max_tokens=MAX_TOKENS)
        assert text and bls.generate("The server reads", max_tokens=MAX_TOKENS) == text
