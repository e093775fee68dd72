"""A real model, SmolLM2-135M-Instruct from the package registry (tools/real_model.py), served by a real
tritonserver: its greedy answers through the ensemble, the C++ BLS, the Python BLS, the engine directly and the
OpenAI gateway equal transformers' own greedy generation on the same chat, and a real sentence comes back; a
forced tool call takes the city the question names, a json_schema answer validates and says Paris, a stop phrase
ends the stream before it. One server per text backend for the module (the model's load takes the time)."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tritonforge.builder.build import BuildOptions, build
from tritonforge.clients.client import GenerateRequest, GrpcClient
from tritonforge.facts.contract import BLS_MODEL, ENGINE_MODEL, ENSEMBLE_MODEL
from tritonforge.tools.real_model import real_model

from .conftest import engine_stream, lean_serving, running

MAX_TOKENS = 24
CHATS = ["What is the capital of France? Answer in one sentence.",
         "Name three colors of the rainbow.",
         "Write one short sentence about the sea."]


@pytest.fixture(scope="module")
def checkpoint():
    return real_model("smollm2")


@pytest.fixture(scope="module")
def reference(checkpoint):
    """transformers' own greedy answer to each chat: (the prompt's ids, the new ids, their text)."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    answers = {}
    for question in CHATS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                            tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
        new = out[0][len(ids):].tolist()
        answers[question] = (ids, new, tokenizer.decode(new, skip_special_tokens=True))
    return answers


@pytest.fixture(scope="module", params=["cpp", "python"])
def served(request, checkpoint, tmp_path_factory):
    repository = build(BuildOptions(model=checkpoint, output=tmp_path_factory.mktemp(f"real-{request.param}") / "repo",
                                    max_input_len=256, max_seq_len=512, max_batch_size=4,
                                    text_backend=request.param, serving=lean_serving()), progress=lambda _: None)
    with running(repository) as server:
        yield server


def chat(question: str) -> GenerateRequest:
    return GenerateRequest(messages=[{"role": "user", "content": question}], max_tokens=MAX_TOKENS)


def test_a_real_question_gets_a_real_answer(served):
    client = GrpcClient(served.grpc_url)
    try:
        assert "Paris" in client.generate(chat(CHATS[0]))
    finally:
        client.close()


@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, BLS_MODEL])
@pytest.mark.parametrize("question", CHATS)
def test_greedy_answers_equal_transformers_generate_streamed_and_whole(served, reference, model, question):
    client = GrpcClient(served.grpc_url, model=model)
    try:
        assert client.generate(chat(question)) == reference[question][2]
        assert "".join(client.stream(chat(question))) == reference[question][2]
    finally:
        client.close()


def test_the_engine_directly_generates_transformers_tokens(served, reference, checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    for question in CHATS:
        ids, new, _ = reference[question]
        tokens, errors = engine_stream(served.grpc_url, {
            "input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
            "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
            "end_id": np.array([[tokenizer.eos_token_id]], dtype=np.int32), "streaming": np.array([[True]])})
        generated = [t for chunk in tokens for t in chunk]
        assert not errors and generated == new[:len(generated)] and len(generated) >= len(new) - 1, ENGINE_MODEL


@pytest.fixture(scope="module")
def openai_client(served):
    """The real `openai` client, through the gateway in front of the served model."""
    openai = pytest.importorskip("openai", reason="needs the openai client (the test extra)")
    from tritonforge.gateway.options import GatewayThread
    from tritonforge.serve.ports import free_port

    gateway = GatewayThread(served.grpc_url, port=free_port(), served_model_name="smollm2").start()
    yield openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="none", max_retries=0)
    gateway.stop()


def test_the_openai_gateway_answers_the_chat_transformers_does(openai_client, reference):
    for question in CHATS:
        answer = openai_client.chat.completions.create(model="smollm2", max_tokens=MAX_TOKENS, temperature=0,
                                                       messages=[{"role": "user", "content": question}])
        assert answer.choices[0].message.content == reference[question][2]


WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}}}


def test_a_forced_tool_call_takes_the_city_the_question_names(openai_client):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                               "parameters": WEATHER}}]
    answer = openai_client.chat.completions.create(
        model="smollm2", max_tokens=MAX_TOKENS, temperature=0, tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}])
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}


def test_a_json_schema_response_format_answers_json_that_validates(openai_client):
    schema = {"type": "object", "additionalProperties": False, "required": ["capital"],
              "properties": {"capital": {"type": "string", "maxLength": 20}}}
    answer = openai_client.chat.completions.create(
        model="smollm2", max_tokens=MAX_TOKENS, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}},
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}])
    value = json.loads(answer.choices[0].message.content)
    jsonschema.validate(value, schema)
    assert "Paris" in value["capital"]


def test_a_stop_phrase_ends_the_streamed_answer_before_it(served):
    client = GrpcClient(served.grpc_url, model=BLS_MODEL)
    try:
        request = chat(CHATS[0])
        request.parameters["stop_words"] = ["Paris"]
        streamed = "".join(client.stream(request))
        assert streamed.strip().startswith("The capital of France is") and "Paris" not in streamed
    finally:
        client.close()
