"""The ensemble (preprocessing → transformers engine → postprocessing) on a real tritonserver."""

from __future__ import annotations

import concurrent.futures
import queue
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from transformers import AutoModelForCausalLM

from tritonforge.clients.client import (
    GenerateRequest,
    GenerationError,
    GrpcClient,
    HttpClient,
    stop_engine_request,
)
from tritonforge.facts.errors import ErrorKind, answered_kind
from tritonforge.runtime.text.detokenization import TokenBytes
from tritonforge.runtime.text.tokenization import load_tokenizer, phrase_token_variants
from tritonforge.serve.processes import all_stub_pids

from .conftest import (
    DONE_S,
    ENGINE_BATCH,
    MAX_INPUT_LEN,
    MAX_SEQ_LEN,
    ascii_only,
    batch_column,
    batched_texts,
    engine_stream,
    stream_concurrently,
)

PROMPTS = ["The server reads a request", "你好，世界。", "café 🚀 naïve", "A", "Stop phrases end the answer"]
MAX_TOKENS = 24
CONCURRENT_STREAMS = 16


@pytest.fixture(scope="module")
def reference(served):
    """Greedy continuation with transformers' own generate, as token ids and as exact bytes."""
    _, model_dir = served
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    table = TokenBytes(tokenizer)

    def generate(prompt: str, max_tokens: int = MAX_TOKENS):
        ids = tokenizer(prompt).input_ids
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id)[0, len(ids):].tolist()
        out = out[:-1] if out and out[-1] == tokenizer.eos_token_id else out
        return out, table.decode(out).decode("utf-8", errors="replace")

    return generate


@pytest.fixture(scope="module")
def grpc_client(served):
    client = GrpcClient(served[0].grpc_url)
    yield client
    client.close()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_equals_transformers_generate(grpc_client, reference, prompt):
    assert grpc_client.generate(prompt, max_tokens=MAX_TOKENS) == reference(prompt)[1]


def test_engine_tokens_equal_generate_token_for_token(served, reference, tiny_models):
    server, model_dir = served
    tokenizer = load_tokenizer(model_dir)
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        tokens, errors = engine_stream(server.grpc_url, {
            "input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
            "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
            "end_id": np.array([[tokenizer.eos_token_id]], dtype=np.int32),
            "streaming": np.array([[True]])})
        assert not errors and [t for chunk in tokens for t in chunk] == reference(prompt)[0]


def test_batched_request_answers_each_row_with_its_batch_index(served, reference):
    texts = batched_texts(served[0].grpc_url, "ensemble", [
        batch_column("text_input", [PROMPTS[0].encode(), PROMPTS[2].encode()], object, "BYTES"),
        batch_column("max_tokens", [MAX_TOKENS, MAX_TOKENS], np.int32, "INT32")])
    assert texts == {0: reference(PROMPTS[0])[1], 1: reference(PROMPTS[2])[1]}


@pytest.mark.parametrize("prompt", PROMPTS)
def test_streamed_text_equals_non_streamed_over_grpc_and_http(served, grpc_client, prompt):
    http = HttpClient(served[0].http_url)
    full = grpc_client.generate(prompt, max_tokens=MAX_TOKENS)
    # Chunks are decoded alone (valid UTF-8 each): only characters split across chunks may differ (U+FFFD).
    assert ascii_only("".join(grpc_client.stream(prompt, max_tokens=MAX_TOKENS))) == ascii_only(full)
    request = GenerateRequest(text_input=prompt, max_tokens=MAX_TOKENS)
    assert ascii_only(b"".join(grpc_client.stream_bytes(request)).decode("utf-8")) == ascii_only(full)
    assert http.generate(prompt, max_tokens=MAX_TOKENS) == full
    assert ascii_only("".join(http.stream(prompt, max_tokens=MAX_TOKENS))) == ascii_only(full)


def test_prompt_is_echoed_only_when_asked(grpc_client, reference):
    prompt = PROMPTS[0]
    assert grpc_client.generate(prompt, max_tokens=4, exclude_input_in_output=False) == \
        prompt + reference(prompt, 4)[1]


def test_concurrent_streams_each_get_their_own_text(served, reference):
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(CONCURRENT_STREAMS)]

    texts = stream_concurrently(served[0].grpc_url, "ensemble", prompts, MAX_TOKENS)
    assert [ascii_only(t) for t in texts] == [ascii_only(reference(p)[1]) for p in prompts]


def test_top_p_zero_means_unset_as_in_the_tensorrtllm_backend(grpc_client, reference):
    # NVIDIA's inflight_batcher_llm_client.py sends top_p = 0 by default; the backend treats <= 0 as not given.
    assert grpc_client.generate(PROMPTS[0], max_tokens=MAX_TOKENS, top_p=0.0) == reference(PROMPTS[0])[1]


def stop_phrase_among(tokenizer, ids: list[int]) -> str | None:
    """Text of generated tokens (one or two, past the first few, where they first occur) that tokenizes back to
    them: the engine matches stop phrases by token ids. The tiny tokenizer is trained anew each run, so which
    tokens qualify changes: search them all."""
    table = TokenBytes(tokenizer)
    for width in (1, 2):
        for start in range(3, len(ids) - width):
            phrase = table.decode(ids[start:start + width]).decode("utf-8", errors="replace")
            if ids.index(ids[start]) == start and ids[start:start + width] in phrase_token_variants(tokenizer, phrase):
                return phrase
    return None


def test_stop_word_ends_generation(grpc_client, reference, served):
    tokenizer = load_tokenizer(served[1])
    ids, full = reference(PROMPTS[0])
    stop_text = stop_phrase_among(tokenizer, ids)
    assert stop_text is not None, f"no generated token of {ids} tokenizes back to itself"
    text = grpc_client.generate(PROMPTS[0], max_tokens=MAX_TOKENS, stop_words=[stop_text])
    assert len(text) < len(full) and text.endswith(stop_text)


def test_end_id_ends_generation(grpc_client, reference):
    ids, full = reference(PROMPTS[0])
    end_id = ids[5]
    text = grpc_client.generate(PROMPTS[0], max_tokens=MAX_TOKENS, end_id=end_id)
    assert len(text.encode()) < len(full.encode())


BAD_REQUESTS = [
    ({"max_tokens": 4}, "text_input"),  # text_input missing
    ({"text_input": "", "max_tokens": 4}, "text_input"),
    ({"text_input": b"\xff\xfe bad", "max_tokens": 4}, "text_input"),
    ({"text_input": "word " * (MAX_INPUT_LEN + 10), "max_tokens": 4}, "text_input"),
    ({"text_input": "hi", "max_tokens": 0}, "max_tokens"),
    ({"text_input": "hi", "max_tokens": -5}, "max_tokens"),
    ({"text_input": "hi", "max_tokens": 100_000}, "max_tokens"),
    ({"text_input": "hi", "max_tokens": 4, "temperature": -1.0}, "temperature"),
    ({"text_input": "hi", "max_tokens": 4, "top_p": 1.5}, "top_p"),
    ({"text_input": "hi", "max_tokens": 4, "top_k": -1}, "top_k"),
    ({"text_input": "hi", "max_tokens": 4, "beam_width": 2}, "beam_width"),
    ({"text_input": "hi", "max_tokens": 4, "stop_words": [b"\xc3"]}, "stop_words"),
]


def _raw_grpc(url: str, inputs: dict[str, tuple[np.ndarray, str]]):
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    tensors = []
    for name, (array, dtype) in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    client.async_stream_infer("ensemble", tensors, enable_empty_final_response=True)
    result, error = responses.get(timeout=DONE_S)
    client.stop_stream()
    client.close()
    return result, error


@pytest.mark.parametrize("values, field", BAD_REQUESTS)
def test_bad_input_gets_an_error_naming_the_field_and_the_next_request_is_served(
        served, grpc_client, reference, values, field):
    inputs = {}
    for name, value in values.items():
        if isinstance(value, (str, bytes)) or (isinstance(value, list)):
            items = value if isinstance(value, list) else [value]
            inputs[name] = (np.array([[i.encode() if isinstance(i, str) else i for i in items]], dtype=object),
                            "BYTES")
        elif isinstance(value, float):
            inputs[name] = (np.array([[value]], dtype=np.float32), "FP32")
        else:
            inputs[name] = (np.array([[value]], dtype=np.int32), "INT32")
    _, error = _raw_grpc(served[0].grpc_url, inputs)
    assert error is not None and field in str(error), error
    assert answered_kind(str(error)) is ErrorKind.CLIENT, error  # the message is all the stream carries
    assert grpc_client.generate(PROMPTS[3], max_tokens=4) == reference(PROMPTS[3], 4)[1]


def test_wrong_dtype_is_rejected_naming_the_input(served, grpc_client, reference):
    _, error = _raw_grpc(served[0].grpc_url, {
        "text_input": (np.array([[b"hi"]], dtype=object), "BYTES"),
        "max_tokens": (np.array([[4.0]], dtype=np.float32), "FP32")})
    assert error is not None and "max_tokens" in str(error)
    assert answered_kind(str(error)) is ErrorKind.CLIENT, error  # Triton's own check, by its wording
    assert grpc_client.generate(PROMPTS[3], max_tokens=4) == reference(PROMPTS[3], 4)[1]


def test_batch_mixing_valid_and_invalid_rows_names_the_bad_row(served, grpc_client, reference):
    _, error = _raw_grpc(served[0].grpc_url, {
        "text_input": (np.array([[b"fine"], [b""]], dtype=object), "BYTES"),
        "max_tokens": (np.array([[4], [4]], dtype=np.int32), "INT32")})
    assert error is not None and "text_input[1]" in str(error)
    assert grpc_client.generate(PROMPTS[3], max_tokens=4) == reference(PROMPTS[3], 4)[1]


def test_http_bad_input_is_a_400_naming_the_field(served):
    with pytest.raises(GenerationError, match="top_p"):
        HttpClient(served[0].http_url).generate("hi", max_tokens=4, top_p=2.0)


def test_the_engine_publishes_the_tensorrtllm_backend_metric_families(served):
    """nv_trt_llm_request_metrics and nv_trt_llm_kv_cache_block_metrics on Triton's /metrics, moving with load."""
    import re
    import urllib.request

    server, _ = served
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"

    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return {f"{name}:{kind}": float(value) for name, kind, value in re.findall(
            r'(nv_trt_llm_\w+)\{[^}]*(?:request_type|kv_cache_block_type)="(\w+)"[^}]*\} ([\d.e+-]+)', text)}

    idle = scrape()
    assert idle["nv_trt_llm_request_metrics:max"] >= 1 and idle["nv_trt_llm_kv_cache_block_metrics:tokens_per"] == 32

    # What load moves. The stub sets the series one by one (a message to the server each), so a scrape can fall
    # between two of them: each needs to be seen moved once, not all in one scrape.
    moved_by_load = {"nv_trt_llm_request_metrics:scheduled": lambda value: value >= 1,
                     "nv_trt_llm_kv_cache_block_metrics:used": lambda value: value >= 1,
                     "nv_trt_llm_kv_cache_block_metrics:fraction": lambda value: value > 0}
    seen_moved: set[str] = set()

    def under_load(sample: dict[str, float]) -> bool:
        seen_moved.update(name for name, moved in moved_by_load.items() if moved(sample[name]))
        return seen_moved == set(moved_by_load)

    # The gauges move every stats_check_period_ms (100 ms): long non-streamed generations, more than the engine's
    # slots and started again as they end, keep it busy until the scrapes have shown each series move (three long
    # streams once ran to their end on a loaded machine with no scrape showing them); then the engine's `stop`
    # ends those still running (a generation of the whole length takes 20 s and more on a loaded machine).
    tokens = MAX_SEQ_LEN - MAX_INPUT_LEN

    def generate_long(request_id: str) -> bytes:
        client = GrpcClient(server.grpc_url)
        try:
            request = GenerateRequest(text_input="Tell me", max_tokens=tokens, parameters={"min_tokens": tokens})
            return b"".join(client.stream_bytes(request, stream=False, request_id=request_id))
        finally:
            client.close()

    request_ids = [f"metrics-{index}" for index in range(ENGINE_BATCH + 2)]
    with concurrent.futures.ThreadPoolExecutor(len(request_ids)) as pool:
        running: dict[str, concurrent.futures.Future] = {}
        deadline = time.monotonic() + DONE_S
        while not under_load(sample := scrape()):
            assert time.monotonic() < deadline, f"moved under load: {sorted(seen_moved)}; last scrape: {sample}"
            for request_id in [request_id for request_id, future in running.items() if future.done()]:
                running.pop(request_id).result()  # a generation that failed fails the test
            running.update({request_id: pool.submit(generate_long, request_id)
                            for request_id in request_ids if request_id not in running})
            time.sleep(0.02)  # the next scrape: the gauges change without a signal
        for request_id in running:
            stop_engine_request(server.grpc_url, request_id)
        for future in running.values():
            future.result()


def test_probe_says_a_serving_server_is_live(served):
    from tritonforge.cli import main

    server, _ = served
    assert main(["probe", "--url", server.grpc_url, "--timeout-s", "30"]) == 0


def test_the_tokenizer_stubs_never_load_torch_and_the_engine_stub_does(served):
    """Preprocessing only tokenizes: its stubs load transformers without torch (tokenization.tokenizer_only_process),
    where the transformers engine's stub runs the model on it; postprocessing and the BLS are the C++ backends the
    build compiled, no Python stub at all (their Python twins run beside them in test_native_postprocessing.py and
    test_native_bls.py)."""
    server, _ = served
    maps = {model: Path(f"/proc/{pid}/maps").read_text() for pid, model in all_stub_pids(server.pid).items()}
    assert set(maps) == {"preprocessing", "tensorrt_llm"}, maps.keys()
    assert sorted(model for model, text in maps.items() if "libtorch" in text) == ["tensorrt_llm"]
    assert "tokenizers" in maps["preprocessing"]
