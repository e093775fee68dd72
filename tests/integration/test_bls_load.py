"""The BLS model (tensorrt_llm_bls) under load and without streaming, on the replay engine: its tokens do not
depend on how requests are batched and its step is fixed, so the texts and the gaps between chunks are the
BLS's doing alone. (tests/integration/test_bls.py has the BLS on the transformers engine.)"""

from __future__ import annotations

import asyncio
import time

import pytest

from tritonforge.builder.build import BuildOptions, build
from tritonforge.clients.client import AsyncGrpcClient, GenerateRequest, GrpcClient, HttpClient

from .conftest import lean_serving, running, stream_concurrently
from .test_bls import MAX_TOKENS, MULTILINGUAL

STREAMS_ON_ONE_INSTANCE = 64


@pytest.fixture(scope="module")
def replay_served(tiny_models, tmp_path_factory):
    """The replay engine: its tokens do not depend on how requests are batched (the transformers engine's
    greedy tokens can flip between batch compositions on a random tiny model, which is not the BLS's doing)."""
    repository = build(BuildOptions(model=tiny_models["sentencepiece"], engine="replay", replay_step_ms=2,
                                    output=tmp_path_factory.mktemp("replay") / "repo", max_input_len=64,
                                    max_seq_len=256, max_batch_size=STREAMS_ON_ONE_INSTANCE,
                                    serving=lean_serving()), progress=lambda _: None)
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
                                    serving=lean_serving()), progress=lambda _: None)
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


def test_a_repository_built_without_streaming_answers_through_the_bls_as_through_the_ensemble(tiny_models, tmp_path):
    """NVIDIA's `decoupled_mode` false: the engine answers each request once, and the BLS asks it over the gRPC
    stream for that one answer, which must end its call (a non-decoupled response carries the final flag)."""
    repository = build(BuildOptions(model=tiny_models["sentencepiece"], engine="replay", replay_step_ms=2,
                                    output=tmp_path / "repo", max_input_len=64, max_seq_len=128, max_batch_size=4,
                                    serving=lean_serving(decoupled=False)),
                       progress=lambda _: None)
    with running(repository) as server:
        # A call the final flag does not end would hang: a minute is far beyond the answer.
        bls = HttpClient(server.http_url, "tensorrt_llm_bls", timeout_s=60)
        ensemble = HttpClient(server.http_url, timeout_s=60)
        text = ensemble.generate("The server reads", max_tokens=MAX_TOKENS)
        assert text and bls.generate("The server reads", max_tokens=MAX_TOKENS) == text
