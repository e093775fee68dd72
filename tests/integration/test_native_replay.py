"""The C++ replay engine (`--replay-native`, benchmarking only) in a real tritonserver: the tensors, streaming,
stream interval, stop and cancellation of the Python replay engine it stands in for."""

import shutil
import time

import numpy as np
import pytest

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.native import REPLAY
from tritonforge.clients.client import GenerateRequest, GrpcClient
from tritonforge.runtime.text.tokenization import load_tokenizer

from .conftest import ascii_only, engine_stream, lean_serving, running, stream_concurrently
from .test_cancellation import ANSWER_S, assert_cancelled_engine_streams_free_their_slots

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="needs a C++ compiler (g++) to build the C++ replay engine")

BATCH = 2  # as test_cancellation's engine: its helpers hold every slot with BATCH long streams
STEP_MS = 50  # test_cancellation's step: a long generation outlasts every bound there
INTERVAL = 3
TOKENS = 10  # streamed as 1 + 3 + 3 + 3 with an interval of 3
STREAMS = 6  # three for each slot


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory):
    """One engine of BATCH slots at STEP_MS, INTERVAL tokens a streamed response after the first."""
    repository = build(BuildOptions(model=tiny_models["sentencepiece"], engine="replay", replay_native=True,
                                    replay_step_ms=STEP_MS, stream_interval=INTERVAL, max_batch_size=BATCH,
                                    output=tmp_path_factory.mktemp("native") / "repo", max_input_len=64,
                                    max_seq_len=1024, serving=lean_serving()),
                       progress=lambda _: None)
    with running(repository) as server:
        yield server, repository


def test_the_build_compiles_the_engine_into_its_model_instead_of_a_python_model(served):
    _, repository = served
    version = repository / configs.ENGINE_MODEL / "1"
    assert (version / REPLAY.library).is_file() and not (version / "model.py").exists()
    assert 'backend: "tritonforge_replay"' in (repository / configs.ENGINE_MODEL / "config.pbtxt").read_text()


def test_the_engine_streams_its_first_token_at_once_then_interval_tokens_a_response(served):
    server, repository = served
    prompt_ids = load_tokenizer(repository / "preprocessing" / "tokenizer")("The engine").input_ids
    tokens, errors = engine_stream(server.grpc_url, {
        "input_ids": np.array([prompt_ids], dtype=np.int32),
        "input_lengths": np.array([[len(prompt_ids)]], dtype=np.int32),
        "request_output_len": np.array([[TOKENS]], dtype=np.int32), "streaming": np.array([[True]])})
    assert not errors and [len(chunk) for chunk in tokens] == [1, 3, 3, 3]
    whole, errors = engine_stream(server.grpc_url, {
        "input_ids": np.array([prompt_ids], dtype=np.int32),
        "input_lengths": np.array([[len(prompt_ids)]], dtype=np.int32),
        "request_output_len": np.array([[TOKENS]], dtype=np.int32)})
    assert not errors and whole == [sum(tokens, [])]  # one response, the same tokens, no prompt


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_every_concurrent_stream_is_its_non_streamed_answer(served, model):
    """More streams than slots, each checked against its answer alone: text complete and in order (the
    ensemble's chunks are decoded alone, so a character straddling two of them differs: docs/design/streaming.md;
    every single-byte character stays in place)."""
    server, _ = served
    client = GrpcClient(server.grpc_url, model)
    prompts = [f"The server {index}" for index in range(STREAMS)]
    expected = [client.generate(prompt, max_tokens=TOKENS) for prompt in prompts]
    client.close()
    streamed = stream_concurrently(server.grpc_url, model, prompts, TOKENS)
    if model == "ensemble":
        streamed, expected = [ascii_only(t) for t in streamed], [ascii_only(t) for t in expected]
    assert streamed == expected


def test_cancelled_engine_streams_free_their_slots(served):
    assert_cancelled_engine_streams_free_their_slots(*served)


def test_a_stop_with_the_request_id_ends_a_running_ensemble_stream(served):
    server, _ = served
    client = GrpcClient(server.grpc_url)
    chunks, started = [], time.monotonic()
    for chunk in client.stream_bytes(GenerateRequest(text_input="The server", max_tokens=900),
                                     request_id="stop-me"):
        chunks.append(chunk)
        if len(chunks) == 2:
            _, errors = engine_stream(server.grpc_url, {
                "stop": np.array([[True]]), "input_lengths": np.array([[1]], dtype=np.int32),
                "request_output_len": np.array([[1]], dtype=np.int32)}, request_id="stop-me")
            assert not errors
    client.close()
    assert len(chunks) < 900 / INTERVAL and time.monotonic() - started < ANSWER_S


def test_a_stop_without_a_request_id_is_refused_naming_the_input(served):
    server, _ = served
    _, errors = engine_stream(server.grpc_url, {
        "stop": np.array([[True]]), "input_lengths": np.array([[1]], dtype=np.int32),
        "request_output_len": np.array([[1]], dtype=np.int32)})
    assert errors and "stop" in errors[0] and "request id" in errors[0]
