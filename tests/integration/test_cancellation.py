"""Cancellation that must free the engine, made deterministic by the replay engine's fixed step: a long
generation takes far longer than any bound here, so only a working cancel can pass these tests."""

import asyncio
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tritonforge.builder.build import BuildOptions, build
from tritonforge.clients.client import AsyncGrpcClient, GenerateRequest, GrpcClient, HttpClient, ResponseTimeout
from tritonforge.gateway.options import GatewayThread
from tritonforge.runtime.text.tokenization import load_tokenizer
from tritonforge.serve.ports import free_port

from .conftest import ascii_only, engine_stream, lean_serving, running

STEP_MS = 50
LONG_GENERATION = 900  # 45 s at one token every 50 ms: never reached by a request a test stops
BATCH = 2
ANSWER_S = 15  # far below LONG_GENERATION × STEP_MS
# With every slot held, a new request gets no answer this long; a free slot answers its 4 tokens in a fifth of it.
HELD_S = 1
ADMIN_KEY = "cancellation-tests"  # unlocks Triton's statistics API


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory):
    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("cancel") / "repo",
                                    engine="replay", replay_step_ms=STEP_MS, max_batch_size=BATCH, max_input_len=64,
                                    max_seq_len=1024, serving=lean_serving()), progress=lambda _: None)
    with running(repository, restricted_api_key=ADMIN_KEY) as server:
        yield server, repository


def open_long_engine_streams(url: str, prompt_ids: list[int], streams: int, model: str = "tensorrt_llm") -> list:
    """`streams` long generations straight to the engine (or `model`, of the engine's tensors), each past its
    first token."""
    clients = []
    for index in range(streams):
        client = grpcclient.InferenceServerClient(url)
        got_token = threading.Event()
        client.start_stream(callback=lambda result, error, e=got_token: e.set())
        tensors = []
        for name, array, dtype in (("input_ids", np.array([prompt_ids], dtype=np.int32), "INT32"),
                                   ("input_lengths", np.array([[len(prompt_ids)]], dtype=np.int32), "INT32"),
                                   ("request_output_len", np.array([[LONG_GENERATION]], dtype=np.int32), "INT32"),
                                   ("streaming", np.array([[True]]), "BOOL")):
            tensor = grpcclient.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        client.async_stream_infer(model, tensors, request_id=f"long-{index}")
        assert got_token.wait(ANSWER_S)
        clients.append(client)
    return clients


def answer_within(url: str, seconds: float) -> str | None:
    result = {}

    def ask():
        client = GrpcClient(url)
        result["text"] = client.generate("Hello", max_tokens=4)
        client.close()

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(seconds)
    return result.get("text")


def assert_cancelled_engine_streams_free_their_slots(server, repository) -> None:
    """Long engine streams hold every slot; once their clients cancel them, a new request is answered."""
    prompt_ids = load_tokenizer(repository / "preprocessing" / "tokenizer")("The engine").input_ids
    clients = open_long_engine_streams(server.grpc_url, prompt_ids, BATCH)
    assert answer_within(server.grpc_url, HELD_S) is None  # every slot is taken: a new request waits
    for client in clients:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert answer_within(server.grpc_url, ANSWER_S), "the cancelled generations kept their slots"


def test_cancelled_engine_streams_free_their_slots(served):
    assert_cancelled_engine_streams_free_their_slots(*served)


def hold_every_slot(server, client_of) -> list:
    """`BATCH` long generations through `client_of()` (a GrpcClient or HttpClient), each past its first chunk,
    so that they hold every engine slot: a new request waits. The open streams, for the test to abandon."""
    streams = []
    for _ in range(BATCH):
        stream = client_of().stream_bytes(GenerateRequest(text_input="The server", max_tokens=LONG_GENERATION))
        next(stream)
        streams.append(stream)
    assert answer_within(server.grpc_url, HELD_S) is None
    return streams


def hold_every_slot_over_grpc(server) -> list[tuple[GrpcClient, Iterator[bytes]]]:
    """`hold_every_slot` through the ensemble with a GrpcClient per stream: (client, stream) pairs."""
    clients = []

    def client_of():
        clients.append(GrpcClient(server.grpc_url))
        return clients[-1]

    streams = hold_every_slot(server, client_of)
    return list(zip(clients, streams))


def abandon(held: list[tuple[GrpcClient, Iterator[bytes]]]) -> None:
    for client, stream in held:
        stream.close()  # the caller stops reading: the client cancels its stream and stops the engine's request
        client.close()


def test_an_abandoned_ensemble_stream_frees_its_engine_slot(served):
    """Triton does not pass the client's cancel to the running engine step; our client's stop does."""
    server, _ = served
    abandon(hold_every_slot_over_grpc(server))
    assert answer_within(server.grpc_url, ANSWER_S), "the abandoned generations kept their slots"


def test_an_abandoned_http_ensemble_stream_frees_its_engine_slot(served):
    """An HTTP disconnect, as a gRPC cancel, does not reach the ensemble's running engine step; our stop does."""
    server, _ = served
    for stream in hold_every_slot(server, lambda: HttpClient(server.http_url)):
        stream.close()
    assert answer_within(server.grpc_url, ANSWER_S), "the abandoned generations kept their slots"


@pytest.mark.parametrize("kind", ["grpc", "asyncio"])
def test_a_stream_the_server_leaves_silent_ends_with_a_timeout_error(served, kind):
    """A stream that gets nothing from the server (here it waits behind every engine slot held) ends with
    ResponseTimeout at the client's limit instead of waiting for ever; its stop leaves the engine's queue."""
    server, _ = served
    held = hold_every_slot_over_grpc(server)
    request = GenerateRequest(text_input="The server", max_tokens=4)
    try:
        with pytest.raises(ResponseTimeout, match="no response from ensemble in 1 s"):
            if kind == "grpc":
                waiting = GrpcClient(server.grpc_url)
                try:
                    list(waiting.stream_bytes(request, timeout_s=1))
                finally:
                    waiting.close()
            else:
                async def wait_silently():
                    waiting = AsyncGrpcClient(server.grpc_url, response_timeout_s=1)
                    try:
                        async for _ in waiting.responses(request):
                            pass
                    finally:
                        await waiting.close()

                asyncio.run(asyncio.wait_for(wait_silently(), ANSWER_S))
    finally:
        abandon(held)
    assert answer_within(server.grpc_url, ANSWER_S), "the engine did not come free after the timed-out stream"


def engine_requests(url: str) -> int:
    """Requests the engine model has completed, from Triton's statistics."""
    client = grpcclient.InferenceServerClient(url)
    try:
        statistics = client.get_inference_statistics("tensorrt_llm",
                                                     headers={"triton-grpc-protocol-admin-key": ADMIN_KEY})
    finally:
        client.close()
    return sum(model.inference_stats.success.count for model in statistics.model_stats)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_abandoned_bls_stream_frees_its_slot_with_no_stop_from_the_client(served, protocol):
    """The BLS sees the client's cancel and stops its own engine request (one stop per stream); a stop from the
    client would only be a wasted request to the engine, naming an id no engine request has."""
    server, _ = served
    before = engine_requests(server.grpc_url)

    def client_of():
        if protocol == "grpc":
            return GrpcClient(server.grpc_url, model="tensorrt_llm_bls")
        return HttpClient(server.http_url, model="tensorrt_llm_bls")

    for stream in hold_every_slot(server, client_of):
        stream.close()
    assert answer_within(server.grpc_url, ANSWER_S), "the abandoned BLS generations kept their slots"
    # The engine saw each stream's generation and the BLS's stop of it, and the two answer_within requests
    # (the first may still be finishing): a stop from each client would make it at least one more.
    assert engine_requests(server.grpc_url) - before <= 2 * BATCH + 2


def test_a_storm_of_cancelled_async_ensemble_streams_leaves_no_orphan(served):
    """Tasks cancelled as a gateway cancels a disconnected client's: running and queued requests alike."""
    server, _ = served

    async def storm():
        client = AsyncGrpcClient(server.grpc_url)
        started = asyncio.Event()

        async def read():
            async for _ in client.stream_bytes(GenerateRequest(text_input="The server", max_tokens=LONG_GENERATION)):
                started.set()

        tasks = [asyncio.create_task(read()) for _ in range(10 * BATCH)]
        await asyncio.wait_for(started.wait(), ANSWER_S)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()  # waits for the stop requests

    asyncio.run(storm())
    assert answer_within(server.grpc_url, ANSWER_S), "cancelled generations kept the engine busy"


@pytest.mark.parametrize("model", ["tensorrt_llm_bls", "ensemble"])
def test_a_client_that_leaves_the_openai_gateway_frees_its_engine_slot(served, model):
    import openai

    server, _ = served
    gateway = GatewayThread(server.grpc_url, port=free_port(), model=model).start()
    try:
        client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
        streams = []
        for _ in range(BATCH):
            stream = client.completions.create(model="tritonforge", prompt="The server", max_tokens=LONG_GENERATION,
                                               stream=True)
            next(iter(stream))
            streams.append(stream)
        assert answer_within(server.grpc_url, HELD_S) is None  # every slot is taken: a new request waits
        for stream in streams:
            stream.close()  # the HTTP connection goes away
        assert answer_within(server.grpc_url, ANSWER_S), "the gateway left the generations running"
    finally:
        gateway.stop()


def test_stop_request_ends_a_running_ensemble_stream(served):
    """Triton 2.51 does not pass a client's cancel to a running ensemble step: the `stop` input does it."""
    server, _ = served
    client = GrpcClient(server.grpc_url)
    chunks = []
    started = time.monotonic()
    for chunk in client.stream_bytes(GenerateRequest(text_input="The server", max_tokens=LONG_GENERATION),
                                     request_id="stop-me"):
        chunks.append(chunk)
        if len(chunks) == 3:
            _, errors = engine_stream(server.grpc_url, {
                "stop": np.array([[True]]), "input_lengths": np.array([[1]], dtype=np.int32),
                "request_output_len": np.array([[1]], dtype=np.int32)}, request_id="stop-me")
            assert not errors
    client.close()
    assert 3 <= len(chunks) < LONG_GENERATION and time.monotonic() - started < ANSWER_S


def test_an_anonymous_stop_stops_nobody(served):
    server, _ = served
    client = GrpcClient(server.grpc_url)
    request = GenerateRequest(text_input="The server", max_tokens=20)
    whole = client.generate(request)
    chunks = []
    for chunk in client.stream_bytes(request):
        chunks.append(chunk)
        if len(chunks) == 2:
            _, errors = engine_stream(server.grpc_url, {
                "stop": np.array([[True]]), "input_lengths": np.array([[1]], dtype=np.int32),
                "request_output_len": np.array([[1]], dtype=np.int32)})
            assert errors and "request id" in errors[0]
    client.close()
    # The stream went on to its end: its text is the whole answer (chunks coalesce under load, so they are
    # not counted).
    assert ascii_only(b"".join(chunks).decode("utf-8", errors="replace")) == ascii_only(whole)


def test_a_bls_stop_phrase_ends_the_generation_and_frees_its_engine_slot(served):
    """The BLS matches stop phrases on text: once one matches it must stop the engine, or the slot stays taken
    for the whole long generation."""
    server, repository = served
    bls = GrpcClient(server.grpc_url, "tensorrt_llm_bls")
    prompt = "The server"
    opening = bls.generate(prompt, max_tokens=8)
    phrase = opening.split()[1]  # a word the generation reaches within its first tokens
    prompt_ids = load_tokenizer(repository / "preprocessing" / "tokenizer")("The engine").input_ids
    holders = open_long_engine_streams(server.grpc_url, prompt_ids, BATCH - 1)  # the other slot stays taken
    try:
        started = time.monotonic()
        text = bls.generate(prompt, max_tokens=LONG_GENERATION, stop_words=[phrase])
        assert time.monotonic() - started < ANSWER_S, "the call waited for the engine to run to max_tokens"
        assert phrase not in text and opening.startswith(text)
        assert answer_within(server.grpc_url, ANSWER_S), "the stopped generation kept its engine slot"
    finally:
        bls.close()
        for client in holders:
            client.stop_stream(cancel_requests=True)
            client.close()
