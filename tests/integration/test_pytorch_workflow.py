"""The PyTorch-workflow engine step (`--engine tensorrtllm-pytorch`) in a real tritonserver, on the LLM API's test
double (tests/llmapi_test_double: TensorRT-LLM cannot be installed here, so nothing below runs TensorRT-LLM).

What this shows: the model loads through Triton's Python backend, answers the engine contract (tokens, streaming,
`stop`) with what the LLM API gives it, and the ensemble, the BLS, the OpenAI gateway and the metrics work on top
of it unchanged. Where TensorRT-LLM is absent, the engine model fails to load with one line saying where it runs.
"""

import json
import shutil
import sys
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.clients.client import GenerateRequest, GrpcClient
from tritonforge.facts.contract import stop_request_inputs
from tritonforge.gateway.options import GatewayThread
from tritonforge.runtime.text.tokenization import load_tokenizer
from tritonforge.serve.ports import free_port

from .conftest import engine_stream, running

DOUBLE = Path(__file__).resolve().parents[1] / "llmapi_test_double"
STREAM_INTERVAL = 2
LONG_GENERATION = 900  # ~4 s at the double's step: never reached by a request a test stops
ANSWER_S = 15


def double_tokens(prompt, count, vocab_size):
    sys.path.insert(0, str(DOUBLE))
    try:
        from tensorrt_llm.llmapi import double_tokens as tokens
    finally:
        sys.path.remove(str(DOUBLE))
        for name in [name for name in sys.modules if name.split(".")[0] == "tensorrt_llm"]:
            del sys.modules[name]
    return tokens(prompt, count, vocab_size=vocab_size)


def build_repository(model, output):
    return build(BuildOptions(model=model, output=output, engine="tensorrtllm-pytorch", max_input_len=64,
                              max_seq_len=1024, max_batch_size=4, stream_interval=STREAM_INTERVAL,
                              target_triton=configs.TESTED_TRITON), progress=lambda _: None)


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory):
    repository = build_repository(tiny_models["bpe"], tmp_path_factory.mktemp("pytorch") / "repo")
    # The Python backend puts the model's version folder on the stub's sys.path: the double goes there, so
    # only this repository's engine imports it.
    shutil.copytree(DOUBLE / "tensorrt_llm", repository / "tensorrt_llm" / "1" / "tensorrt_llm")
    with running(repository) as server:
        yield server, repository


def vocab_size(repository):
    return json.loads((repository / "tensorrt_llm" / "1" / "checkpoint" / "config.json").read_text())["vocab_size"]


def engine_inputs(prompt, max_tokens, **extra):
    return {"input_ids": np.array([prompt], dtype=np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
            "request_output_len": np.array([[max_tokens]], dtype=np.int32), **extra}


PROMPT = [11, 12, 13, 14]


def test_the_engine_answers_with_the_llm_api_tokens(served):
    server, repository = served
    expected = double_tokens(PROMPT, 9, vocab_size(repository))
    chunks, errors = engine_stream(server.grpc_url, engine_inputs(PROMPT, 9, streaming=np.array([[True]])))
    assert errors == []
    # stream_interval tokens per response; the last response (flagged final) carries the remainder
    assert chunks == [expected[0:2], expected[2:4], expected[4:6], expected[6:8], expected[8:9]]
    whole, errors = engine_stream(server.grpc_url, engine_inputs(PROMPT, 9))
    assert errors == [] and whole == [expected]  # not streamed: one response, prompt excluded by default


def test_ensemble_and_bls_serve_text_from_it_streamed_or_not(served):
    server, repository = served
    tokenizer = load_tokenizer(repository / "preprocessing" / "tokenizer")
    prompt_ids = tokenizer("The server").input_ids
    expected_ids = double_tokens(prompt_ids, 12, vocab_size(repository))
    for model in ("ensemble", "tensorrt_llm_bls"):
        client = GrpcClient(server.grpc_url, model=model)
        text = client.generate("The server", max_tokens=12)
        assert "".join(client.stream("The server", max_tokens=12)) == text
        assert text == tokenizer.decode(expected_ids, skip_special_tokens=True)


def test_the_openai_gateway_serves_it_through_the_bls(served):
    server, _ = served
    gateway = GatewayThread(server.grpc_url, port=free_port(), served_model_name="tiny").start()
    try:
        client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
        completion = client.completions.create(model="tiny", prompt="The server", max_tokens=6, temperature=0)
    finally:
        gateway.stop()
    expected = GrpcClient(server.grpc_url, model="tensorrt_llm_bls").generate("The server", max_tokens=6)
    assert completion.choices[0].text == expected and completion.usage.completion_tokens == 6


def test_the_stop_input_ends_a_running_generation(served):
    """A `stop` with the request's id, sent once its stream is under way, ends it long before its end."""
    server, _ = served
    client = GrpcClient(server.grpc_url)
    chunks = []
    for chunk in client.stream_bytes(GenerateRequest(text_input="The server", max_tokens=LONG_GENERATION),
                                     request_id="long"):
        chunks.append(chunk)
        if len(chunks) == 2:
            _, errors = engine_stream(server.grpc_url, stop_request_inputs(), request_id="long")
            assert errors == []
    client.close()
    assert 2 <= len(chunks) < LONG_GENERATION / STREAM_INTERVAL


def test_the_backend_metrics_are_published(served):
    server, _ = served
    with urllib.request.urlopen(f"http://{server.address}:{server.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 4' in text


def test_without_tensorrt_llm_the_engine_fails_to_load_saying_where_it_runs(tiny_models, tmp_path):
    repository = build_repository(tiny_models["bpe"], tmp_path / "repo")
    with running(repository, require_all_models=False) as server:
        log = server.log_text()
    assert "failed to load 'tensorrt_llm'" in log
    assert "TensorRT-LLM is not installed here" in log and "26.07-trtllm-python-py3" in log
