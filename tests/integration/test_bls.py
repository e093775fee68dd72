"""The BLS model (tensorrt_llm_bls) on a real tritonserver: streaming text, concurrency, stop phrases, chat."""

from __future__ import annotations

import json

import pytest

from tritonforge.client import GenerateRequest, GenerationError, GrpcClient
from tritonforge.tokenization import load_tokenizer

from .conftest import serve_tiny, stream_concurrently

MULTILINGUAL = ["The server reads a request", "你好，世界。模型正在生成文本。", "café naïve 🚀 👍🏽",
                "Привет, мир!", "こんにちは"]
MAX_TOKENS = 24
STREAMS_ON_ONE_INSTANCE = 64


@pytest.fixture(scope="module", params=["bpe", "sentencepiece"])
def served(request, tiny_models, tmp_path_factory):
    server = serve_tiny(tiny_models[request.param], tmp_path_factory.mktemp("repo") / "model_repository",
                        bls_instances=1, postprocessing_instances=3)
    yield server, tiny_models[request.param]
    server.stop()


@pytest.fixture(scope="module")
def clients(served):
    bls, ensemble = GrpcClient(served[0].grpc_url, "tensorrt_llm_bls"), GrpcClient(served[0].grpc_url)
    yield bls, ensemble
    bls.close()
    ensemble.close()


@pytest.mark.parametrize("prompt", MULTILINGUAL)
def test_bls_and_ensemble_streams_equal_their_non_streamed_text(clients, prompt):
    bls, ensemble = clients
    full = ensemble.generate(prompt, max_tokens=MAX_TOKENS)
    assert bls.generate(prompt, max_tokens=MAX_TOKENS) == full
    assert "".join(ensemble.stream(prompt, max_tokens=MAX_TOKENS)) == full
    pieces = list(bls.stream(prompt, max_tokens=MAX_TOKENS))
    assert "".join(pieces) == full


def test_every_bls_chunk_is_valid_utf8(clients):
    bls, _ = clients
    for prompt in MULTILINGUAL:
        for chunk in bls.stream_bytes(GenerateRequest(text_input=prompt, max_tokens=MAX_TOKENS)):
            chunk.decode("utf-8")  # raises on a split character


def test_many_concurrent_streams_through_one_bls_instance(served, clients):
    _, ensemble = clients
    prompts = [f"{MULTILINGUAL[i % len(MULTILINGUAL)]} {i}" for i in range(STREAMS_ON_ONE_INSTANCE)]
    # The ensemble's streamed text: a random model may generate BOS first, and the ensemble's non-streamed
    # text then drops the space after it (see TokenBytes); streamed text never does.
    expected = ["".join(ensemble.stream(p, max_tokens=MAX_TOKENS)) for p in prompts]

    assert stream_concurrently(served[0].grpc_url, "tensorrt_llm_bls", prompts, MAX_TOKENS) == expected


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
    with pytest.raises(GenerationError, match="temperature"):
        bls.generate("hi", max_tokens=4, temperature=-1.0)
    with pytest.raises(GenerationError, match="messages"):
        bls.generate(GenerateRequest(messages=json.loads('[{"role": 1}]'), max_tokens=4))
    assert bls.generate("A", max_tokens=4) == ensemble.generate("A", max_tokens=4)
