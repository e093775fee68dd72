"""The BLS model (tensorrt_llm_bls) on a real tritonserver: streaming text, concurrency, stop phrases, chat."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tritonforge.clients.client import AsyncGrpcClient, GenerateRequest, GenerationError, GrpcClient
from tritonforge.facts.contract import MAX_TOKENS as MAX_TOKENS_INPUT
from tritonforge.facts.contract import SEED, TEMPERATURE, TEXT_INPUT, TEXT_OUTPUT, TOP_K
from tritonforge.facts.errors import ErrorKind
from tritonforge.runtime.text.tokenization import load_tokenizer

from .conftest import ascii_only, batch_column, batched_texts

MULTILINGUAL = ["The server reads a request", "你好，世界。模型正在生成文本。", "café naïve 🚀 👍🏽",
                "Привет, мир!", "こんにちは"]
MAX_TOKENS = 24


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
    from tritonforge.facts.contract import FIRST_TOKEN_TIME_NS, LAST_TOKEN_TIME_NS, RETURN_PERF_METRICS

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
